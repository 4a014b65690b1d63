"""`lj.generate`: prompts in, tokens and stats out — plain or lookahead, greedy or sampled.

It only wires the parts: inputs.py (prompts, budget, device arrays), autotune.AutoRun
(`lookahead="auto"`), programs.py (compiled programs), driver.py (device or host loop)
and the output below.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding import autotune, driver, programs
from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.sampling import SamplingConfig
from lookahead_jax.distributed import multihost
from lookahead_jax.engine import inputs
from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses import acceptance_record
from lookahead_jax.guesses.lookahead_config import LookaheadConfig, max_step_tokens
from lookahead_jax.models import seam


class SourceStats(TypedDict, total=False):
    """One guess source's share of a decode (GenerationStats.sources)."""

    paths: int  # steps whose accepted path came from this source
    tokens: int  # guessed tokens it got accepted
    weight_by_depth: list[float]  # with `adapt`: the rows' last record weights, averaged


class GenerationStats(TypedDict, total=False):
    """`GenerationOutput.stats`: a dict with these keys. A TypedDict rather than a
    dataclass: the CLI writes it out as JSON as it is, and every caller reads it by key
    (lj.Engine's `stats` shares new_tokens, row_steps, compression, accepted_hist,
    compile_s and tokens_per_s)."""

    new_tokens: int  # all rows
    row_steps: int  # forward passes after the prefill, summed over rows
    compression: float  # new_tokens / row_steps
    accepted_hist: dict[str, int]  # steps that emitted "1", "2", ... tokens
    batch: int
    interrupted: bool
    config: dict  # lookahead (LookaheadConfig.describe()), dtype, sampling; with auto,
    # lookahead_auto (what it chose and why)
    sources: dict[str, SourceStats]  # lookahead only: by source name, then "window"
    prefill_s: float
    decode_s: float
    compile_s: float  # compilation in this call (0 when every program was compiled)
    tokens_per_s: float  # new_tokens / (prefill_s + decode_s)
    step_ms: float  # decode_s / the longest row's steps


@dataclasses.dataclass
class GenerationOutput:
    token_ids: list[list[int]]  # new tokens per row, cut at EOS (EOS not included)
    texts: list[str] | None  # decoded token_ids (None without a tokenizer)
    steps: list[int]  # forward passes per row after prefill
    stats: GenerationStats
    step_of_token: list[list[int]]  # per new token: the step that emitted it (0 = prefill)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during generate(); `.partial` holds what was generated so far."""

    def __init__(self, partial: GenerationOutput):
        super().__init__("generation interrupted")
        self.partial = partial


def generate(
    model,
    prompts,
    max_new_tokens: int = 256,
    lookahead: LookaheadConfig | str | None = "auto",
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    chat: bool = False,
    stream: Callable[[list[list[int]]], None] | None = None,
    steps_per_call: int | None = None,
) -> GenerationOutput:
    """Generate up to `max_new_tokens` new tokens for each prompt (a batch).

    model: from lj.load or lj.from_nnx.
    prompts: list of strings (tokenised, with the chat template if `chat`) or of
        token-id lists; a single string is a batch of one.
    lookahead: "auto" (the default, as lj.Engine's and the CLI's: choose the layout for
        this machine and switch to plain decoding where lookahead loses), a
        LookaheadConfig (e.g. LookaheadConfig.for_budget(16)), or None for plain
        decoding.
    temperature 0 (or top_k=1) is greedy; otherwise sampling with top_k / top_p,
        reproducible from `seed` (row b uses fold_in(seed, b)).
    stream: if given, decoding runs in a host loop and `stream(new)` is called after
        the prefill and after every step with each row's newly emitted token ids.
    steps_per_call: without `stream`, the on-device loop returns to the host every
        this many steps (to notice Ctrl-C); None runs the whole decode in one call.

    Raises UserInputError (a ValueError) on bad arguments; GenerationInterrupted
    (a KeyboardInterrupt carrying the partial output) on Ctrl-C.
    """
    inputs.check_max_new_tokens(max_new_tokens)
    if not hasattr(model, "lm") or not hasattr(model, "params"):
        raise UserInputError(
            f"model must be an lj.Model (from lj.load or lj.from_nnx), got {type(model).__name__}"
        )
    seam.check_model(model.lm)
    if lookahead not in (None, "auto") and not isinstance(lookahead, LookaheadConfig):
        raise UserInputError(
            "lookahead must be a LookaheadConfig (e.g. LookaheadConfig.for_budget(16)), "
            f"'auto' or None, got {lookahead!r}"
        )
    sampling = SamplingConfig(float(temperature), top_k, top_p)
    max_context = model.lm.max_context
    auto = None
    if lookahead == "auto":
        auto = autotune.AutoRun(model, sampling, max_step_tokens(max_context))
        lookahead = auto.config
    if lookahead is not None:
        lookahead.check_fits(max_context)
    ids = inputs.encode_prompts(model, prompts, chat)
    inputs.check_context(max_context, max(len(p) for p in ids), max_new_tokens)
    spec = DecodeSpec(
        lm=model.lm,
        eos_ids=tuple(model.eos_ids),
        sampled=not sampling.greedy,
        lookahead=lookahead,
        cache_dtype=jnp.dtype(model.dtype).name,
    )
    args, max_new_tokens_bucket = inputs.device_inputs(model, ids, max_new_tokens, seed, sampling)

    # compile first: neither timing below includes compilation
    loop = "step" if stream else "run_loop"
    progs = programs.programs(model, spec, max_new_tokens_bucket, args, loop)
    t0 = time.perf_counter()
    state = progs.start(*args)
    jax.block_until_ready(state)
    prefill_s = time.perf_counter() - t0

    watch = driver.NO_WATCH
    if auto is not None:  # a losing lookahead hands over to plain decoding (same state)
        plain_spec = dataclasses.replace(spec, lookahead=None, min_slack=spec.max_emit)
        auto.plain_program = lambda: programs.compiled(
            model, plain_spec, max_new_tokens_bucket, args, loop
        )
        watch = auto
    interrupted = False
    t0 = time.perf_counter()
    try:
        if stream is not None:
            state = driver.on_host(model.params, progs.loop, state, stream, watch)
        else:
            chunk = steps_per_call or (auto and auto.chunk_steps) or max_new_tokens_bucket + 1
            state = driver.on_device(model.params, progs.loop, state, chunk, watch)
    except KeyboardInterrupt as e:
        interrupted = True
        state = getattr(e, "state", None)
        if state is None:
            raise
    jax.block_until_ready(state)
    decode_s = time.perf_counter() - t0
    out = output(model, spec, sampling, state, interrupted, auto and auto.lookahead_hist)
    new_tokens = out.stats["new_tokens"]
    out.stats.update(
        prefill_s=prefill_s,
        decode_s=decode_s,
        compile_s=progs.compile_s + (auto.compile_s if auto else 0.0),
        tokens_per_s=new_tokens / (prefill_s + decode_s) if new_tokens else 0.0,
        step_ms=1000 * decode_s / max(max(out.steps, default=0), 1),
    )
    if auto is not None:
        auto.report(state, out.stats, interrupted)
    if interrupted:
        raise GenerationInterrupted(out)
    return out


