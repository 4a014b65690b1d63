"""The GPU measurements in one run: where a decoding step's time goes and what each
option buys, on the card at hand. Every part writes OUT.json and OUT.md again when it
ends, so a run cut short keeps what it measured; a part that fails is recorded with its
error and the next one runs; a part that would start past `--budget-s` is skipped.

    python scripts/gpu/step_report.py --out $OUT/step_report      # a GPU: <= 8 minutes
    python scripts/gpu/step_report.py --dry-run --out /tmp/sr      # any CPU: tiny shapes

Parts, in the order they run (the targets' measurements first):

    device      the card, jax, the copy bandwidth (the practical HBM roofline)
    engine      the plain decode loop (run_loop, as the engine runs it) at B = 1, 8, 32,
                64 for the llama2-7b and llama3-8b shapes (random weights drawn per
                tensor, bfloat16, cache 512) and llama2-7b at B = 8 with cache 2048: ms a
                step, tokens/s, the bytes a step must read (weights + live K/V) against
                the copy bandwidth and the card's nominal peak; a 16-token step at B = 1
    options     A/B of the llama2-7b plain step at B = 1, one change each from the
                platform's default: Q/K/V and gate/up fused (the GPU's) and apart;
                attention over the whole cache (the GPU's) and in
                64-position blocks (a while loop per layer, the CPU's); command buffers
                that take WHILE and CONDITIONAL; float weights through cuBLAS (Triton
                GEMMs off); int8 weights with Triton GEMMs on and off
    profile     per-kernel device time of a plain and a 16-token step (llama2-7b, B = 1),
                from a jax.profiler trace: by kernel and by class (matmul, attention, ...)
    cost_curve  one forward step of T = 1..64 tokens over the plain step (llama2-7b, B = 1)
    smollm2     the real SmolLM2-135M (`--smollm2 CKPT`) in each of `--smollm2-dtypes`: its
                plain and 16-token steps; lj.generate on 16 MT-bench prompts one at a
                time, `--systems` (plain, auto, tokens=16, tokens=64): tokens per second,
                prefill and decode seconds, rows equal to plain, auto's choice
    head        the LM head at B = 1 (`--main`): alone with one, two and eight rows and
                with bf16 logits; the plain step with head_rows 1 and 2
    triton      Triton GEMMs against cuBLAS for float weights (`--main`): a 16-token step
                at B = 1, plain steps at B = 8, 64, 32

The dry run (tests/test_bench_smoke.py) runs every part on a two-layer model on the CPU
in seconds, so that a typo never costs device time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

from cost_curve import SHAPES, cache_bytes_read, copy_bandwidth, measure, random_params  # noqa: E402
from prompts import MT_BENCH  # noqa: E402
from step_ratio import time_steps, weight_bytes  # noqa: E402

import lookahead_jax as lj  # noqa: E402
from lookahead_jax import decoding  # noqa: E402
from lookahead_jax.checkpoints.loading import Model  # noqa: E402
from lookahead_jax.decoding import programs, sampling  # noqa: E402
from lookahead_jax.decoding.decode_state import DecodeSpec  # noqa: E402
from lookahead_jax.decoding.loop import compiler_options  # noqa: E402
from lookahead_jax.models import fused  # noqa: E402
from lookahead_jax.models.bundle import float_dtype  # noqa: E402
from lookahead_jax.models.config import LlamaConfig  # noqa: E402
from lookahead_jax.models.llama import LlamaLM, attention_block_for, head_rows_for  # noqa: E402

PEAK_HBM = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s, SXM data sheets
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, rope_theta=10000.0)  # fmt: skip
COMMAND_BUFFERS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"


class Plan:
    """The shapes and sizes of a run: the device's, or the dry run's."""

    def __init__(self, dry: bool):
        self.dry = dry
        # llama2-7b last: bench_model keeps it for the parts after the engine's
        self.big = ["tiny"] if dry else ["llama3-8b", "llama2-7b"]
        self.main = self.big[-1]  # the shape of the options, profile and cost curve
        self.dtype = "float32" if dry else "bfloat16"
        self.context = 24 if dry else 512  # prompt tokens in the cache
        self.long_context = 48 if dry else 2048
        self.batches = [1] if dry else [1, 8, 32, 64]
        self.block = 8 if dry else 64  # the blocked attention's (dry: below its cache)
        self.long_batch = 2 if dry else 8
        self.steps = 4 if dry else 32  # decode steps timed per repeat
        self.repeats = 2 if dry else 5
        self.tokens = [1, 4] if dry else [1, 2, 4, 8, 16, 32, 64]
        self.prompts = 2 if dry else 16
        self.new_tokens = 8 if dry else 128
        self.smollm2: str | None = None  # its checkpoint (--smollm2)
        self.smollm2_dtypes = ["float32"]  # (--smollm2-dtypes)
        # the SmolLM2 part's systems (the dry run: the same code for each, two check it)
        everything = ["plain", "auto", "tokens=16", "tokens=64"]
        self.systems = ["plain", "tokens=16"] if dry else everything


def bench_model(name: str, dtype, weights: str = "float", fuse: bool | None = None) -> Model:
    """A named shape with random weights (drawn per tensor: cost_curve.random_params), its
    attention and fused layers as lj.load has them on this platform (or `fuse`), no EOS
    (every row runs its budget)."""
    platform = jax.devices()[0].platform
    return _bench_model(
        name, dtype, weights, fused.fuse_where_it_pays(platform, None) if fuse is None else fuse
    )


# the last set made, shared by parts (while the next is drawn, two are on the card)
@functools.lru_cache(maxsize=1)
def _bench_model(name: str, dtype, weights: str, fuse: bool) -> Model:
    shape = TINY if name == "tiny" else SHAPES[name]
    cfg = LlamaConfig(max_position_embeddings=8192, **shape)
    params = random_params(cfg, jnp.dtype(dtype), weights=weights)
    if fuse:
        params = fused.fuse_layers(params, free=True)
    platform = jax.devices()[0].platform
    lm = LlamaLM(cfg, weights, attention_block_for(platform), head_rows=head_rows_for(platform))
    return Model(lm=lm, params=params, eos_ids=())


_LOOPS: dict = {}  # (spec, params' structure, shapes, options) -> (start, run_loop)


def decode_loop(model, layout, batch: int, context: int, steps: int, options: dict):
    """(prefilled state, compiled run_loop, compile seconds: 0 when an earlier part
    compiled them): `batch` random prompts of `context` tokens, room for `steps` steps'
    tokens, the programs compiled with `options` (this platform's compiler_options,
    updated)."""
    config = None if layout == "plain" else lj.LookaheadConfig.for_tokens(int(layout))
    dtype = str(float_dtype(model.params))
    spec = DecodeSpec(lm=model.lm, eos_ids=(), lookahead=config, cache_dtype=dtype)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.lm.vocab_size, (batch, context)).astype(np.int32)
    cap = steps * spec.max_emit + 8
    args = (
        model.params,
        jnp.asarray(prompt),
        jnp.full((batch,), context, jnp.int32),
        jnp.full((batch,), cap, jnp.int32),
        jnp.zeros((batch, 2), jnp.uint32),
        sampling.RowSampling.of([sampling.SamplingConfig()] * batch),
    )
    key = (spec, jax.tree.structure(args), batch, context, cap, tuple(sorted(options.items())))
    t = time.perf_counter()
    if key not in _LOOPS:
        fns = decoding.jitted(spec, cap, None, args)
        opts = {**compiler_options(), **options}
        with programs.precision_scope(spec.cache_dtype):
            start = fns.start.lower(*args).compile(opts)
            state = jax.eval_shape(fns.start, *args)
            loop = fns.run_loop.lower(model.params, state, jnp.int32(0), False).compile(opts)
        _LOOPS[key] = (start, loop)
    compile_s = time.perf_counter() - t
    start, loop = _LOOPS[key]
    return start(*args), loop, compile_s


def step_ms(model, state, loop, steps: int, repeats: int) -> dict:
    """ms per step of `steps` steps from a copy of the prefilled state (step_ratio's
    time_steps): min and median of `repeats`, after one untimed run."""
    times = [time_steps(model, state, loop, steps) for _ in range(repeats + 1)][1:]
    return {"min": min(times), "median": float(np.median(times))}


def step_bytes(model, batch: int, context: int) -> int:
    """What a plain step must read: every weight once and each row's live K/V."""
    live = cache_bytes_read(model.lm.cfg, batch, context, float_dtype(model.params))
    return weight_bytes(model.params) + live


