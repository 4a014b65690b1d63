"""What goes into a decode: prompts (text or token ids) encoded and checked, the token
budget checked against the model's context, and the buckets that pad their shapes.

Prompts are right-padded to a bucket length (powers of two from 16) and the token
budget is rounded up to a power of two, so a new prompt length rarely means a new
compilation. A prefill runs its prompts at a finer side (`prefill_side`: quarter steps
above 64), so that less of it is padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.lookahead_config import LookaheadConfig
from lookahead_jax.models import seam

MIN_PROMPT_BUCKET = 16


def bucket(n: int, minimum: int = MIN_PROMPT_BUCKET) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


def prefill_side(n: int) -> int:
    """The side a prefill of a prompt (or suffix) of n tokens runs at: its bucket up to 64,
    then quarter steps of its octave (65..80 -> 80, 81..96 -> 96, ..., 129..160 -> 160,
    257..320 -> 320): at most a quarter of the octave padded (~7 % on average), where its
    power of two pads up to half; four sides an octave, so few programs, each a multiple
    of 16 (the prefix cache's block). Never more than bucket(n)."""
    top = bucket(n)
    if top <= 64:
        return top
    step = top // 8
    return -(-n // step) * step


def offline_order(requests: list, lm) -> list:
    """The order an offline run takes its requests (Encoded) in; its state's prompt side
    P is the first one's bucket. Where `lm` reads each row's cache only as far as the row
    goes (seam.reads_cache_by_row: on a CPU), longest first: P then holds the whole run,
    so its loops and prefill programs compile for one S (a state grown for a longer
    bucket needs every one of them again), and the admissions after the first, a row or
    two as slots free, are the shortest prompts, which pad least at the shapes compiled.
    Elsewhere (each step reads the whole S), shortest bucket first, the state growing per
    bucket, so that short prompts decode at a short S. Ties keep arrival order.

    Measured on a 2-core AMD EPYC (Zen 4), shortest bucket first against longest first:
    the dataset command, cold, 100 MT-bench and code prompts at --batch 16: 108-112 s
    against 63-65 s, 29 against 7 s of it compiling (benchmarks/cpu/dataset_cli_cold_s78.md);
    lj.Engine on the 20 code prompts at 16 slots: 16 % against 10 % of the prefilled
    positions padding (engine_code_b16_epyc_s78_longest.md)."""
    if seam.reads_cache_by_row(lm):
        return sorted(requests, key=lambda r: -len(r.ids))
    return sorted(requests, key=lambda r: bucket(len(r.ids)))


def check_model(model) -> None:
    """An lj.Model (lj.load, lj.from_nnx) whose forward keeps the seam's contract."""
    if not hasattr(model, "lm") or not hasattr(model, "params"):
        raise UserInputError(
            f"model must be an lj.Model (from lj.load or lj.from_nnx), got {type(model).__name__}"
        )
    seam.check_model(model.lm)


def check_lookahead(lookahead, max_context: int | None) -> None:
    """A LookaheadConfig whose step fits the model's context (None: not checked), "auto"
    or None."""
    if lookahead not in (None, "auto") and not isinstance(lookahead, LookaheadConfig):
        raise UserInputError(
            "lookahead must be a LookaheadConfig (e.g. LookaheadConfig.for_tokens(16)), "
            f"'auto' or None, got {lookahead!r}"
        )
    if isinstance(lookahead, LookaheadConfig) and max_context is not None:
        lookahead.check_fits(max_context)


def check_max_new_tokens(max_new_tokens, least: int = 1) -> None:
    """An integer >= least (0: a request that asks only its prompt's logprobs)."""
    bound = "> 0" if least == 1 else f">= {least}"
    what = f"${{max_new_tokens}} must be an integer {bound}"
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
        raise UserInputError(f"{what}, got {max_new_tokens!r}")
    if max_new_tokens < least:
        raise UserInputError(f"{what}, got {max_new_tokens}")


def check_budget(max_context: int, max_new_tokens: int) -> None:
    """Refuse a token budget that leaves no room for even a one-token prompt (checkable
    before any prompt is tokenized; `check_context` is the full check)."""
    if max_new_tokens >= max_context:
        raise UserInputError(
            f"${{max_new_tokens}} = {max_new_tokens} does not fit the model's context of "
            f"{max_context} tokens with any prompt; it can be at most "
            f"{max_context - 1} (less the prompt's length)"
        )


def check_context(max_context: int, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a prompt + token budget that does not fit in the model's context."""
    if prompt_tokens + max_new_tokens > max_context:
        room = max_context - prompt_tokens
        hint = (
            f"${{max_new_tokens}} can be at most {room} for this prompt"
            if room > 0
            else "the prompt alone fills it; shorten the prompt"
        )
        raise UserInputError(
            f"prompt ({prompt_tokens} tokens) + ${{max_new_tokens}} = {max_new_tokens} exceeds the "
            f"model's context of {max_context} tokens; {hint}"
        )


def encode_prompts(model, prompts, chat: bool) -> list[list[int]]:
    """Token ids per prompt: strings through the model's tokenizer (with the chat template
    if `chat`), token-id lists as they are; each checked against the vocabulary."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise UserInputError("prompts must be a non-empty list of strings or of token-id lists")
    return [
        encode_prompt(model.tokenizer, model.lm.vocab_size, p, chat, f"prompt {i}")
        for i, p in enumerate(prompts)
    ]


def encode_prompt(
    tokenizer, vocab: int, prompt, chat: bool, what: str, allow_blank: bool = False
) -> list[int]:
    """One prompt's token ids: a string through `tokenizer` (with the chat template if
    `chat`), a list of chat messages ({"role", "content"} dicts) through the chat
    template, or token ids as they are; checked against the vocabulary [0, vocab).
    `what` names the prompt in errors. A string of only whitespace is refused (likely a
    mistake: an empty prompt file) unless `allow_blank` (the server: OpenAI's API takes
    one)."""
    is_messages = isinstance(prompt, list | tuple) and bool(prompt) and isinstance(prompt[0], dict)
    if isinstance(prompt, str) or is_messages:
        if tokenizer is None:
            raise UserInputError("this checkpoint has no tokenizer; pass token ids")
        if isinstance(prompt, str) and not prompt.strip() and not (allow_blank and prompt):
            raise UserInputError(f"{what} is empty")
        if is_messages:
            text = tokenizer.apply_chat_template(list(prompt))
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode_prompt(prompt, chat)
    else:
        if chat:
            raise UserInputError("chat=True needs text prompts, not token ids")
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise UserInputError(
                f"{what} must be a string, a list of chat messages or a list of token ids"
            ) from None
    if not ids:
        raise UserInputError(f"{what} encodes to no tokens")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise UserInputError(f"{what} has token ids outside [0, {vocab}): {bad[:5]}")
    return ids
