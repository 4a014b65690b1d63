"""The engine's settings, checked once: `lj.Engine(model, **settings)` builds one, and the
command line builds the same from its flags before any weights load (cli/generate.py,
cli/serve.py), so a bad value gets the same refusal from the library, the dataset command
and the server, from one rule here.

    config = EngineConfig(batch=16, max_new_tokens=128, prefix_cache_mb=256)
    config.check_context(info.cfg.max_position_embeddings)   # what needs the checkpoint
    engine = lj.Engine(model, config)                         # or lj.Engine(model, batch=16, ...)

What each setting does: EngineConfig's docstring. Errors name the keyword and its
command-line flag (`batch (--batch) must be ...`).
"""

from __future__ import annotations

import dataclasses
import math

from lookahead_jax.decoding.sampling import SamplingConfig
from lookahead_jax.engine import inputs
from lookahead_jax.engine.prefix_cache import BLOCK
from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.lookahead_config import LookaheadConfig

DEFAULT_BATCH = 8  # slots (the server's and the dataset command's --batch default too)
# --prefix-cache-mb of the server and the dataset command (the library: off): SmolLM2-135M
# float32 keeps 46 KB a token, so 256 MB hold ~5,700 prompt tokens (a 7B model in
# bfloat16: ~500)
DEFAULT_PREFIX_CACHE_MB = 256
MAX_GRAMMAR_STATES = 65_536  # an online grammar table's states (4 KiB each: 256 MiB)


# the settings the command line sets by a flag of the same name (--batch, ...)
FLAGGED = {
    "batch", "max_new_tokens", "steps_per_call", "stream_steps", "max_prompt_tokens",
    "prefix_cache_mb", "prefill_chunk", "shared_guesses", "row_buckets", "grammar_states",
}  # fmt: skip