# ---------------------------------------------------------------------- parts


def part_device(plan: Plan, report: dict, out: dict) -> None:
    import jaxlib

    d = jax.devices()[0]
    peak = next((v for k, v in PEAK_HBM.items() if k in d.device_kind), None)
    out.update(platform=d.platform, kind=d.device_kind, jax=jax.__version__,
               jaxlib=jaxlib.__version__, peak_gbps=None if peak is None else peak / 1e9,
               copy_gbps=copy_bandwidth(8 << 20 if plan.dry else 2 << 30) / 1e9)  # fmt: skip


def _roofline(report: dict, model, batch: int, context: int, ms: float) -> dict:
    need = step_bytes(model, batch, context)
    gbps = need / ms / 1e6
    dev = report["parts"]["device"]
    return {
        "bytes_per_step": need,
        "gbps": gbps,
        "of_copy_bandwidth": gbps / dev["copy_gbps"],
        "of_peak": None if not dev.get("peak_gbps") else gbps / dev["peak_gbps"],
    }


def part_engine(plan: Plan, report: dict, out: dict) -> None:
    rows = out.setdefault("rows", [])
    for name in plan.big:
        model = bench_model(name, plan.dtype)
        runs = [("plain", b, plan.context) for b in plan.batches] + [("16", 1, plan.context)]
        if name == plan.main and not plan.dry:  # (the dry run: the same code as above)
            runs.append(("plain", plan.long_batch, plan.long_context))
        for layout, batch, context in runs:
            state, loop, compile_s = decode_loop(model, layout, batch, context, plan.steps, {})
            ms = step_ms(model, state, loop, plan.steps, plan.repeats)
            del state
            row = {"model": name, "layout": layout, "batch": batch, "context": context,
                   "step_ms": ms, "tokens_per_s": 1000 * batch / ms["median"],
                   "compile_s": compile_s}  # fmt: skip
            if layout == "plain":
                row["roofline"] = _roofline(report, model, batch, context, ms["min"])
            rows.append(row)
            print(
                f"engine {name} {layout} B={batch} ctx={context}: {ms['median']:.2f} ms", flush=True
            )
            write(report)
        del model


