"""Jacobi trajectories: for each prompt, the model's greedy output (the fixed point) cut
into n-token blocks, and every Jacobi state of each block from a guessed start, stored as
a compact dataset.

A Jacobi iteration replaces every token of a block at once by the model's greedy choice
after the tokens before it (the true text before the block, then the block's current
guesses): g_k <- [argmax p(. | x, y*[:k*n]), argmax p(. | x, y*[:k*n], g_k[:1]), ...].
Token j is right after at most j + 1 iterations, so n iterations reach the fixed point.
All blocks of all rows iterate together, one forward pass per iteration (layout.py).

The fixed point comes from plain greedy decoding (lj.generate); the first iteration also
checks that the pass here predicts the same tokens from y* (it is a different arithmetic
order, and a near-tie can flip). A row's output is cut at its first disagreement, and to
whole blocks. A block's iterations then reach y* unless a near-tie splits the guess rows
from the fixed-point rows (same tokens, other places in the sequence); such a block
records n + 1 iterations and is still trained towards y*.

On disk (`save_trajectories` / `load_trajectories`, one .npz written atomically):

    prompt   [X, P] int32   left-padded prompts (pad 0)
    prompt_len [X]  int32
    fixed    [X, Y] int32   y* (zeros past out_len)
    out_len  [X]    int32   whole blocks of y* kept (a multiple of n)
    states   [X, n + 1, Y] int32  Jacobi state s of every block (s = 0: the guess)
    iters    [X, m] int32   iterations block k took to reach y* (0..n)
    meta     json: block, blocks, max_prompt_tokens, base checkpoint, seed, counts
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.errors import CheckpointError, UserInputError
from lookahead_jax.training import layout

FORMAT = "lookahead_jax.trajectories/1"


@dataclasses.dataclass
class Trajectories:
    prompt: np.ndarray
    prompt_len: np.ndarray
    fixed: np.ndarray
    out_len: np.ndarray
    states: np.ndarray
    iters: np.ndarray
    meta: dict

    @property
    def block(self) -> int:
        return self.meta["block"]

    @property
    def blocks(self) -> int:
        return self.meta["blocks"]

    @property
    def max_prompt_tokens(self) -> int:
        return self.meta["max_prompt_tokens"]

    def __len__(self) -> int:
        return len(self.prompt)


def jacobi_update(lm, params, prompt_bp, fixed_by, guess_by, prompt_len_b, out_len_b, block):
    """One Jacobi iteration of every block: (new guesses [B, Y], the fixed-point rows'
    own greedy tokens [B, Y] — equal to y* where y* is a fixed point of this pass)."""
    Y = fixed_by.shape[1]
    logits = layout.logits(
        lm, params, prompt_bp, fixed_by, guess_by, prompt_len_b, out_len_b, block
    )
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, 2Y]
    from_fixed, from_guess = best[:, :Y], best[:, Y:]
    first = (jnp.arange(Y) % block) == 0  # j = 0: predicted from the true text alone
    return jnp.where(first[None], from_fixed, from_guess), from_fixed


def _trajectory_fn(lm, block: int):
    def run(params, prompt, fixed, guess0, prompt_len, out_len):
        def body(guess, _):
            new, own = jacobi_update(lm, params, prompt, fixed, guess, prompt_len, out_len, block)
            return new, (new, own)

        _, (states, owns) = jax.lax.scan(body, guess0, None, length=block)
        # the fixed-point rows see only prompt and y*: every iteration's `own` is the same
        return jnp.concatenate([guess0[None], states]), owns[0]  # [n + 1, B, Y], [B, Y]

    return jax.jit(run)


def collect(
    model,
    prompts: list[list[int]],
    block: int = 16,
    blocks: int = 4,
    max_prompt_tokens: int = 256,
    batch: int = 8,
    seed: int = 0,
    progress=None,
) -> Trajectories:
    """Trajectories of `model` (an lj.Model) for token-id prompts: greedy outputs of up to
    Y = block * blocks tokens, then n Jacobi iterations of every block from a start of
    random prompt tokens. Prompts longer than `max_prompt_tokens` are skipped (counted in
    meta). `progress(done, total)` is called after each batch."""
    import lookahead_jax as lj

    if block < 2 or blocks < 1 or max_prompt_tokens < 1 or batch < 1:
        raise UserInputError(
            f"block must be >= 2 and blocks, max_prompt_tokens, batch >= 1; got block={block}, "
            f"blocks={blocks}, max_prompt_tokens={max_prompt_tokens}, batch={batch}"
        )
    kept = [p for p in prompts if 0 < len(p) <= max_prompt_tokens]
    if not kept:
        raise UserInputError(f"no prompt fits in {max_prompt_tokens} tokens (of {len(prompts)})")
    Y = block * blocks
    run = _trajectory_fn(model.lm, block)
    rng = np.random.default_rng(seed)
    parts = []  # one dict of [batch, ...] arrays per batch, with "rows": how many are real
    for start in range(0, len(kept), batch):
        rows = kept[start : start + batch]
        outs = lj.generate(model, rows, max_new_tokens=Y, lookahead=None).token_ids
        B = len(rows)  # the arrays keep `batch` rows: one compilation
        prompt = np.zeros((batch, max_prompt_tokens), np.int32)
        fixed = np.zeros((batch, Y), np.int32)
        prompt_len = np.ones(batch, np.int32)
        out_len = np.zeros(batch, np.int32)
        guess0 = np.zeros((batch, Y), np.int32)
        for b, (p, y) in enumerate(zip(rows, outs, strict=True)):
            prompt[b, max_prompt_tokens - len(p) :] = p
            prompt_len[b] = len(p)
            fixed[b, : len(y)] = y
            out_len[b] = len(y) // block * block
            guess0[b] = rng.choice(np.asarray(p), Y)
        states, own = run(model.params, prompt, fixed, guess0, prompt_len, out_len)
        states, own = np.asarray(states).transpose(1, 0, 2), np.asarray(own)
        for b in range(B):
            agree = own[b, : out_len[b]] == fixed[b, : out_len[b]]
            if not agree.all():  # a near-tie flipped: keep the blocks before it
                out_len[b] = int(np.argmin(agree)) // block * block
        parts.append(dict(prompt=prompt, prompt_len=prompt_len, fixed=fixed, out_len=out_len,
                          states=states, rows=B))  # fmt: skip
        if progress is not None:
            progress(min(start + batch, len(kept)), len(kept))
    names = ("prompt", "prompt_len", "fixed", "out_len", "states")
    cat = {name: np.concatenate([p[name][: p["rows"]] for p in parts]) for name in names}
    if not cat["out_len"].any():
        raise UserInputError(
            f"no prompt gave a whole block of {block} tokens (greedy outputs ended sooner, "
            f"or a near-tie cut them); give more or longer-answered prompts or a smaller block"
        )
    for i in range(len(cat["fixed"])):  # nothing of y* past the kept blocks
        cat["fixed"][i, cat["out_len"][i] :] = 0
        cat["states"][i, :, cat["out_len"][i] :] = 0
    iters = iterations(cat["states"], cat["fixed"], block)
    meta = {
        "format": FORMAT,
        "block": block,
        "blocks": blocks,
        "max_prompt_tokens": max_prompt_tokens,
        "seed": seed,
        "base": str(getattr(model, "path", None)),
        "prompts_given": len(prompts),
        "prompts_skipped_too_long": len(prompts) - len(kept),
        "tokens": int(cat["out_len"].sum()),
        "mean_iterations_per_block": mean_iterations(iters, cat["out_len"], block),
    }
    return Trajectories(**cat, iters=iters, meta=meta)


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested dicts of settings, each as
    "key (then, now)" ("absent" for a key one side lacks)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{k}.")
        elif a != b:
            then = "absent" if k not in old else repr(a)
            now = "absent" if k not in new else repr(b)
            out.append(f"{prefix}{k} ({then} then, {now} now)")
    return out


def mismatches(meta: dict, settings: dict) -> list[str]:
    """The settings a stored dataset's meta does not share (its other keys not compared)."""
    return differences({k: meta[k] for k in settings if k in meta}, settings)