def _named(name: str) -> str:
    """A setting as its messages name it: the keyword, and its flag where it has one."""
    return f"{name} (--{name.replace('_', '-')})" if name in FLAGGED else name


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(name: str, value, least: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _integer(value) or value < least:
        raise UserInputError(f"{_named(name)} must be an integer >= {least}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """lj.Engine's settings, validated on creation; `check_context` adds what needs the
    model's context length.

    batch: the slots, requests decoded at once (a finished slot takes the next one).
    lookahead: a LookaheadConfig, "auto" or None (plain). "auto" offline: a layout chosen
    for this batch size from a cost curve measured at it, called off mid-run if it does
    not pay; online: a layout chosen for one row (at `temperature`), and each round runs it or plain
    steps, whichever the live rows measure faster at their row bucket (round_choice.py).
    temperature / top_k / top_p / max_new_tokens: defaults for requests without their own.
    seed: prompt `id`'s noise is fold_in(PRNGKey(seed), prompt_key(id)).
    steps_per_call: the device loop returns to the host at least this often (progress,
    Ctrl-C) even when no slot finished; None: as often as auto checks its choice, else
    only when a slot finishes. stream_steps: as often while a request with a listener
    decodes (its tokens arrive every this many steps).
    max_prompt_tokens: fix the prompt side of the shapes (longer prompts are refused), so
    that runs over other prompts reuse the same compiled programs; default: each run
    sizes for its longest prompt. The budget side is max_new_tokens (offline, or a
    request's larger one), rounded up to a power of two; online requests may not ask for
    more than max_new_tokens.
    sampled: whether rows may sample (compiles the sampling code). Default: offline, if
    some request samples; online, always (any request may).
    prefix_cache_mb: keep prompts' K/V on the device, up to this many MB, so that a prompt
    that starts like an earlier one (a shared system prompt, a conversation's next turn)
    is prefilled only from where they part (prefix_cache.py); rows of one admission that
    share a prefix compute it once. None or 0: off. Kept across runs of this engine.
    prefill_chunk: with the prefix cache, a prompt longer than this many tokens (past its
    cached blocks) arriving while other rows decode is prefilled this many at a time
    between decode rounds, so that they keep their pace (and one prefilling alone whose
    one piece would run padded far past its length, at once); "auto": as many as this
    machine prefills in one round (measured in the run); None: in one piece.
    shared_guesses: the guess sources that keep an engine-wide memory (token recycling's
    tables, suffix match's text of earlier outputs) start each new row from what the rows
    before it left (decoding/guess_memory.py), so that a prompt asked again or a
    conversation's next turn is guessed from the earlier answers; tokens are unchanged
    (every guess is verified). Kept across runs.
    row_buckets: a round decodes the live slots only, gathered into the smallest row
    bucket (1, 2, 4, ... below `batch`, then `batch`) that holds them, so that few live
    requests decode at the rate of a small batch: True (compiling each bucket's loop as
    it is needed), "auto" (a bucket whose loop is compiled; a new one once the padding
    rows have cost as much as compiling it: engine/row_buckets.py) or False (every
    round steps all `batch` rows). Off on a mesh.
    max_logprobs: the most alternatives a request may ask with its tokens' logprobs
    (Request.logprobs; vLLM's default limit, 20); None: requests may not ask. The
    programs keep logprobs online always (computed in a step only when a row asks),
    offline when some request asks.
    grammar_states: online, the automaton states (all grammars in flight together, at most
    15 distinct ones) the engine's tables hold for requests with a json_schema or regex
    (grammar_bank.py: 4 KiB a state; a schema of a few properties makes 300-1,000, any
    JSON object 1,505 at SmolLM2's vocabulary); 0: online requests may not ask. At most
    MAX_GRAMMAR_STATES. Offline runs size their tables for their own requests.
    chat: text prompts go through the tokenizer's chat template (False: as they are, as
    vLLM's LLM.generate sends them; the command line's default is the template, where
    the tokenizer has one). Chat messages always do.
    """

    batch: int = DEFAULT_BATCH
    max_new_tokens: int = 256
    lookahead: LookaheadConfig | str | None = "auto"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    chat: bool = False
    steps_per_call: int | None = 64
    max_prompt_tokens: int | None = None
    stream_steps: int = 4
    sampled: bool | None = None
    max_logprobs: int | None = 20
    prefix_cache_mb: float | None = None
    prefill_chunk: int | str | None = "auto"
    shared_guesses: bool = False
    row_buckets: bool | str = "auto"
    grammar_states: int = 0

    def __post_init__(self):
        _at_least("batch", self.batch, 1)
        inputs.check_max_new_tokens(self.max_new_tokens)
        inputs.check_lookahead(self.lookahead, max_context=None)
        self.sampling  # noqa: B018  (SamplingConfig checks temperature, top_k, top_p)
        _at_least("steps_per_call", self.steps_per_call, 1, optional=True)
        _at_least("max_prompt_tokens", self.max_prompt_tokens, 1, optional=True)
        _at_least("stream_steps", self.stream_steps, 1)
        _at_least("max_logprobs", self.max_logprobs, 0, optional=True)
        _at_least("grammar_states", self.grammar_states, 0)
        if self.grammar_states > MAX_GRAMMAR_STATES:
            raise UserInputError(
                f"{_named('grammar_states')} must be at most {MAX_GRAMMAR_STATES} (4 KiB a "
                f"state: {MAX_GRAMMAR_STATES * 4 // 1024} MiB), got {self.grammar_states}"
            )
        mb = self.prefix_cache_mb
        if mb is not None and (
            isinstance(mb, bool) or not isinstance(mb, int | float) or not 0 <= mb < math.inf
        ):
            raise UserInputError(
                f"{_named('prefix_cache_mb')} must be a finite number >= 0, got {mb!r}"
            )
        chunk = self.prefill_chunk
        if chunk not in ("auto", None) and (not _integer(chunk) or chunk < BLOCK or chunk % BLOCK):
            raise UserInputError(
                f'{_named("prefill_chunk")} must be "auto", None (0 on the command line) or '
                f"a multiple of {BLOCK} tokens (a block), got {chunk!r}"
            )
        if not isinstance(self.shared_guesses, bool):
            raise UserInputError(
                f"{_named('shared_guesses')} must be True or False, got {self.shared_guesses!r}"
            )
        buckets = self.row_buckets
        if buckets not in (True, False, "auto") or not isinstance(buckets, bool | str):
            raise UserInputError(
                f'{_named("row_buckets")} must be True, False or "auto", got {buckets!r}'
            )

    @property
    def sampling(self) -> SamplingConfig:
        """The default sampling settings of requests without their own."""
        return SamplingConfig(float(self.temperature), self.top_k, self.top_p)

    def steps_per_round(self, streaming: bool, auto_steps: int | None, budget: int) -> int:
        """Steps one loop call may run: stream_steps while a request streams (`streaming`),
        else steps_per_call (None: `auto_steps`, auto's check window while it watches, else
        `budget`, the whole max_new_tokens)."""
        if streaming:
            return self.stream_steps
        if self.steps_per_call is not None:
            return self.steps_per_call
        return budget if auto_steps is None else auto_steps  # (Ctrl-C noticed as soon)

    def check_context(self, max_context: int) -> None:
        """What needs the model's context length (the checkpoint's config suffices, before
        the weights load): the lookahead step fits it, max_new_tokens leaves room for a
        prompt, and a prompt of max_prompt_tokens fits with max_new_tokens after it."""
        inputs.check_lookahead(self.lookahead, max_context)
        inputs.check_budget(max_context, self.max_new_tokens)
        if self.max_prompt_tokens is not None:
            inputs.check_context(max_context, self.max_prompt_tokens, self.max_new_tokens)