def part_options(plan: Plan, report: dict, out: dict) -> None:
    """One change at a time against the plain step of the first shape at B = 1."""
    name = plan.main
    out.update(model=name, batch=1, context=plan.context)
    variants = [
        ("default", "float", None, {}),
        ("Q/K/V and gate/up fused", "fused", None, {}),
        ("Q/K/V and gate/up apart", "apart", None, {}),
        ("attention over the whole cache", "float", 0, {}),
        ("attention in blocks (a loop per layer)", "float", plan.block, {}),
        ("command buffers with WHILE, CONDITIONAL", "float", None,
         {"xla_gpu_enable_command_buffer": COMMAND_BUFFERS}),
        ("float weights, cuBLAS", "float", None, {"xla_gpu_enable_triton_gemm": False}),
        ("int8 weights (Triton GEMMs: the default)", "int8", None, {}),
        ("int8 weights, cuBLAS", "int8", None, {"xla_gpu_enable_triton_gemm": False}),
    ]  # fmt: skip
    if plan.dry:  # compiler flags alone: checked on a small program (XLA:CPU ignores them)
        out["flags_checked"] = [
            check_flags(options) or label for label, *_, options in variants if options
        ]
        variants = [v for v in variants if not v[3]]
    rows, base, made = out.setdefault("rows", []), None, None
    for label, weights, block, options in variants:
        fuse = {"fused": True, "apart": False}.get(weights)  # else the platform's default
        weights = "float" if fuse is not None else weights
        if made != (weights, fuse):
            base = None  # let the last set go (bench_model keeps one)
            base, made = bench_model(name, plan.dtype, weights, fuse), (weights, fuse)
        fused_here = fused.has_fused(base.params)
        model = base
        if block is not None:
            model = Model(lm=dataclasses.replace(base.lm, attention_block=block),
                          params=base.params, eos_ids=())  # fmt: skip
        state, loop, compile_s = decode_loop(model, "plain", 1, plan.context, plan.steps, options)
        ms = step_ms(model, state, loop, plan.steps, plan.repeats)
        loops = loop.as_text().count(" while(")
        rows.append({"option": label, "weights": weights, "fused": fused_here, "step_ms": ms,
                     "compile_s": compile_s, "loops": loops})  # fmt: skip
        rows[-1]["ratio"] = ms["median"] / rows[0]["step_ms"]["median"]
        print(f"option {label}: {ms['median']:.2f} ms", flush=True)
        write(report)