def output(
    model,
    spec: DecodeSpec,
    sampling: SamplingConfig,
    state: DecodeState,
    interrupted: bool,
    lookahead_hist=None,
) -> GenerationOutput:
    """Tokens, texts and counts (this process's rows) of a finished or stopped decode.

    lookahead_hist: after a switch to plain decoding, the lookahead phase's histogram."""
    tokens, step_of, prompt_len, n_out, steps, hist = (
        multihost.local_rows(a)
        for a in (
            state.tokens,
            state.step_of_token,
            state.prompt_len,
            state.n_out,
            state.steps,
            state.accept_hist,
        )
    )
    new_slice = [slice(prompt_len[b], prompt_len[b] + n_out[b]) for b in range(len(n_out))]
    token_ids = [tokens[b, s].tolist() for b, s in enumerate(new_slice)]
    step_of_token = [step_of[b, s].tolist() for b, s in enumerate(new_slice)]
    texts = None
    if model.tokenizer is not None:
        texts = [model.tokenizer.decode(t) for t in token_ids]
    if lookahead_hist is not None:  # lookahead, then plain after a switch
        merged = np.asarray(lookahead_hist).copy()
        merged[:, 0] += hist[:, 0]
        hist = merged
    counts = hist.sum(0).tolist()  # steps that emitted 1, 2, ... tokens
    steps = steps.tolist()
    new_tokens, total_steps = int(n_out.sum()), int(sum(steps))
    stats: GenerationStats = {
        "new_tokens": new_tokens,
        "row_steps": total_steps,  # forward passes summed over rows, as the engine's
        # new tokens per forward pass after the prefill (the prefill's token counts too)
        "compression": new_tokens / max(total_steps, 1),
        "accepted_hist": {str(i + 1): int(c) for i, c in enumerate(counts)},
        "batch": len(n_out),
        "interrupted": interrupted,
        "config": {
            "lookahead": None if spec.lookahead is None else spec.lookahead.describe(),
            "dtype": spec.cache_dtype,
            **sampling.describe(),
        },
    }
    if state.draft is not None:
        paths = multihost.local_rows(state.draft.paths_by_source).sum(0).tolist()
        accepted = multihost.local_rows(state.draft.tokens_by_source).sum(0).tolist()
        stats["sources"] = {
            name: {"paths": int(p), "tokens": int(t)}
            for name, p, t in zip(spec.lookahead.source_names, paths, accepted, strict=True)
        }
        if state.draft.record is not None:  # the rows' last weights by depth, averaged
            record = state.draft.record
            w_bja = acceptance_record.weights(
                acceptance_record.AcceptanceRecord(
                    expected=multihost.local_rows(record.expected),
                    accepted=multihost.local_rows(record.accepted),
                )
            )
            names = spec.lookahead.source_names
            for name, w_a in zip(names, np.mean(w_bja, axis=0).tolist(), strict=True):
                stats["sources"][name]["weight_by_depth"] = [round(w, 4) for w in w_a]
    return GenerationOutput(
        token_ids=token_ids, texts=texts, steps=steps, stats=stats, step_of_token=step_of_token
    )
