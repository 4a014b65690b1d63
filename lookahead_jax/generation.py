"""`generate`: prompts in, tokens and stats out — plain or lookahead, greedy or sampled.

Prompts are right-padded to a bucket length (powers of two from 16) and the
token budget is rounded up to a power of two, so a new prompt length rarely
means a new compilation; compiled programs are kept per shape in this process
and in JAX's persistent compilation cache across processes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax import autotune, loops, multihost
from lookahead_jax.decode_state import DecodeSpec, DecodeState
from lookahead_jax.errors import UserInputError
from lookahead_jax.loading import Model
from lookahead_jax.lookahead import LookaheadConfig
from lookahead_jax.sampling import SamplingConfig, row_keys
from lookahead_jax.sharding import check_batch

MIN_PROMPT_BUCKET = 16
# A lookahead step runs 1 + (N-1)*(W+G) tokens through the model; beyond this (or a
# quarter of the model's context) a step is far past any useful size and its pool and
# attention buffers grow without bound, so such configurations are refused.
MAX_STEP_TOKENS = 1024


def check_max_new_tokens(max_new_tokens) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
        raise UserInputError(
            f"max_new_tokens (--max-new-tokens) must be an integer > 0, got {max_new_tokens!r}"
        )
    if max_new_tokens <= 0:
        raise UserInputError(
            f"max_new_tokens (--max-new-tokens) must be an integer > 0, got {max_new_tokens}"
        )


def max_step_tokens(cfg) -> int:
    """The most tokens a lookahead step may feed this model."""
    return min(MAX_STEP_TOKENS, cfg.max_position_embeddings // 4)


def check_lookahead_fits(lookahead: LookaheadConfig | None, cfg) -> None:
    """Refuse a lookahead step whose token count is not well below the model's context."""
    if lookahead is None:
        return
    tokens = lookahead.tokens_per_step
    context = cfg.max_position_embeddings
    limit = max_step_tokens(cfg)
    if tokens > limit:
        raise UserInputError(
            f"lookahead N,W,G={lookahead.n},{lookahead.w},{lookahead.g} makes {tokens} tokens "
            f"per step (1 + (N-1)*(W+G)); at most {limit} are allowed for this model (a quarter "
            f"of its {context}-token context, and never more than {MAX_STEP_TOKENS})"
        )


def check_budget(cfg, max_new_tokens: int) -> None:
    """Refuse a token budget that leaves no room for even a one-token prompt (checkable
    before any prompt is tokenized; `check_context` is the full check)."""
    context = cfg.max_position_embeddings
    if max_new_tokens >= context:
        raise UserInputError(
            f"max_new_tokens ({max_new_tokens}) does not fit the model's context of {context} "
            f"tokens with any prompt; max_new_tokens can be at most {context - 1} (less the "
            "prompt's length)"
        )