def check_flags(options: dict) -> None:
    """Compile a small program with these XLA options (a misspelt one fails here)."""
    jax.jit(lambda x: x + 1).lower(jnp.float32(0)).compile({**compiler_options(), **options})


def part_profile(plan: Plan, report: dict, out: dict) -> None:
    model = bench_model(plan.main, plan.dtype)
    for layout in ("plain", "16"):
        state, loop, _ = decode_loop(model, layout, 1, plan.context, plan.steps, {})
        out[f"{layout}_step_ms"] = step_ms(model, state, loop, plan.steps, 2)
        s = jax.block_until_ready(jax.tree.map(jnp.copy, state))
        with tempfile.TemporaryDirectory(prefix="step-report-") as logdir:
            with jax.profiler.trace(logdir, create_perfetto_trace=True):
                jax.block_until_ready(loop(model.params, s, jnp.int32(plan.steps), False))
            found = sorted(Path(logdir).rglob("perfetto_trace.json.gz"))
            if not found:
                raise RuntimeError(f"the profiler wrote no perfetto trace under {logdir}")
            with gzip.open(found[0]) as f:
                out[layout] = summarize(device_events(json.load(f)), plan.steps)
        write(report)


def part_cost_curve(plan: Plan, report: dict, out: dict) -> None:
    model = bench_model(plan.main, plan.dtype)
    rows = measure(model.lm.cfg, model.params, plan.tokens, plan.context, plan.repeats, 1)
    plain = rows[0]["one_logit_s"]["median"]
    for r in rows:
        r["ratio_to_plain"] = r["all_logits_s"]["median"] / plain
    out.update(model=plan.main, rows=rows)


def part_head(plan: Plan, report: dict, out: dict) -> None:
    """The B = 1 plain step's LM head: the head alone four ways, then the whole step with
    one row (XLA: a float32 copy of the head and a gemv) against two (head_rows = 2)."""
    base = bench_model(plan.main, plan.dtype)
    head = base.params.lm_head if base.params.lm_head is not None else base.params.embed.T
    D = head.shape[0]
    h = jax.random.normal(jax.random.key(0), (1, 1, D), jnp.float32).astype(head.dtype)
    f32 = jnp.float32
    variants = {
        "one row, float32 out": lambda h, w: jnp.einsum(
            "brd,dv->brv", h, w, preferred_element_type=f32),
        "two rows (a zero row), float32 out": lambda h, w: jnp.einsum(
            "brd,dv->brv", jnp.pad(h, ((0, 0), (0, 1), (0, 0))), w,
            preferred_element_type=f32)[:, :1],
        "eight rows (zeros), float32 out": lambda h, w: jnp.einsum(
            "brd,dv->brv", jnp.pad(h, ((0, 0), (0, 7), (0, 0))), w,
            preferred_element_type=f32)[:, :1],
        "one row, bf16 out then float32 (HF's bf16)": lambda h, w: jnp.einsum(
            "brd,dv->brv", h, w, preferred_element_type=w.dtype).astype(f32),
    }  # fmt: skip
    out.update(model=plan.main, head_shape=list(head.shape), alone={}, step={})
    want = None
    for label, fn in variants.items():
        f = jax.jit(fn).lower(h, head).compile(compiler_options())
        got = jax.block_until_ready(f(h, head))
        times = []
        for _ in range(plan.repeats):
            t = time.perf_counter()
            for _ in range(20):
                got = f(h, head)
            jax.block_until_ready(got)
            times.append((time.perf_counter() - t) / 20 * 1000)
        want = got if want is None else want
        out["alone"][label] = {"ms": {"min": min(times), "median": float(np.median(times))},
                               "max_abs_diff": float(jnp.max(jnp.abs(got - want)))}  # fmt: skip
        print(f"head {label}: {np.median(times):.3f} ms", flush=True)
    for rows in (1, 2):
        model = Model(lm=dataclasses.replace(base.lm, head_rows=rows), params=base.params,
                      eos_ids=())  # fmt: skip
        state, loop, _ = decode_loop(model, "plain", 1, plan.context, plan.steps, {})
        out["step"][f"head_rows={rows}"] = step_ms(model, state, loop, plan.steps, plan.repeats)
        del state
        print(f"head step head_rows={rows}: {out['step'][f'head_rows={rows}']}", flush=True)
        write(report)


