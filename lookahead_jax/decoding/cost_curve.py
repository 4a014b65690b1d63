"""The cost curve `auto` chooses by: the latency of one forward step of T tokens per row
(with logits for all of them) at the candidate step sizes, on this device, for this
model, dtype and batch size; over the one-token step's, a layout's cost ratio r. On
accelerators the curve is of whole decode steps instead (step_curve.py: there the step's
drafting and verification kernels cost more than a small model's forward).

Measured once and cached per device kind (on a CPU: its model and core count), device
count, model, dtype and weight format in the cache directory (on a CPU device, with how
busy other processes kept the cores meanwhile: OtherCpuUse, `cached_curve`). A deep model
is timed on its first layers run over in a loop (`probe_model`), which compiles in a
fraction of the time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.cache_dir import cache_root, write_atomic
from lookahead_jax.models import cpu_kernel, fused, packed
from lookahead_jax.models.bundle import float_dtype

COMPILE_THREADS = 2  # probe sizes compiled at once (measure_cost_curve)
# in the cached curves' names: raised when what a step costs changed enough that curves
# measured before would mislead auto (2: RoPE's angles computed once and a faster argmax on
# the CPU, 0.88x a 16-token step; whole decode steps timed on accelerators, step_curve.py)
CURVE_VERSION = 2
PROBE_LAYERS = 6  # a deep model's probes loop over this many layers or a few more (probe_model)


def tune_dir() -> Path:
    """Where auto's measurements and records are kept (the cache directory's autotune/)."""
    path = cache_root() / "autotune"
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_fingerprint(model) -> str:
    """A short stable name for a model's architecture: its config's fingerprint, or for
    another seam implementation a hash of its type, vocabulary and parameter shapes."""
    cfg = getattr(model.lm, "cfg", None)
    if cfg is not None and hasattr(cfg, "fingerprint"):
        return cfg.fingerprint()
    shapes = [(tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(model.params)]
    blob = repr((type(model.lm).__name__, model.lm.vocab_size, shapes)).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def device_key(model, devices: int | None = None) -> str:
    d = jax.devices()[0]
    kind = f"{d.platform}-{d.device_kind}".replace(" ", "_").replace("/", "_")
    weights = getattr(model.lm, "weights", "float")  # int8 steps cost differently
    suffix = "" if weights == "float" else f"-{weights}"
    if packed.is_packed(model.params):  # the CPU kernel's steps cost differently too, and
        suffix += f"-packed-{cpu_kernel.build_key()}"  # each build of it: measured again
    if fused.has_fused(model.params):  # and fused matmuls (models/fused.py)
        suffix += "-fused"
    dtype = jnp.dtype(model.dtype).name
    count = jax.device_count() if devices is None else devices
    if d.platform == "cpu":  # the machine: a curve of one CPU model misleads on another
        kind += f"-{_cpu_name()}"
    return f"{kind}-x{count}-{model_fingerprint(model)}-{dtype}{suffix}"


@functools.cache
def _cpu_name() -> str:
    """This machine's CPU model and core count, hashed short ("unknown" where
    /proc/cpuinfo cannot be read): VMs under one name differ (Intel Xeon, AMD EPYC Zen 3
    or Zen 4), and a cache directory may be shared between them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "")
    except OSError:
        model = ""
    blob = f"{model}|{os.cpu_count()}".encode()
    return hashlib.sha256(blob).hexdigest()[:8] if model else "unknown"


def lowered_step(
    lm,
    params,
    tokens: int,
    context: int,
    all_logits: bool = True,
    batch: int = 1,
    compiler_options: dict | None = None,
):
    """(compile, args) of one forward step of `tokens` new tokens per row over a
    `context`-token cache for `batch` rows, with logits for every new token (or for one):
    traced and lowered here (JAX's settings, such as x64, are this thread's), `compile()`
    giving its executable (XLA's part, which another thread may run)."""
    from lookahead_jax.decoding import programs

    dtype = float_dtype(params)
    # The inputs are made with numpy: an eager jax op compiles a program for each new
    # shape, and each probe has its own (SmolLM2-135M: 14 s of tracing 16 probes, 3 s now).
    rng = np.random.default_rng(2)
    empty = jax.eval_shape(functools.partial(lm.init_cache, batch, context + tokens, dtype))

    def normal(like):  # random K/V, not zeros: matmul units can run faster on zeros
        return jnp.asarray(rng.standard_normal(like.shape, np.float32).astype(like.dtype))

    cache = dataclasses.replace(
        empty,
        k=tuple(map(normal, empty.k)),
        v=tuple(map(normal, empty.v)),
        lengths=jnp.asarray(np.full((batch,), context, np.int32)),
    )
    rows = tokens if all_logits else 1
    positions = context + np.arange(tokens, dtype=np.int32)
    args = (
        params,
        jnp.asarray(rng.integers(0, lm.vocab_size, (batch, tokens), np.int32)),
        jnp.asarray(np.broadcast_to(positions, (batch, tokens))),
        # seam.causal_mask's, built by numpy (an eager jnp op compiles a program a shape)
        jnp.asarray(np.tril(np.ones((tokens, tokens), bool))[None]),
        cache,
        jnp.asarray(np.broadcast_to(np.arange(rows, dtype=np.int32), (batch, rows))),
    )
    with programs.precision_scope(dtype):  # as the decode programs are traced
        options = programs.compiler_options() if compiler_options is None else compiler_options
        lowered = jax.jit(lm.apply).lower(*args)
    return functools.partial(lowered.compile, options), args


