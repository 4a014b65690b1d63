"""The training loop: optax AdamW (warm-up + cosine, global-norm clipping, gradient
accumulation) on loss.py's objective over a trajectory dataset, with the whole train state
checkpointed by orbax so that an interrupted run resumes exactly where it stopped.

Determinism: micro-batch i's examples and Jacobi states are a function of (seed, i)
alone (`sample_batch`), so a resumed run sees the batches an uninterrupted one would and
ends with the same parameters.

    WORK/state/<micro step>/   orbax: params, optimizer state
    WORK/train.json            the TrainConfig, dtype and dataset the saved state belongs
                               to; a resume with different ones is refused, naming them

Interruptions: Ctrl-C (SIGINT) or SIGTERM during training sets a flag that the loop reads
between steps, so the state saved is a finished step's (the jitted step donates its
inputs: stopping inside it would leave nothing whole to save). A second Ctrl-C stops at
once, keeping the last saved state.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import signal
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.cache_dir import write_atomic
from lookahead_jax.errors import UserInputError
from lookahead_jax.models import fused, packed
from lookahead_jax.training import layout
from lookahead_jax.training.loss import TEACHERS, losses
from lookahead_jax.training.trajectories import Trajectories, differences


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 200  # optimizer updates
    batch: int = 4  # examples per micro-batch
    accumulate: int = 1  # micro-batches per update
    learning_rate: float = 5e-5  # peak, after warm-up; cosine to a tenth of it
    warmup: int = 20  # updates of linear warm-up
    weight_decay: float = 0.0
    clip_norm: float = 1.0  # global gradient norm
    consistency_weight: float = 1.0
    ar_weight: float = 1.0
    teacher: str = "base"  # whose fixed-point distribution is learned: loss.py's TEACHERS
    seed: int = 0
    save_every: int = 25  # updates between train-state checkpoints

    def check(self) -> TrainConfig:
        ints = ("steps", "batch", "accumulate", "save_every")
        for name in ints:
            if getattr(self, name) < 1:
                raise UserInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.warmup >= self.steps:
            raise UserInputError(f"warmup must be in [0, steps={self.steps}), got {self.warmup}")
        for name in ("learning_rate", "clip_norm"):
            if not getattr(self, name) > 0:
                raise UserInputError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.teacher not in TEACHERS:
            raise UserInputError(f"teacher must be one of {TEACHERS}, got {self.teacher!r}")
        for name in ("weight_decay", "consistency_weight", "ar_weight"):
            if getattr(self, name) < 0:
                raise UserInputError(f"{name} must be >= 0, got {getattr(self, name)}")
        return self


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during training: the state after micro-step `micro_step` is
    saved; run again to resume."""

    def __init__(self, micro_step: int, signal_name: str = "SIGINT"):
        super().__init__(
            f"training stopped by {signal_name} after micro-step {micro_step}; state saved"
        )
        self.micro_step, self.signal_name = micro_step, signal_name


def make_optimizer(tc: TrainConfig):
    import optax

    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=tc.learning_rate,
        warmup_steps=tc.warmup,
        decay_steps=tc.steps,
        end_value=tc.learning_rate / 10,
    )

    opt = optax.chain(
        optax.clip_by_global_norm(tc.clip_norm),
        optax.adamw(schedule, weight_decay=tc.weight_decay, mask=decayed),
    )
    return optax.MultiSteps(opt, every_k_schedule=tc.accumulate) if tc.accumulate > 1 else opt


# norms and biases by name: LayerParams' attn_norm, q_norm, final_norm, bq..bo, b_gate..;
# Flax's "scale" (of a norm) and "bias". Their leading axis may be the layer stack, so
# the number of dimensions cannot tell them from matrices.
_NOT_DECAYED = re.compile(r"(norm$|^b[qkvo]$|^b_\w+$|^bias$|^scale$)")