def check_context(cfg, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a prompt + token budget that does not fit in the model's context."""
    context = cfg.max_position_embeddings
    if prompt_tokens + max_new_tokens > context:
        room = context - prompt_tokens
        hint = (
            f"max_new_tokens can be at most {room} for this prompt"
            if room > 0
            else "the prompt alone fills it; shorten the prompt"
        )
        raise UserInputError(
            f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"model's context of {context} tokens; {hint}"
        )


def bucket(n: int, minimum: int = MIN_PROMPT_BUCKET) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


@dataclasses.dataclass
class GenerationOutput:
    token_ids: list[list[int]]  # new tokens per row, cut at EOS (EOS not included)
    texts: list[str] | None  # decoded token_ids (None without a tokenizer)
    steps: list[int]  # forward passes per row after prefill
    stats: dict  # decode_s, prefill_s, compile_s, tokens_per_s, compression, ...
    step_of_token: list[list[int]]  # per new token: the step that emitted it (0 = prefill)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during generate(); `.partial` holds what was generated so far."""

    def __init__(self, partial: GenerationOutput):
        super().__init__("generation interrupted")
        self.partial = partial


_JITTED: dict = {}  # (spec, cap, mesh, start-argument shapes) -> (jitted fns, state shape)
_COMPILED: dict = {}  # (that key, entry point name) -> compiled executable


def _executable(model: Model, spec: DecodeSpec, cap: int, start_args, name: str):
    """AOT-compile entry point `name` once per process and shape; return (exe, seconds)."""
    leaves, tree = jax.tree.flatten(start_args)
    shapes = tuple((a.shape, str(a.dtype), getattr(a, "sharding", None)) for a in leaves)
    key = (spec, cap, model.mesh, tree, shapes)
    if (key, name) in _COMPILED:
        return _COMPILED[(key, name)], 0.0
    t = time.perf_counter()
    if key not in _JITTED:
        fns = loops.jitted(spec, cap, model.mesh, start_args)
        state = jax.eval_shape(
            functools.partial(loops.start, spec=spec, max_new_cap=cap), *start_args
        )
        _JITTED[key] = (fns, state)
    fns, state = _JITTED[key]
    lower_args = {
        "start": start_args,
        "step": (model.params, state),
        "run_loop": (model.params, state, jnp.int32(0)),
    }[name]
    exe = fns[name].lower(*lower_args).compile()
    _COMPILED[(key, name)] = exe
    return exe, time.perf_counter() - t


def encode_prompts(model: Model, prompts, chat: bool) -> list[list[int]]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise UserInputError("prompts must be a non-empty list of strings or of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if model.tokenizer is None:
                raise UserInputError("this checkpoint has no tokenizer; pass token ids")
            if not p.strip():
                raise UserInputError(f"prompt {i} is empty")
            ids = model.tokenizer.encode_prompt(p, chat)
        else:
            if chat:
                raise UserInputError("chat=True needs text prompts, not token ids")
            ids = [int(t) for t in p]
        if not ids:
            raise UserInputError(f"prompt {i} encodes to no tokens")
        bad = [t for t in ids if not 0 <= t < model.cfg.vocab_size]
        if bad:
            raise UserInputError(
                f"prompt {i} has token ids outside [0, {model.cfg.vocab_size}): {bad[:5]}"
            )
        out.append(ids)
    return out


def generate(
    model: Model,
    prompts,
    max_new_tokens: int = 256,
    lookahead: LookaheadConfig | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    chat: bool = False,
    stream: Callable[[list[list[int]]], None] | None = None,
    steps_per_call: int | None = None,
) -> GenerationOutput:
    """Generate up to `max_new_tokens` new tokens for each prompt (a batch).

    prompts: list of strings (tokenised, with the chat template if `chat`) or of
        token-id lists; a single string is a batch of one.
    lookahead: LookaheadConfig(n, w, g), or None for plain decoding.
    temperature 0 (or top_k=1) is greedy; otherwise sampling with top_k / top_p,
        reproducible from `seed` (row b uses fold_in(seed, b)).
    stream: if given, decoding runs in a host loop and `stream(new)` is called after
        the prefill and after every step with each row's newly emitted token ids.
    steps_per_call: without `stream`, the on-device loop returns to the host every
        this many steps (to notice Ctrl-C); None runs the whole decode in one call.

    Raises UserInputError (a ValueError) on bad arguments; GenerationInterrupted
    (a KeyboardInterrupt carrying the partial output) on Ctrl-C.
    """
    check_max_new_tokens(max_new_tokens)
    if lookahead not in (None, "auto") and not isinstance(lookahead, LookaheadConfig):
        raise UserInputError(
            f"lookahead must be a LookaheadConfig(n, w, g), 'auto' or None, got {lookahead!r}"
        )
    sampling = SamplingConfig(float(temperature), top_k, top_p)
    choice, guard = None, None
    if lookahead == "auto":
        choice = _choose_auto(model, sampling)
        lookahead = choice.config
        if lookahead is not None and not multihost.is_multiprocess():
            guard = autotune.Guard(cost_ratio=choice.cost_ratio)
    check_lookahead_fits(lookahead, model.cfg)
    ids = encode_prompts(model, prompts, chat)
    check_context(model.cfg, max(len(p) for p in ids), max_new_tokens)
    spec = DecodeSpec(
        model=model.cfg, sampling=sampling, eos_ids=model.eos_ids, lookahead=lookahead
    )
    args, cap = _device_inputs(model, ids, max_new_tokens, seed)

    # compile both programs first: neither timing below includes compilation
    name = "step" if stream else "run_loop"
    start_exe, compile_s = _executable(model, spec, cap, args, "start")
    loop_exe, c = _executable(model, spec, cap, args, name)
    compile_s += c
    t0 = time.perf_counter()
    state = start_exe(*args)
    jax.block_until_ready(state)
    prefill_s = time.perf_counter() - t0

    # With a guard (auto), decoding runs in chunks; a losing lookahead hands the rest of
    # the generation to plain decoding (same state minus the window and pool).
    plain_spec = dataclasses.replace(spec, lookahead=None, min_slack=spec.max_emit)
    switch = _Switch(guard, lambda: _executable(model, plain_spec, cap, args, name))
    interrupted = False
    t0 = time.perf_counter()
    try:
        if stream is not None:
            state = _host_loop(model, loop_exe, state, stream, switch)
        else:
            chunk = steps_per_call or (guard.window_steps if guard else cap + 1)
            state = _device_loop(model, loop_exe, state, chunk, switch)
    except KeyboardInterrupt as e:
        interrupted = True
        state = getattr(e, "state", None)
        if state is None:
            raise
    jax.block_until_ready(state)
    decode_s = time.perf_counter() - t0
    out = _output(
        model,
        spec,
        state,
        prefill_s,
        decode_s,
        compile_s + switch.compile_s,
        interrupted,
        switch.lookahead_hist,
    )
    if choice is not None:
        _report_auto(model, spec, state, out, choice, switch, interrupted)
    if interrupted:
        raise GenerationInterrupted(out)
    return out


def _device_inputs(model: Model, ids: list[list[int]], max_new_tokens: int, seed: int):
    """The start arguments (params, prompt [B, P], prompt_len, max_new, keys) and the
    budget bucket. With several processes `ids` are this process's rows; all processes
    must agree on the shapes, so the bucket covers everyone's longest prompt."""
    B = len(ids)
    if multihost.agree_max(B) != B or multihost.agree_max(-B) != -B:
        raise UserInputError("every process must pass the same number of prompts")
    if multihost.agree_max(max_new_tokens) != max_new_tokens:
        raise UserInputError("every process must pass the same max_new_tokens")
    P = bucket(multihost.agree_max(max(len(p) for p in ids)))
    check_batch(model.mesh, B * jax.process_count())
    prompt = np.zeros((B, P), np.int32)
    for b, p in enumerate(ids):
        prompt[b, : len(p)] = p
    first_row = B * jax.process_index()
    keys = np.asarray(row_keys(seed, first_row + B))[first_row:]
    rows = (
        prompt,
        np.asarray([len(p) for p in ids], np.int32),
        np.full((B,), max_new_tokens, np.int32),
        keys,
    )
    args = (model.params, *(multihost.global_rows(model.mesh, a) for a in rows))
    return args, bucket(max_new_tokens)


def _report_auto(model, spec, state, out, choice, switch, interrupted) -> None:
    """Add the auto choice to the stats; fold the observed acceptance into the running
    factor (lookahead phase only)."""
    out.stats["config"]["lookahead_auto"] = {
        **choice.describe(),
        "switched_to_plain_after_steps": switch.after_steps,
    }
    if spec.lookahead is not None and not interrupted:
        hist = switch.lookahead_hist
        if hist is None:
            hist = multihost.local_rows(state.accept_hist)
        autotune.record_acceptance(
            model, spec.lookahead, *_hist_compression(hist), sampling=spec.sampling
        )


def _choose_auto(model: Model, sampling: SamplingConfig) -> autotune.Choice:
    """The auto choice; with several processes, process 0's (the cost curves may differ)."""
    choice = autotune.choose(model, max_step_tokens(model.cfg), sampling)
    if multihost.is_multiprocess():
        from jax.experimental import multihost_utils

        keys = [None, *autotune.PRIORS]
        index = keys.index(None if choice.config is None else choice.config.key)
        index = int(multihost_utils.broadcast_one_to_all(np.int32(index)))
        config = None if keys[index] is None else LookaheadConfig.for_budget(keys[index])
        choice = dataclasses.replace(choice, config=config)
    return choice


def _hist_compression(hist) -> tuple[float, int]:
    """(tokens per step, steps) from an accepted-length histogram [B, C]."""
    counts = np.asarray(hist).sum(0)
    steps = int(counts.sum())
    return (float((counts * np.arange(1, len(counts) + 1)).sum()) / max(steps, 1), steps)


class _Switch:
    """Calls off a losing lookahead (see autotune.Guard) and hands over to plain decoding."""

    def __init__(self, guard, plain_executable):
        self.guard, self.plain_executable = guard, plain_executable
        self.compile_s = 0.0
        self.after_steps = None
        self.lookahead_hist = None  # the lookahead phase's accepted-length histogram
        self.last_steps = 0

    def check(self, state):
        """None to carry on, or (plain executable, plain state) to switch."""
        if self.guard is None or self.after_steps is not None:
            return None
        steps = int(multihost.local_rows(state.steps).max())
        if steps - self.last_steps < self.guard.window_steps:
            return None
        # the lookahead phase's compression so far, not the last window's: acceptance
        # comes in bursts, and one dry window of 32 steps must not end a winning run
        hist = multihost.local_rows(state.accept_hist)
        compression, _ = _hist_compression(hist)
        self.last_steps = steps
        if self.guard.keep_going(compression, steps):
            return None
        exe, self.compile_s = self.plain_executable()
        self.after_steps, self.lookahead_hist = steps, hist
        plain_state = dataclasses.replace(
            state,
            draft=None,
            accept_hist=jnp.zeros((state.accept_hist.shape[0], 1), jnp.int32),
        )
        return exe, plain_state


def _device_loop(
    model: Model, exe, state: DecodeState, steps_per_call: int, switch: _Switch
) -> DecodeState:
    try:
        while True:
            state = exe(model.params, state, jnp.int32(steps_per_call))
            if multihost.all_true(state.done):
                return state
            if (swapped := switch.check(state)) is not None:
                exe, state = swapped
    except KeyboardInterrupt as e:
        e.state = state  # the last completed state: nothing half-done
        raise


def _host_loop(model: Model, exe, state: DecodeState, stream, switch: _Switch) -> DecodeState:
    prompt_len = multihost.local_rows(state.prompt_len)
    sent = np.zeros_like(prompt_len)

    def flush(state):
        n_out = multihost.local_rows(state.n_out)
        if (n_out > sent).any():
            tokens = multihost.local_rows(state.tokens)
            new = [
                tokens[b, prompt_len[b] + sent[b] : prompt_len[b] + n_out[b]].tolist()
                for b in range(len(n_out))
            ]
            sent[:] = n_out
            stream(new)

    try:
        flush(state)
        while not multihost.all_true(state.done):
            state = exe(model.params, state)
            flush(state)
            if (swapped := switch.check(state)) is not None:
                exe, state = swapped
        return state
    except KeyboardInterrupt as e:
        e.state = state
        raise


def _output(
    model, spec, state, prefill_s, decode_s, compile_s, interrupted, lookahead_hist=None
) -> GenerationOutput:
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
    steps = steps.tolist()
    token_ids = [
        tokens[b, prompt_len[b] : prompt_len[b] + n_out[b]].tolist() for b in range(len(n_out))
    ]
    step_of_token = [
        step_of[b, prompt_len[b] : prompt_len[b] + n_out[b]].tolist() for b in range(len(n_out))
    ]
    texts = None
    if model.tokenizer is not None:
        texts = [model.tokenizer.decode(t) for t in token_ids]
    new_tokens = int(n_out.sum())
    total_steps = int(sum(steps))
    if lookahead_hist is not None:  # lookahead, then plain after a switch
        hist = np.asarray(lookahead_hist).copy()
        hist[:, 0] += multihost.local_rows(state.accept_hist)[:, 0]
    hist = hist.sum(0).tolist()  # steps that emitted 1..N tokens
    stats = {
        "new_tokens": new_tokens,
        "steps": total_steps,
        # new tokens per forward pass after the prefill (the prefill's token counts too)
        "compression": new_tokens / max(total_steps, 1),
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "compile_s": compile_s,
        "tokens_per_s": new_tokens / (prefill_s + decode_s) if new_tokens else 0.0,
        "step_ms": 1000 * decode_s / max(max(steps, default=0), 1),
        "accepted_hist": {str(i + 1): int(c) for i, c in enumerate(hist)},
        "batch": len(n_out),
        "interrupted": interrupted,
        "config": {
            "lookahead": None if spec.lookahead is None else spec.lookahead.describe(),
            "dtype": str(jnp.dtype(model.dtype)),
            **spec.sampling.describe(),
        },
    }
    if state.draft is not None:
        from lookahead_jax.lookahead import SOURCES

        paths = multihost.local_rows(state.draft.paths_by_source).sum(0).tolist()
        accepted = multihost.local_rows(state.draft.tokens_by_source).sum(0).tolist()
        stats["sources"] = {
            name: {"paths": int(p), "tokens": int(t)}
            for name, p, t in zip(SOURCES, paths, accepted, strict=True)
        }
    return GenerationOutput(
        token_ids=token_ids, texts=texts, steps=steps, stats=stats, step_of_token=step_of_token
    )