def run_time(exe, args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(exe(*args))
    return time.perf_counter() - t0


def step_latencies(
    lm, params, tokens: int, context: int, repeats: int, all_logits: bool = True, batch: int = 1
) -> list[float]:
    """Seconds of `repeats` forward steps (see lowered_step), after a warm-up run."""
    compile_, args = lowered_step(lm, params, tokens, context, all_logits, batch)
    exe = compile_()
    jax.block_until_ready(exe(*args))  # warm up
    return [run_time(exe, args) for _ in range(repeats)]


def probe_model(model, layers_per_pass: int | None = None):
    """(lm, params) the cost curve times: for a deep model that can be cut
    (`lm.first_layers`, LlamaLM), its first k layers run L / k times over in a loop (so
    compiled once), else the model itself. k is the smallest divisor of L from
    PROBE_LAYERS up whose layers' weights are twice the largest cache (cache_bytes) or
    more, so that each pass streams them from memory as the model's step does; where
    none is, or `layers_per_pass` = L, the model.

    The same work as the model's step at a fraction of its compile time (SmolLM2-135M
    float32, 30 layers: 6 x 5 passes; a probe size compiled in 1.4-2.4 s against 4-5.5 s,
    compile time growing with the layers, 0.2 s plus 0.19 s each). Not quite the same
    cost: side by side with full-depth probes (benchmarks/cpu/probe_layers.md) its
    ratios came out ~10 % lower at 4-12 tokens and 12-16 % higher at 32-64, in every
    round. A model with sliding windows is probed with its first k layers' windows;
    the k layers' K/V are read L / k times (at a large batch they may stay in cache
    where the model's would not: the cut is sized on the weights).
    """
    lm = model.lm
    layers = getattr(getattr(lm, "cfg", None), "num_layers", 0)
    if not hasattr(lm, "first_layers") or layers <= PROBE_LAYERS:
        return lm, model.params
    if layers_per_pass is None:
        per_layer = sum(
            x.nbytes for x in jax.tree.leaves(lm.first_layers(model.params, 1)[1].layers)
        )
        big = [k for k in range(PROBE_LAYERS, layers) if layers % k == 0]
        layers_per_pass = next((k for k in big if k * per_layer >= 2 * cache_bytes()), layers)
    if layers_per_pass == layers:
        return lm, model.params
    cut, params = lm.first_layers(model.params, layers_per_pass)
    return dataclasses.replace(cut, layer_passes=layers // layers_per_pass), params


def cache_bytes() -> int:
    """The device's largest cache: a CPU's last level (Linux sysfs; 256 MiB where it
    cannot be read, more than most), an accelerator's 256 MiB (an H100's L2 is 50 MB)."""
    if jax.devices()[0].platform != "cpu":
        return 256 << 20
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()  # e.g. "32768K"
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return max(sizes, default=256 << 20)


def _extrapolated(rough: dict, tokens: int) -> float:
    """A size's step over the smallest size's, extrapolated along the line through the
    two largest sizes timed (0 before two are). Where a step's cost is convex in T (past
    the sizes that are free, more FLOPs per weight read) this is a lower bound, good for
    skipping a size sure to cost too much. XLA's speed is not smooth in T everywhere and
    the rough timings are two runs, so a size can be skipped that would not have cost
    that much: its configs then count as unaffordable (cost_ratio: inf)."""
    if len(rough) < 2:
        return 0.0
    a, b = sorted(rough)[-2:]
    slope = (rough[b] - rough[a]) / (b - a)
    return (rough[b] + (tokens - b) * slope) / rough[min(rough)]


def measure_cost_curve(
    model,
    tokens: tuple[int, ...],
    context: int = 256,
    repeats: int = 6,
    stop_above: float = float("inf"),
    batch: int = 1,
    probe=None,
) -> dict:
    """{T: seconds} (the fastest of 2 + `repeats` timings) for one forward step of T
    tokens per row over `batch` rows, timed on `probe` ((lm, params); default:
    `probe_model`'s).

    Sizes are compiled in increasing order, COMPILE_THREADS at once (a compilation is
    mostly one thread: two probes took 10.2 s one after the other, 6.9 s together on the
    2-core CPU; the next group is traced meanwhile), each group timed roughly (twice)
    once compiled, and probing stops once a step costs more than `stop_above` one-token
    steps (no config that large can pay off, and each size costs a compilation) or is
    sure to (`_extrapolated`). The sizes are then timed round-robin, so that a busy moment
    of the machine slows them all rather than skewing the curve.
    """
    lm, params = probe or probe_model(model)
    exes, rough, lowered = {}, {}, {}  # T -> (executable, args) / seconds / (compile, args)

    def next_group(sizes):
        return [t for t in sizes[:COMPILE_THREADS] if _extrapolated(rough, t) <= stop_above]

    def lower(sizes):  # traced in this thread: JAX's settings (x64) are per thread
        for t in sizes:
            if t not in lowered:
                lowered[t] = lowered_step(lm, params, t, context, batch=batch)

    sizes = sorted(set(tokens))
    group = next_group(sizes)
    with ThreadPoolExecutor(COMPILE_THREADS) as pool:
        while group:
            lower(group)
            sizes = sizes[len(group) :]
            steps = [lowered.pop(t) for t in group]
            compiling = [pool.submit(compile_) for compile_, _ in steps]
            lower(next_group(sizes))  # likely next, traced while these compile
            for t, job, (_, args) in zip(group, compiling, steps, strict=True):
                exes[t] = (job.result(), args)
            for t in group:  # timed once all compiled
                jax.block_until_ready(exes[t][0](*exes[t][1]))  # warm up
                rough[t] = min(run_time(*exes[t]) for _ in range(2))
            if any(t > 1 and rough[t] / rough[min(rough)] > stop_above for t in group):
                break
            group = next_group(sizes)
    curve = {t: rough[t] for t in exes}
    for _ in range(repeats):
        for t, (exe, args) in exes.items():
            curve[t] = min(curve[t], run_time(exe, args))
    return curve


class OtherCpuUse:
    """Cores' worth of CPU time that *other* processes used during the block (Linux:
    /proc/stat's busy time minus this process's CPU time, over the wall time); `cores` is
    None where that cannot be read.

    On a CPU device the cost curve is only meaningful on an otherwise idle machine:
    another process on the same cores slows a multi-threaded T-token step far more than a
    1-token one (on 2 cores beside a test worker, T=10 measured 2.1x a 1-token step
    against 1.2-1.36x idle), which would make auto pick plain decoding for good.
    """

    cores: float | None = None

    @staticmethod
    def _busy_seconds() -> float | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            ticks = [int(x) for x in fields]
        except (OSError, ValueError, IndexError):
            return None
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        guest = sum(ticks[8:10])  # already counted in user/nice
        return (sum(ticks) - idle - guest) / os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self._busy, self._own, self._wall = (
            self._busy_seconds(),
            _own_cpu_seconds(),
            time.perf_counter(),
        )
        return self

    def __exit__(self, *exc):
        busy, wall = self._busy_seconds(), time.perf_counter() - self._wall
        if busy is not None and self._busy is not None and wall > 0:
            own = _own_cpu_seconds() - self._own
            self.cores = max(0.0, (busy - self._busy - own) / wall)
        return False


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# A CPU cost curve measured while other processes used more than this many cores is
# "busy": cached with that figure, used by later runs, and measured again only by a run
# that finds the machine quiet (QUIET_CHECK_S of /proc/stat) or is asked to (RETUNE_ENV).
BUSY_CORES = 0.25
QUIET_CHECK_S = 0.3
RETUNE_ENV = "LOOKAHEAD_JAX_RETUNE"  # =1: measure every curve this process uses again
_MEASURED: set[Path] = set()  # curves this process measured (RETUNE_ENV: once each)
_LOOKED: set[Path] = set()  # busy curves whose machine this process found busy still


def cached_curve(
    model, tokens: tuple[int, ...], stop_above: float = float("inf"), batch: int = 1
) -> dict:
    """The cached cost curve for this device/model/dtype and batch size, measuring it on
    first use (a step of B rows can be compute-bound where one row is not, so each batch
    size the engine runs at has its own curve). Made non-decreasing in T (`monotone`).

    On a CPU device another process on the cores slows a T-token step more than a
    one-token one (OtherCpuUse): a curve measured so is kept with its `other_cores`, and
    measured again when a later run finds the machine quiet; until then every run uses
    it (one measurement's compiles, ~9 s on 2 cores, not one a run, and the same choice
    run to run). LOOKAHEAD_JAX_RETUNE=1 measures again regardless; a new machine (another
    CPU model or core count: `device_key`) has curves of its own."""
    path = cost_curve_path(model, batch)
    record = _read_curve(path)
    retune = os.environ.get(RETUNE_ENV) == "1" and path not in _MEASURED
    if record is not None and not retune:
        busy = record.get("other_cores") is not None and record["other_cores"] > BUSY_CORES
        if not busy or path in _MEASURED or path in _LOOKED or not _quiet_now():
            _LOOKED.add(path)  # (the machine looked at once a process: a busy one stays)
            return monotone(record["curve"])
    probe = probe_model(model)
    with OtherCpuUse() as others:
        kw = dict(stop_above=stop_above, batch=batch)
        if not whole_steps():
            curve = measure_cost_curve(model, tokens, probe=probe, **kw)
        else:
            from lookahead_jax.decoding.step_curve import measure_step_curve

            curve = measure_step_curve(probe, tokens, **kw)
    _MEASURED.add(path)
    busy = others.cores is not None and others.cores > BUSY_CORES
    if busy and record is not None and not retune and others.cores >= record["other_cores"]:
        return monotone(record["curve"])  # (busy again, no less: the first one stays)
    lm = probe[0]
    layers = f"{lm.cfg.num_layers} x {lm.layer_passes}" if lm is not model.lm else "all"
    save_cost_curve(model, curve, batch, other_cores=others.cores, probe_layers=layers)
    return monotone(curve)


def _read_curve(path: Path) -> dict | None:
    """A cached curve's record ({"curve": {T: seconds}, "other_cores": ..., ...}), or None
    where there is none or it cannot be read (then it is measured again)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        record["curve"] = {int(k): float(v) for k, v in record["curve"].items()}
        return record
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _quiet_now() -> bool:
    """Whether other processes use no more than BUSY_CORES over QUIET_CHECK_S now (False
    where /proc/stat cannot be read, or off a CPU device: there the curve is not busy)."""
    if jax.devices()[0].platform != "cpu":
        return False
    with OtherCpuUse() as others:
        time.sleep(QUIET_CHECK_S)
    return others.cores is not None and others.cores <= BUSY_CORES


def monotone(curve: dict) -> dict:
    """On a CPU device, the curve with each size's time at least every smaller size's: a
    step of more tokens costs no less than one of fewer there (a noisy timing said a
    4-token step cost 0.86x a one-token one), so no cost ratio is below 1. Elsewhere as
    measured: on a GPU a few-token step can truly cost less than a one-token one (another
    kernel: the 7B shape's 2..64-token steps at 0.84-0.99x, benchmarks/gpu/)."""
    if jax.devices()[0].platform != "cpu":
        return dict(curve)
    out, longest = {}, 0.0
    for t in sorted(curve):
        longest = max(longest, curve[t])
        out[t] = longest
    return out


def whole_steps() -> bool:
    """Whether the curve times whole decode steps (step_curve.py: on accelerators, where
    the step's own kernels cost more than a small model's forward) rather than forwards
    (on a CPU, where they cost little beside the matmuls and the forwards compile in a
    fraction of the time)."""
    return jax.devices()[0].platform != "cpu"


def cost_curve_path(model, batch: int = 1, devices: int | None = None) -> Path:
    """Where the cost curve of this device/model/dtype at `batch` rows is cached, for a
    process with `devices` devices (default: this one's)."""
    rows = "" if batch == 1 else f"-b{batch}"
    return tune_dir() / f"cost-v{CURVE_VERSION}-{device_key(model, devices)}{rows}.json"


def save_cost_curve(
    model, curve: dict, batch: int = 1, devices: int | None = None, **about
) -> None:
    """Cache a cost curve {T: seconds} (measured, or given: a test seeds one so that
    `auto` need not measure, also for the commands it starts, which see fewer devices),
    with `about` (e.g. other_cores) beside it."""
    record = {"curve": curve, "measured": time.time(), **about}
    write_atomic(cost_curve_path(model, batch, devices), json.dumps(record))


def cost_ratio(curve: dict, tokens: int) -> float:
    """Interpolated latency of a `tokens`-token step over a one-token step (inf beyond
    the probed sizes)."""
    ts = sorted(curve)
    if tokens > ts[-1]:
        return float("inf")
    return float(np.interp(tokens, ts, [curve[t] for t in ts])) / curve[1]