def part_triton(plan: Plan, report: dict, out: dict) -> None:
    """Triton GEMMs (the GPU default: compiler_options) for float weights against cuBLAS,
    side by side: a 16-token step at B = 1 and plain steps at B = 8, 64, 32 (B = 1 plain:
    the options part)."""
    model = bench_model(plan.main, plan.dtype)
    runs = [("16", 1)] + [("plain", b) for b in ([8, 64, 32] if not plan.dry else [2])]
    out.update(model=plan.main, rows=[])
    cublas = {} if plan.dry else {"xla_gpu_enable_triton_gemm": False}  # XLA:CPU has none
    for layout, batch in runs:
        row = {"layout": layout, "batch": batch}
        for label, opts in (("cublas", cublas), ("triton", {})):
            state, loop, _ = decode_loop(model, layout, batch, plan.context, plan.steps, opts)
            row[label] = step_ms(model, state, loop, plan.steps, plan.repeats)
            del state
        row["triton_over_cublas"] = row["triton"]["median"] / row["cublas"]["median"]
        out["rows"].append(row)
        print(f"triton {layout} B={batch}: {row['triton_over_cublas']:.2f}x", flush=True)
        write(report)


def part_smollm2(plan: Plan, report: dict, out: dict) -> None:
    if plan.smollm2 is None:
        out["skipped"] = "no --smollm2 checkpoint"
        return
    for dtype in plan.smollm2_dtypes:
        out[dtype] = {}
        _smollm2(plan, report, out[dtype], dtype)


def _smollm2(plan: Plan, report: dict, out: dict, dtype: str) -> None:
    model = lj.load(plan.smollm2, dtype=dtype)
    state, loop, _ = decode_loop(model, "plain", 1, 64, plan.steps, {})
    out["plain_step_ms"] = step_ms(model, state, loop, plan.steps, plan.repeats)
    state, loop, _ = decode_loop(model, "16", 1, 64, plan.steps, {})
    out["tokens16_step_ms"] = step_ms(model, state, loop, plan.steps, plan.repeats)
    del state
    prompts = mt_bench_prompts(model, plan.prompts)
    for16, for64 = (lj.LookaheadConfig.for_tokens(t) for t in (16, 64))
    systems = {"plain": None, "auto": "auto", "tokens=16": for16, "tokens=64": for64}
    systems = {k: systems[k] for k in plan.systems}
    out.update(prompts=len(prompts), systems={})
    want = None
    for label, la in systems.items():
        kw = dict(max_new_tokens=plan.new_tokens, lookahead=la)
        lj.generate(model, prompts[:1], **kw)  # compile
        got, prefill, decode, tokens, steps, auto = [], 0.0, 0.0, 0, 0, None
        for p in prompts:  # one at a time, as bench.py measures a user's request
            r = lj.generate(model, [p], **kw)
            got.append(r.token_ids[0])
            prefill += r.stats.prefill_s
            decode += r.stats.decode_s
            tokens += len(r.token_ids[0])
            steps += r.stats.row_steps
            auto = r.stats.as_dict()["config"].get("lookahead_auto", auto)
        want = got if want is None else want
        same = sum(a == b for a, b in zip(got, want, strict=True))
        out["systems"][label] = {"tokens_per_s": tokens / (prefill + decode), "tokens": tokens,
                                 "equal_to_plain": same, "prefill_s": prefill,
                                 "decode_s": decode, "steps": steps,
                                 "decode_ms_per_step": 1000 * decode / max(steps, 1),
                                 "auto": auto}  # fmt: skip
        out["systems"][label]["speedup"] = (
            tokens / (prefill + decode) / out["systems"]["plain"]["tokens_per_s"]
        )
        print(f"smollm2 {dtype} {label}: {out['systems'][label]}", flush=True)
        write(report)