def decayed(params):
    """The weight-decay mask: True for every leaf but norms and biases."""

    def is_decayed(path, _):
        key = path[-1]
        return not _NOT_DECAYED.search(str(getattr(key, "name", getattr(key, "key", key))))

    return jax.tree_util.tree_map_with_path(is_decayed, params)


def sample_batch(data: Trajectories, micro_step: int, batch: int, seed: int) -> dict:
    """Micro-batch `micro_step`: examples in a per-epoch shuffled order, and for each
    block one Jacobi state drawn uniformly from those before its fixed point (a block
    whose guess was already right contributes its fixed point: no consistency term)."""
    X, n, m = len(data), data.block, data.blocks
    idx = np.arange(micro_step * batch, (micro_step + 1) * batch)
    epochs = idx // X
    order = {e: np.random.default_rng([seed, 1, int(e)]).permutation(X) for e in set(epochs)}
    rows = np.asarray([order[e][i % X] for e, i in zip(epochs, idx, strict=True)])
    rng = np.random.default_rng([seed, 2, micro_step])
    iters = data.iters[rows]  # [B, m]
    pick = np.minimum((rng.random(iters.shape) * iters).astype(np.int32), np.maximum(iters - 1, 0))
    states = data.states[rows].reshape(batch, n + 1, m, n)  # [B, n + 1, m, n]
    guess = np.take_along_axis(states, pick[:, None, :, None], axis=1)[:, 0]  # [B, m, n]
    return {
        "prompt": data.prompt[rows],
        "prompt_len": data.prompt_len[rows],
        "fixed": data.fixed[rows],
        "out_len": data.out_len[rows],
        "guess": guess.reshape(batch, m * n),
    }


def batch_logits(lm, params, batch: dict, block: int, fixed_only: bool = False):
    """[B, 2Y, V]: the logits of layout.logits_rows for one micro-batch ([B, Y, V], the
    fixed-point rows, with fixed_only)."""
    return layout.logits(
        lm, params, batch["prompt"], batch["fixed"], batch["guess"], batch["prompt_len"],
        batch["out_len"], block, fixed_only,
    )  # fmt: skip


def loss_fn(lm, params, batch: dict, tc: TrainConfig, block: int, base_params=None):
    """(weighted total, (consistency, ar)) of one micro-batch. base_params: the frozen
    base model, needed by teacher "base" (its fixed-point logits are the targets; no
    gradient reaches them: losses() stops it)."""
    logits_brv = batch_logits(lm, params, batch, block)
    teacher_byv = None
    if tc.teacher == "base":
        teacher_byv = batch_logits(lm, base_params, batch, block, fixed_only=True)
    consistency, ar = losses(
        logits_brv, batch["fixed"], batch["guess"], batch["out_len"], block, teacher_byv
    )
    return tc.consistency_weight * consistency + tc.ar_weight * ar, (consistency, ar)


