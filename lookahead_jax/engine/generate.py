"""`lj.generate`: prompts in, tokens and stats out — plain or lookahead, greedy or sampled.

A batch of prompts is one offline run of the engine (continuous.py) with a slot per
prompt: the engine's host loop, programs, auto policy and stats, driven here round by
round so that `stream` hears every step and Ctrl-C returns what was decoded so far.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from lookahead_jax.distributed import multihost
from lookahead_jax.engine import inputs
from lookahead_jax.engine.continuous import Engine
from lookahead_jax.engine.requests import Request, TokenLogprob
from lookahead_jax.engine.stats import Stats
from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.lookahead_config import LookaheadConfig


@dataclasses.dataclass
class GenerationOutput:
    token_ids: list[list[int]]  # new tokens per row, cut at EOS (EOS not included)
    texts: list[str] | None  # decoded token_ids (None without a tokenizer)
    steps: list[int]  # forward passes per row after prefill
    stats: Stats
    step_of_token: list[list[int]]  # per new token: the step that emitted it (0 = prefill)
    # per new token: its logprob and top alternatives (with `logprobs`; else None)
    logprobs: list[list[TokenLogprob]] | None = None


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
    logprobs: int | None = None,
    json_schema=None,
    regex: str | None = None,
) -> GenerationOutput:
    """Generate up to `max_new_tokens` new tokens for each prompt (a batch).

    model: from lj.load or lj.from_nnx.
    prompts: list of strings (tokenised, with the chat template if `chat`) or of
        token-id lists; a single string is a batch of one.
    lookahead: "auto" (the default, as lj.Engine's and the CLI's: choose the layout for
        this machine and batch, and switch to plain decoding where lookahead loses), a
        LookaheadConfig (e.g. LookaheadConfig.for_tokens(16)), or None for plain
        decoding.
    temperature 0 (or top_k=1) is greedy; otherwise sampling with top_k / top_p,
        reproducible from `seed` (row b uses fold_in(seed, b)).
    stream: if given, `stream(new)` is called after the prefill and after every step
        with each row's newly emitted token ids.
    steps_per_call: without `stream`, the device loop returns to the host every this
        many steps (to notice Ctrl-C); None: only when auto checks its choice, or once.
    logprobs: keep each new token's logprob under the model (its raw logits:
        decoding/logprobs.py) and this many most likely alternatives
        (GenerationOutput.logprobs); None: none. Under a grammar, the logprobs of the
        masked distribution the tokens were chosen from.
    json_schema / regex: structured output (lookahead_jax/grammar): every prompt's answer
        is JSON valid under the schema (a dict, a JSON string or a pydantic model class),
        or matches the regex, once it ends with EOS (an answer cut by max_new_tokens is a
        prefix of one). Each token is chosen from the logits masked by the grammar, in
        plain and lookahead decoding alike: the same tokens either way.

    With several processes (multihost.initialize), each passes its own rows and gets
    them back: together they are one batch, process p's rows after process p - 1's.

    Raises UserInputError (a ValueError) on bad arguments; GenerationInterrupted
    (a KeyboardInterrupt carrying the partial output) on Ctrl-C.
    """
    # what the prompts' encoding needs first (the engine checks the rest: each prompt
    # with its max_new_tokens, requests.encode, before anything runs)
    inputs.check_max_new_tokens(max_new_tokens)
    bad = isinstance(logprobs, bool) or not isinstance(logprobs, int | type(None))
    if bad or (logprobs is not None and logprobs < 0):
        raise UserInputError(f"logprobs must be None or an integer >= 0, got {logprobs!r}")
    inputs.check_model(model)
    local = inputs.encode_prompts(model, prompts, chat)
    multihost.agree(max_new_tokens, "max_new_tokens")
    ids, first_row = multihost.every_process_rows(local)
    engine = Engine(
        model,
        batch=len(ids),
        max_new_tokens=max_new_tokens,
        lookahead=lookahead,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        steps_per_call=steps_per_call,
        max_prompt_tokens=max(len(p) for p in ids),
        stream_steps=1,
        max_logprobs=logprobs,
    )
    mine = slice(first_row, first_row + len(local))
    on_round = None
    if stream is not None:

        def on_round(new: list[list[int]]) -> None:
            if any(new[mine]):
                stream(new[mine])

    grammar = dict(json_schema=json_schema, regex=regex)
    requests = [Request(p, logprobs=logprobs, **grammar) for p in ids]
    results, interrupted = engine.run_batch(requests, on_round)
    out = _output(model, engine.stats, results[mine])
    if interrupted:
        raise GenerationInterrupted(out)
    return out


def _output(model, stats: Stats, results) -> GenerationOutput:
    """This process's rows of a finished or interrupted run, in prompt order. The stats
    are the whole batch's; with several processes, process_new_tokens / process_row_steps
    are this process's rows'."""
    steps = [r.steps for r in results]
    stats.count_process(sum(len(r.token_ids) for r in results), sum(steps), max(steps, default=0))
    return GenerationOutput(
        token_ids=[r.token_ids for r in results],
        texts=None if model.tokenizer is None else [r.text for r in results],
        steps=steps,
        stats=stats,
        step_of_token=[r.step_of_token for r in results],
        logprobs=None if results and results[0].logprobs is None else [r.logprobs for r in results],
    )
