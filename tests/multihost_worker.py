"""One process of the multi-host test (see test_multihost.py): 4 CPU devices, joins a
2-process runtime on loopback, generates its half of the batch, writes JSON."""

import json
import sys

import jax

pid, port, ckpt, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.config.update("jax_num_cpu_devices", 4)

from lookahead_jax.distributed import multihost  # noqa: E402

multihost.initialize(f"127.0.0.1:{port}", 2, pid, bind_address=f"127.0.0.1:{port}")

import lookahead_jax as lj  # noqa: E402
from tests.test_multihost import PROMPTS, RUNS  # noqa: E402

results = {}
for name, (sizes, la, temp) in RUNS.items():
    mesh = lj.make_mesh(**sizes)
    model = lj.load(ckpt, mesh=mesh)
    local = PROMPTS[2 * pid : 2 * pid + 2]  # process 0: rows 0-1, process 1: rows 2-3
    la_cfg = lj.LookaheadConfig(*la) if la else None
    out_ = lj.generate(model, local, max_new_tokens=16, lookahead=la_cfg, temperature=temp, seed=9)
    streamed = [[], []]
    if la_cfg is not None:  # streamed, once: a round per step, with per-row noise
        lj.generate(
            model,
            local,
            max_new_tokens=16,
            lookahead=la_cfg,
            temperature=temp,
            seed=9,
            stream=lambda new, rows=streamed: [r.extend(t) for r, t in zip(rows, new, strict=True)],
        )
    results[name] = {
        "tokens": out_.token_ids,
        "streamed": streamed if la_cfg is not None else None,
        "devices": len(jax.devices()),
        "local": len(jax.local_devices()),
        "stats": {
            k: out_.stats.as_dict()[k]
            for k in (
                "new_tokens",
                "process_new_tokens",
                "tokens_per_s",
                "prefill_s",
                "decode_s",
                "accepted_tokens",
            )  # fmt: skip
        },
    }
# the engine: both processes run the same rounds over all prompts, 2 slots over data=2
sizes, la, temp = RUNS["data2_model4_sampling"]
model = lj.load(ckpt, mesh=lj.make_mesh(**sizes))
engine = lj.Engine(
    model, batch=2, max_new_tokens=16, lookahead=lj.LookaheadConfig(*la), temperature=temp, seed=9
)
by_id = {r.id: r.token_ids for r in engine.run(PROMPTS)}
results["engine"] = {
    "tokens": [by_id[i] for i in range(len(PROMPTS))],
    "stats": engine.stats.as_dict(),
}
with open(out, "w") as f:
    json.dump(results, f)