def mt_bench_prompts(model, count: int) -> list[list[int]]:
    """`count` MT-bench first turns spread over its categories (the copy under
    benchmarks/prompts/, which travels with the checkout), with the chat template."""
    rows = [json.loads(line) for line in MT_BENCH.read_text().splitlines() if line.strip()]
    by_cat: dict[str, list] = defaultdict(list)
    for r in rows:
        by_cat[r.get("category", "")].append(r)
    picked = [cat[i] for i in range(len(rows)) for cat in by_cat.values() if i < len(cat)]
    return [model.tokenizer.encode_prompt(r["turns"][0], chat=True) for r in picked[:count]]


# ---------------------------------------------------------------------- the profile's trace

CLASSES = [  # first match wins, over the lower-cased kernel and HLO op names
    ("copy", ("memcpy", "memset", "copy")),
    ("matmul", ("gemm", "gemv", "cublas", "cutlass", "xmma", "dot", "matmul", "nvjet")),
    ("kv_update", ("dynamic_update_slice", "dynamic-update-slice", "scatter")),
    ("attention", ("softmax", "attention", "exp")),
    ("reduce", ("reduce", "argmax", "sort", "top_k")),
    ("while_loop", ("while", "condition")),
]


def device_events(trace) -> list[dict]:
    """The complete ('X') events on the device's streams ({'name', 'op', 'dur_us'}): on a
    GPU its kernels; with no device process (the CPU's dry run), the host's XLA ops."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    meta = [e for e in events if e.get("ph") == "M"]
    names = {
        e["pid"]: str(e.get("args", {}).get("name", ""))
        for e in meta
        if e.get("name") == "process_name"
    }
    pids = {p for p, n in names.items() if n.startswith("/device:")} or set(names)
    threads = {(e["pid"], e.get("tid")): str(e.get("args", {}).get("name", "")) for e in meta
               if e.get("name") == "thread_name" and e["pid"] in pids}  # fmt: skip
    streams = {k for k, n in threads.items() if "stream" in n.lower()}
    out = []
    for e in events:
        line = (e.get("pid"), e.get("tid"))
        if e.get("ph") != "X" or e.get("pid") not in pids or (streams and line not in streams):
            continue
        args = e.get("args", {}) or {}
        op = args.get("hlo_op") or args.get("long_name") or ""
        out.append({"name": e.get("name", ""), "op": str(op), "dur_us": float(e.get("dur", 0))})
    return out


def summarize(events: list[dict], steps: int, top: int = 25) -> dict:
    by_kernel: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_class: dict[str, float] = defaultdict(float)
    for e in events:
        k = by_kernel[e["name"][:120]]
        k[0] += e["dur_us"]
        k[1] += 1
        text = f"{e['name']} {e['op']}".lower()
        cls = next((c for c, keys in CLASSES if any(key in text for key in keys)), "other")
        by_class[cls] += e["dur_us"]
    kernels = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "device_us_per_step": sum(v[0] for v in by_kernel.values()) / steps,
        "launches_per_step": sum(v[1] for v in by_kernel.values()) / steps,
        "by_class_us_per_step": {c: t / steps for c, t in sorted(by_class.items())},
        "top_kernels": [
            {"name": n, "us_per_step": t / steps, "calls_per_step": c / steps}
            for n, (t, c) in kernels
        ],  # fmt: skip
    }


# ---------------------------------------------------------------------- the report


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines, then a blank one."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return [*lines, *("| " + " | ".join(map(str, r)) + " |" for r in rows), ""]


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f} %"


def markdown(report: dict) -> str:
    parts = report["parts"]
    lines = ["# GPU step report", "", f"Command: `{report['command']}`", ""]
    dev = parts.get("device", {})
    if "copy_gbps" in dev:
        lines += [
            f"Device: {dev['platform']} {dev['kind']}, jax {dev['jax']}, copy bandwidth "
            f"{dev['copy_gbps']:.0f} GB/s, nominal peak {dev['peak_gbps']} GB/s.",
            "",
        ]
    for name, part in parts.items():
        if "error" in part or "skipped" in part:
            lines += [f"## {name}", "", part.get("error") or part["skipped"], ""]
    if parts.get("engine", {}).get("rows"):
        lines += ["## The decode loop", ""]
        header = [
            "model",
            "layout",
            "B",
            "cache",
            "step ms (median)",
            "tokens/s",
            "GB/s it needs",
            "of copy bandwidth",
            "of peak",
            "compile s",
        ]
        rows = []
        for r in parts["engine"]["rows"]:
            roof = r.get("roofline", {})
            rows.append(
                [
                    r["model"],
                    r["layout"],
                    r["batch"],
                    r["context"],
                    f"{r['step_ms']['median']:.2f}",
                    f"{r['tokens_per_s']:.0f}",
                    f"{roof.get('gbps', 0):.0f}",
                    pct(roof.get("of_copy_bandwidth")),
                    pct(roof.get("of_peak")),
                    f"{r['compile_s']:.1f}",
                ]
            )
        lines += table(header, rows)
    if parts.get("options", {}).get("rows"):
        lines += ["## One option at a time (plain step, B = 1)", ""]
        header = ["option", "step ms (median)", "/ default", "while loops in the program"]
        lines += table(
            header,
            [
                [r["option"], f"{r['step_ms']['median']:.2f}", f"{r['ratio']:.2f}", r["loops"]]
                for r in parts["options"]["rows"]
            ],
        )
    for layout, prof in parts.get("profile", {}).items():
        if not isinstance(prof, dict) or "top_kernels" not in prof:
            continue
        lines += [
            f"## Profile: the {layout} step ({prof['device_us_per_step']:.0f} us of "
            f"device time, {prof['launches_per_step']:.0f} kernels a step)",
            "",
        ]
        lines += table(
            ["class", "us a step"],
            [[c, f"{t:.1f}"] for c, t in prof["by_class_us_per_step"].items()],
        )
        lines += table(
            ["kernel", "us a step", "calls a step"],
            [
                [f"`{k['name'][:80]}`", f"{k['us_per_step']:.1f}", f"{k['calls_per_step']:.1f}"]
                for k in prof["top_kernels"][:12]
            ],
        )
    if parts.get("cost_curve", {}).get("rows"):
        rows = parts["cost_curve"]["rows"]
        lines += ["## A forward step of T tokens over the plain step", ""]
        lines += table(
            ["T", *(r["tokens"] for r in rows)],
            [["/ plain", *(f"{r['ratio_to_plain']:.2f}" for r in rows)]],
        )
    for dtype, s in parts.get("smollm2", {}).items():
        if not isinstance(s, dict) or not s.get("systems"):
            continue
        lines += [
            f"## SmolLM2-135M {dtype}: plain step {s['plain_step_ms']['median']:.2f} ms, "
            f"16-token step {s['tokens16_step_ms']['median']:.2f} ms; {s['prompts']} MT-bench "
            "prompts one at a time",
            "",
        ]
        lines += table(
            ["system", "tokens/s", "speedup", "prefill s", "decode s", "ms a step",
             "rows equal to plain", "auto chose"],
            [
                [k, f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x", f"{r['prefill_s']:.2f}",
                 f"{r['decode_s']:.2f}", f"{r['decode_ms_per_step']:.2f}",
                 f"{r['equal_to_plain']}/{s['prompts']}",
                 "" if not r.get("auto") else str(r["auto"].get("chosen", r["auto"]))[:60]]
                for k, r in s["systems"].items()
            ],
        )  # fmt: skip
    h = parts.get("head", {})
    if h.get("alone"):
        lines += [f"## The LM head at B = 1 ({h['model']}, head {h['head_shape']})", ""]
        lines += table(
            ["variant", "ms (median)", "max |logit - one row's|"],
            [[k, f"{r['ms']['median']:.3f}", f"{r['max_abs_diff']:.3g}"]
             for k, r in h["alone"].items()],
        )  # fmt: skip
        lines += table(
            ["plain step, B = 1", "ms (median)"],
            [[k, f"{r['median']:.2f}"] for k, r in h.get("step", {}).items()],
        )
    if parts.get("triton", {}).get("rows"):
        lines += [f"## Triton GEMMs for float weights ({parts['triton']['model']})", ""]
        lines += table(
            ["layout", "B", "cuBLAS ms", "Triton ms", "Triton / cuBLAS"],
            [[r["layout"], r["batch"], f"{r['cublas']['median']:.2f}",
              f"{r['triton']['median']:.2f}", f"{r['triton_over_cublas']:.2f}"]
             for r in parts["triton"]["rows"]],
        )  # fmt: skip
    return "\n".join(lines)


PARTS = {
    "device": part_device,
    "engine": part_engine,
    "options": part_options,
    "profile": part_profile,
    "cost_curve": part_cost_curve,
    "smollm2": part_smollm2,
    "head": part_head,
    "triton": part_triton,
}
OUT: Path | None = None


def write(report: dict) -> None:
    OUT.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    try:
        md = markdown(report)
    except Exception:  # the JSON has the figures; the next part runs all the same
        failed = traceback.format_exc()
        md = f"# GPU step report\n\nThe tables failed:\n\n```\n{failed}```\n"
    OUT.with_suffix(".md").write_text(md)


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path stem: OUT.json and OUT.md")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, for the CPU")
    ap.add_argument("--smollm2", default=None, help="the SmolLM2-135M checkpoint (or skip)")
    ap.add_argument("--budget-s", type=float, default=450, help="no part starts after this")
    ap.add_argument(
        "--parts", default="device,engine,options,profile,cost_curve,smollm2,head,triton"
    )
    ap.add_argument(
        "--main",
        default=None,
        help="the options', profile's and cost curve's "
        "shape (cost_curve.SHAPES; default llama2-7b)",
    )
    ap.add_argument("--dtype", default=None, help="the random weights' dtype (bfloat16)")
    ap.add_argument("--smollm2-dtypes", default="float32", help="SmolLM2's dtypes, in order")
    ap.add_argument("--systems", default=None, help="SmolLM2's systems (plain first)")
    args = ap.parse_args()
    OUT = Path(args.out)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    plan, t0 = Plan(args.dry_run), time.perf_counter()
    report = {"command": " ".join(["python", *sys.argv]), "dry_run": args.dry_run, "parts": {}}
    plan.smollm2 = args.smollm2
    plan.main = args.main or plan.main
    plan.dtype = args.dtype or plan.dtype
    plan.smollm2_dtypes = args.smollm2_dtypes.split(",")
    plan.systems = args.systems.split(",") if args.systems else plan.systems
    for name in args.parts.split(","):
        out = report["parts"][name] = {}
        elapsed = time.perf_counter() - t0
        if elapsed > args.budget_s:
            out["skipped"] = f"out of time ({elapsed:.0f} s of {args.budget_s:.0f})"
            continue
        try:
            PARTS[name](plan, report, out)
        except Exception as e:  # recorded; the next part runs
            traceback.print_exc()
            out["error"] = f"{type(e).__name__}: {e}"[:2000]
        out["seconds"] = time.perf_counter() - t0 - elapsed
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        write(report)
    failed = [n for n, p in report["parts"].items() if "error" in p]
    sys.exit(1 if failed and args.dry_run else 0)


if __name__ == "__main__":
    main()