@functools.lru_cache(maxsize=8)
def make_train_step(lm, tc: TrainConfig, block: int):
    """(optimizer, jitted step(params, opt_state, batch, base_params)): one compilation per
    model, config and block size. base_params: None unless tc.teacher is "base"."""
    import optax

    opt = make_optimizer(tc)

    def step(params, opt_state, batch, base_params):
        grad_fn = jax.value_and_grad(
            lambda p: loss_fn(lm, p, batch, tc, block, base_params), has_aux=True
        )
        (total, (consistency, ar)), grads = grad_fn(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": total, "consistency": consistency, "ar": ar}

    return opt, jax.jit(step, donate_argnums=(0, 1))


def _put_batch(batch: dict, mesh):
    if mesh is None:
        return {k: jnp.asarray(v) for k, v in batch.items()}
    from jax.sharding import NamedSharding, PartitionSpec

    rows = NamedSharding(mesh, PartitionSpec("data"))
    return {k: jax.device_put(v, rows) for k, v in batch.items()}


def _fingerprint(tc: TrainConfig, data: Trajectories, dtype) -> dict:
    """What a saved state belongs to, as JSON values (NaN written as the string "NaN")."""
    settings = dataclasses.asdict(tc)
    del settings["save_every"]  # how often states are saved does not change the run
    record = {
        "train": settings,
        "dtype": str(np.dtype(dtype)),
        "data": {**data.meta, "examples": len(data)},
    }
    return json.loads(json.dumps(record), parse_constant=str)


class _StopRequests:
    """SIGINT and SIGTERM as a flag the training loop reads between steps (main thread
    only; elsewhere signals keep their handlers). A second signal raises at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.requested, self._old = None, {}
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._old.items():  # None: a handler set outside Python
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        return False


def train(model, data: Trajectories, work_dir, tc: TrainConfig, progress: bool = True,
          log=None):  # fmt: skip
    """Train model.params on `data`; returns the trained params. Resumes from the newest
    state in `work_dir` when there is one. `progress`: a tqdm bar (loss, tokens/s);
    `log(line)`, if given, gets the same figures as a line at every saved state (for logs
    that are not a terminal)."""
    import orbax.checkpoint as ocp

    tc.check()
    if packed.is_packed(model.params):
        raise UserInputError(
            "training differentiates through the model, and the CPU kernel's packed weights "
            "have no gradient: load the model with lj.load(..., cpu_kernel=False)"
        )
    if fused.has_fused(model.params):
        raise UserInputError(
            "training reads and saves each matrix by its checkpoint name, which fused q/k/v "
            "and gate/up matrices lack: load the model with lj.load(..., fuse=False)"
        )
    dtype = jax.tree.leaves(model.params)[0].dtype
    if dtype not in (np.float32, np.float64):
        raise UserInputError(
            f"training needs float32 or float64 parameters, the model holds {dtype}: "
            "AdamW's small updates vanish in bfloat16/float16; load with dtype='float32'"
        )
    mesh = getattr(model, "mesh", None)
    if mesh is not None and tc.batch % mesh.shape["data"]:
        raise UserInputError(
            f"batch {tc.batch} must divide by the mesh's data={mesh.shape['data']}"
        )
    work = Path(work_dir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    manager = ocp.CheckpointManager(
        work / "state", options=ocp.CheckpointManagerOptions(max_to_keep=2)
    )
    try:
        _check_or_record(work, manager.latest_step() is not None, _fingerprint(tc, data, dtype))
        return _train_loop(model, data, tc, manager, progress, log)
    finally:
        manager.close()


def _check_or_record(work: Path, resuming: bool, want: dict) -> None:
    """A fresh run records its fingerprint in WORK/train.json; a resumed one must match."""
    record = work / "train.json"
    if not resuming:
        write_atomic(record, json.dumps(want, indent=2) + "\n")
        return
    try:
        had = json.loads(record.read_text(), parse_constant=str)
    except (OSError, ValueError):
        had = None
    if not isinstance(had, dict):
        raise UserInputError(
            f"{work / 'state'} holds a saved state but {record} is missing or unreadable; "
            "give a new work directory"
        )
    changed = differences(had, want)
    if changed:
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise UserInputError(
            f"{work} holds a run with other settings or data: {'; '.join(changed[:4])}{more}; "
            "give a new work directory or the same settings"
        )


def _train_loop(model, data: Trajectories, tc: TrainConfig, manager, progress: bool, log):
    import orbax.checkpoint as ocp
    from tqdm import tqdm

    mesh = getattr(model, "mesh", None)
    opt, step_fn = make_train_step(model.lm, tc, data.block)
    params = jax.tree.map(jnp.copy, model.params)  # the step donates its params
    base_params = model.params if tc.teacher == "base" else None
    opt_state = jax.jit(opt.init)(params)
    micro = 0
    if manager.latest_step() is not None:
        micro = manager.latest_step()
        like = _leaves({"params": params, "opt": opt_state})
        abstract = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in like.items()
        }
        restored = manager.restore(micro, args=ocp.args.StandardRestore(abstract))
        state = _unleaves(restored, {"params": params, "opt": opt_state})
        params, opt_state = state["params"], state["opt"]

    def save(step):
        manager.save(
            step, args=ocp.args.StandardSave(_leaves({"params": params, "opt": opt_state}))
        )
        manager.wait_until_finished()

    stop_micro = tc.steps * tc.accumulate
    tokens, t0 = 0, None  # tokens since the first update, and when it ended
    with (
        tqdm(total=tc.steps, initial=micro // tc.accumulate, unit="step", disable=not progress,
             desc="consistency training") as bar,
        _StopRequests() as stop,
    ):  # fmt: skip
        while micro < stop_micro and stop.requested is None:
            batch = sample_batch(data, micro, tc.batch, tc.seed)
            params, opt_state, metrics = step_fn(
                params, opt_state, _put_batch(batch, mesh), base_params
            )
            micro += 1
            tokens += int(batch["out_len"].sum())
            if micro % tc.accumulate == 0:
                # (rounded before formatting: no -0.0000 for a loss a hair below zero)
                figures = {k: f"{round(float(v), 4) + 0.0:.4f}" for k, v in metrics.items()}
                if t0 is None:  # the first update compiled the step: rates from here
                    tokens, t0 = 0, time.perf_counter()
                else:
                    figures["tok_s"] = f"{tokens / (time.perf_counter() - t0):.0f}"
                bar.update(1)
                bar.set_postfix(figures)
                if (micro // tc.accumulate) % tc.save_every == 0:
                    save(micro)
                    if log is not None:
                        text = " ".join(f"{k} {v}" for k, v in figures.items())
                        log(f"update {micro // tc.accumulate}/{tc.steps}: {text}")
        if manager.latest_step() != micro:
            save(micro)
    if micro < stop_micro:  # stopped by a signal (one during the last step changes nothing)
        raise TrainingInterrupted(micro, stop.requested)
    return params


def _leaves(tree) -> dict:
    """A pytree as {'00000': leaf, ...} (orbax stores plain dicts of arrays)."""
    return {f"{i:05d}": x for i, x in enumerate(jax.tree.leaves(tree))}


def _unleaves(flat: dict, like):
    treedef = jax.tree.structure(like)
    return jax.tree.unflatten(treedef, [flat[f"{i:05d}"] for i in range(treedef.num_leaves)])


def check_mix(fraction: float, name: str = "mix") -> float:
    """`fraction` if mix() takes it; else a UserInputError naming it as `name`."""
    if not 0 < fraction <= 1:
        raise UserInputError(f"{name} must be in (0, 1], got {fraction}")
    return fraction


def mix(base_params, trained_params, fraction: float):
    """base + fraction * (trained - base), leaf by leaf: weight interpolation (WiSE-FT,
    Wortsman et al. 2022), a dial from the trained model's speed-up back to the base's
    quality after training (what it gave on SmolLM2: README "Training for lookahead")."""
    check_mix(fraction)
    return jax.tree.map(lambda b, t: b + fraction * (t - b), base_params, trained_params)


def write_checkpoint(model, params, out, source: dict, force: bool = False) -> Path:
    """The trained params as a normal checkpoint at `out` (atomic; the base checkpoint's
    tokenizer files copied), which --ckpt and lj.load take."""
    from lookahead_jax.checkpoints import checkpoint
    from lookahead_jax.checkpoints.convert.hf import copy_tokenizer
    from lookahead_jax.models.llama import LlamaLM
    from lookahead_jax.models.llama_params import flat_names

    if not isinstance(model.lm, LlamaLM) or model.lm.weights != "float":
        raise UserInputError("writing a checkpoint needs a Llama-family model with float weights")
    if fused.has_fused(params):
        raise UserInputError("writing a checkpoint needs unfused params: lj.load(..., fuse=False)")
    flat = {name: np.asarray(x) for name, x in flat_names(params).items()}  # stacked
    with checkpoint.staging_dir(Path(out), force=force) as tmp:
        if getattr(model, "path", None) is not None:
            copy_tokenizer(Path(model.path), tmp)
        checkpoint.write_params(tmp, model.cfg, flat, source)
    return Path(out)
