"""Wall time of whole lj.generate calls, host work included: SmolLM2-135M, 2 MT-bench and
2 code prompts as one batch, 64 new tokens, plain and tokens=16; min and median of 3 warm
calls. Run it from two trees in turn, interleaved, to compare their host paths:

    for i in 1 2; do
        PYTHONPATH=/tmp/base python scripts/bench/generate_wall.py   # the old tree
        python scripts/bench/generate_wall.py                        # this one
    done
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import select  # noqa: E402

import lookahead_jax as lj  # noqa: E402

print(lj.__file__)
model = lj.load("smollm2-135m")
prompts = [r["prompt"] for r in select(["mt_bench", "code"], limit=2)]
for la in (None, lj.LookaheadConfig.for_budget(16)):
    kw = dict(lookahead=la, max_new_tokens=64)
    lj.generate(model, prompts, **kw)
    ws = []
    for _ in range(3):
        t = time.perf_counter()
        out = lj.generate(model, prompts, **kw)
        ws.append(time.perf_counter() - t)
    s = out.stats
    print(
        f"{la and la.name} wall min {min(ws):.3f} med {sorted(ws)[1]:.3f} prefill "
        f"{s['prefill_s']:.3f} decode {s['decode_s']:.3f} tps {s['tokens_per_s']:.1f}"
    )