def iterations(states, fixed_xy, block: int) -> np.ndarray:
    """[X, m]: the first Jacobi state of each block equal to y*'s block (n + 1 if none).

    states [X, n + 1, Y], fixed [X, Y]."""
    X, n_states, Y = states.shape
    same = (states == fixed_xy[:, None]).reshape(X, n_states, Y // block, block).all(-1)
    return np.where(same.any(1), same.argmax(1), n_states).astype(np.int32)


def mean_iterations(iters, out_len_x, block: int) -> float:
    """Mean iterations per kept block: n / this is the Jacobi compression.

    iters [X, m], out_len [X]."""
    kept = np.arange(iters.shape[1])[None] < (out_len_x // block)[:, None]
    return float(iters[kept].mean()) if kept.any() else float("nan")


def save_trajectories(trajectories: Trajectories, path) -> Path:
    """Write the dataset to `path` (.npz) atomically: a temporary file renamed in place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            arrays = {k: v for k, v in dataclasses.asdict(trajectories).items() if k != "meta"}
            np.savez_compressed(f, meta=np.asarray(json.dumps(trajectories.meta)), **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_trajectories(path) -> Trajectories:
    """Read a dataset written by `save_trajectories`, with a clear error for anything else."""
    path = Path(path)
    try:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {
                f.name: z[f.name] for f in dataclasses.fields(Trajectories) if f.name != "meta"
            }
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{path} is not a trajectory dataset: {e}") from e
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if "prompt_slots" in meta:  # the key's name in files written before the rename
        meta["max_prompt_tokens"] = meta.pop("prompt_slots")
    return Trajectories(**arrays, meta=meta)
