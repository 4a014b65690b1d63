"""In process, what a server's engine does with bursts of 16 chats behind a shared system
prompt: `lj.Engine` built as `lookahead-jax serve --batch 16` builds it, warmed up, then
three bursts (the two warm-up system prompts of prefix_cache.py, then its measured one),
all 16 submitted before a round: each burst's median time to first token, compile and
prefill seconds, and the prefill shapes it ran.

    python scripts/bench/prefix_burst.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def burst(engine, n: int, system: str, questions: list[str]) -> str:
    import lookahead_jax as lj

    stats = engine.online_stats
    shapes, compile_s, prefill_s = dict(stats.prefill_shapes), stats.compile_s, stats.prefill_s
    first: dict[int, float] = {}
    t = time.perf_counter()
    for i, q in enumerate(questions):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        request = lj.Request(messages, id=f"{n}-{i}", max_new_tokens=32, temperature=0.0)
        engine.submit(request, lambda u, i=i, t=t: first.setdefault(i, time.perf_counter() - t))
    while engine.round():
        pass
    ttft = sorted(first.values())
    ran = {k: v - shapes.get(k, 0) for k, v in stats.prefill_shapes.items() if v > shapes.get(k, 0)}
    return (
        f"burst {n}: median TTFT {ttft[len(ttft) // 2]:.2f} s, compiling "
        f"{stats.compile_s - compile_s:.1f} s, prefills {stats.prefill_s - prefill_s:.1f} s: {ran}"
    )


def main() -> None:
    import json

    from prefix_cache import SYSTEM, SYSTEM_WARM
    from prompts import MT_BENCH

    import lookahead_jax as lj
    from lookahead_jax.engine.config import EngineConfig

    lines = MT_BENCH.read_text().splitlines()
    firsts = [json.loads(line)["turns"][0] for line in lines if line.strip()]
    config = EngineConfig(batch=16, max_new_tokens=32, max_prompt_tokens=1024, sampled=True,
                          prefix_cache_mb=256, max_logprobs=20, temperature=1.0)  # fmt: skip
    engine = lj.Engine(lj.load("smollm2-135m"), config)
    engine.warm_up(lj.Request([1], max_new_tokens=1, logprobs=0))
    bursts = [
        (SYSTEM_WARM[0], firsts[16:32]),
        (SYSTEM_WARM[1], firsts[32:48]),
        (SYSTEM, firsts[:16]),
    ]
    for n, (system, questions) in enumerate(bursts):
        print(burst(engine, n, system, questions), flush=True)


if __name__ == "__main__":
    main()
