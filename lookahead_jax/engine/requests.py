"""What a request to the engine is and what comes back: `Request` in, `Update`s while it
decodes, its `Result` at the end; and the one check and encoding of a request
(`encode`), which the engine, `lj.generate`, the CLI and the server all go through.

A request's sampling noise is keyed by fold_in(PRNGKey(seed), key): its own `seed` with
key 0 (a lone `lj.generate` row's), else the engine's seed with key = `prompt_key(id)`;
never by the slot it lands in (continuous.py's docstring: exactness).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Callable, Iterable

import numpy as np

from lookahead_jax import grammar
from lookahead_jax.decoding.sampling import SamplingConfig
from lookahead_jax.distributed import multihost
from lookahead_jax.engine import inputs
from lookahead_jax.engine.grammar_bank import chains_of
from lookahead_jax.errors import UserInputError
from lookahead_jax.grammar import TokenAutomaton

FINISHES = ("eos", "length", "stop", "cancelled", "error", "interrupted")


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt for the engine. Unset settings take the engine's."""

    prompt: object  # text, a list of chat messages ({"role", "content"}), or token ids
    id: int | str | None = None  # default: the prompt's index in the run (online: a count)
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    # this request's own noise: fold_in(PRNGKey(seed), 0), a lone decode's row 0 (so the
    # tokens equal lj.generate([prompt], seed=seed)'s); None: the engine's seed and the id
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one found
    # each new token's logprob and this many most likely alternatives (0..the engine's
    # max_logprobs; decoding/logprobs.py: the model's raw distribution); None: none
    logprobs: int | None = None
    # the same for the prompt's tokens (Result.prompt_logprobs); with them max_new_tokens
    # may be 0 (a prompt scored, nothing generated)
    prompt_logprobs: int | None = None
    # structured output: the answer is JSON valid under this schema (a dict, a JSON string
    # or a pydantic model class; grammar/json_schema.py says which keywords), or matches
    # this regex, whole, when it ends with EOS (one of the two, or neither)
    json_schema: object = None
    regex: str | None = None


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A token's logprob under the model given the tokens before it (raw logits:
    decoding/logprobs.py) and the most likely tokens at its position as (token id,
    logprob), most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass
class Result:
    id: int | str
    token_ids: list[int]  # new tokens, cut at EOS (EOS not included) or at a stop string
    text: str | None  # decoded token_ids, cut before a stop string (None without a tokenizer)
    finish: str  # FINISHES: "eos", "length", "stop", "cancelled", "error" or "interrupted"
    prompt_tokens: int
    steps: int  # forward passes after its prefill
    time_s: float  # wall time from its insert to its result
    error: str | None = None  # finish "error": what failed
    step_of_token: list[int] = dataclasses.field(default_factory=list)  # per token in
    # token_ids: the step that emitted it (0 = the prefill)
    logprobs: list[TokenLogprob] | None = None  # per token in token_ids, if it asked
    # per prompt token, if it asked: the first is None (it follows nothing)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # finish "eos" with logprobs asked: (the EOS token's id, its logprob) — not in
    # token_ids, but OpenAI-style APIs list it with the tokens' logprobs
    eos: tuple[int, TokenLogprob] | None = None


@dataclasses.dataclass
class Update:
    """What a request's listener gets after a round: the tokens committed since its last
    update (possibly none) and, with the last update, its Result."""

    id: int | str
    token_ids: list[int]
    result: Result | None = None
    logprobs: list[TokenLogprob] | None = None  # per token in token_ids, if it asked
    # the prompt's, if it asked, with the request's first update that has tokens or its
    # result (Result.prompt_logprobs)
    prompt_logprobs: list[TokenLogprob | None] | None = None


Listener = Callable[[Update], None]


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A checked request as the scheduler queues it: token ids and settings resolved."""

    id: int | str
    ids: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    seed: int  # the row key is fold_in(PRNGKey(seed), key)
    key: int
    stop: tuple[str, ...] = ()
    listener: Listener | None = dataclasses.field(default=None, compare=False)
    streams: bool = False  # its listener wants tokens as they come (rounds of stream_steps)
    logprobs: int | None = None  # alternatives a token (Request.logprobs)
    prompt_logprobs: int | None = None  # alternatives a prompt token
    grammar: TokenAutomaton | None = dataclasses.field(default=None, compare=False)  # its
    # json_schema or regex, compiled (lookahead_jax/grammar)


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The engine's settings a request falls back on, and the limit it sets on prompts."""

    max_new_tokens: int
    sampling: SamplingConfig
    seed: int
    chat: bool
    max_prompt_tokens: int | None = None
    max_logprobs: int | None = None  # the most alternatives a request may ask (None: no logprobs)


def prompt_key(prompt_id) -> int:
    """The uint32 that keys a prompt's sampling noise: an integer id in [0, 2**32) is its
    own key (so `lj.generate`'s row b and the engine's prompt b get the same noise),
    any other id the first 4 bytes of the SHA-256 of its type and text (so "7" and 7 differ;
    a string can still share a key with some integer id, 1 in 2**32)."""
    is_int = isinstance(prompt_id, int | np.integer) and not isinstance(prompt_id, bool)
    if is_int and 0 <= prompt_id < 2**32:
        return int(prompt_id)
    digest = hashlib.sha256(f"{type(prompt_id).__name__}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@contextlib.contextmanager
def _about(field: str | None, request: str | None = None):
    """Name `field` on a UserInputError raised inside (unless it names one already), and
    `request` in its ${request} slot (errors.py)."""
    try:
        yield
    except UserInputError as e:
        if e.field is None:
            e.field = field
        if request is not None:
            e.values.setdefault("request", request)
        raise


def encode(model, defaults: Defaults, r: Request, pid, listener=None, stream=False) -> Encoded:
    """One request encoded and checked — the one check of a request, whoever sends it
    (Engine.run / run_batch / submit, lj.generate, the CLI, the server): its id; its
    prompt (within the engine's max_prompt_tokens); prompt + max_new_tokens within the
    model's context; seed; stop strings; logprobs. Bad input raises UserInputError naming the
    prompt, with `field` set to the request field it is about."""
    with _about(None, request=f"prompt {pid!r}"):  # the ${request} of every error below
        return _encode(model, defaults, r, pid, listener, stream)


def _encode(model, defaults: Defaults, r: Request, pid, listener, stream) -> Encoded:
    what = "${request}"
    if isinstance(pid, np.integer):
        pid = int(pid)
    if not isinstance(pid, int | str) or isinstance(pid, bool):
        raise UserInputError(f"{what}: an id must be an integer or a string", "id")
    with _about("prompt"):
        ids = inputs.encode_prompt(
            model.tokenizer, model.lm.vocab_size, r.prompt, defaults.chat, what
        )
    limit = defaults.max_prompt_tokens
    if limit is not None and len(ids) > limit:
        raise UserInputError(
            f"{what} has {len(ids)} tokens, more than ${{max_prompt_tokens}} ({limit}); "
            f"raise it to {len(ids)}, or shorten the prompt",
            "prompt",
        )
    max_new_tokens = defaults.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
    with _about("max_new_tokens"):
        inputs.check_max_new_tokens(max_new_tokens, 0 if r.prompt_logprobs is not None else 1)
        inputs.check_context(model.lm.max_context, len(ids), max_new_tokens)
    base = defaults.sampling
    sampling = SamplingConfig(
        base.temperature if r.temperature is None else float(r.temperature),
        base.top_k if r.top_k is None else r.top_k,
        base.top_p if r.top_p is None else r.top_p,
    )
    seed_ok = isinstance(r.seed, int) and not isinstance(r.seed, bool)
    if r.seed is not None and not (seed_ok and -(2**63) <= r.seed < 2**63):
        raise UserInputError(f"{what}: seed must be a 64-bit integer, got {r.seed!r}", "seed")
    stop = (r.stop,) if isinstance(r.stop, str) else tuple(r.stop)
    if any(not isinstance(s, str) or not s for s in stop):
        raise UserInputError(f"{what}: stop strings must be non-empty strings", "stop")
    if stop and model.tokenizer is None:
        raise UserInputError(f"{what}: stop strings need a tokenizer", "stop")
    for name in ("logprobs", "prompt_logprobs"):
        _check_logprobs(what, name, getattr(r, name), defaults.max_logprobs)
    seed, key = (defaults.seed, prompt_key(pid)) if r.seed is None else (r.seed, 0)
    automaton = _grammar(model, r, what)
    return Encoded(
        id=pid,
        ids=ids,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        key=key,
        stop=stop,
        listener=listener,
        streams=stream,
        logprobs=r.logprobs,
        prompt_logprobs=r.prompt_logprobs,
        grammar=automaton,
    )


def _grammar(model, r: Request, what: str) -> TokenAutomaton | None:
    """The request's json_schema or regex as an automaton over the model's tokens, its
    fixed-text guesses made with it (grammar_bank.chains_of; their time in compile_s)."""
    if r.json_schema is None and r.regex is None:
        return None
    field = "json_schema" if r.json_schema is not None else "regex"
    if r.json_schema is not None and r.regex is not None:
        raise UserInputError(f"{what}: give json_schema or regex, not both", field)
    if model.tokenizer is None:
        raise UserInputError(f"{what}: a {field} needs the model's tokenizer", field)
    vocab = (model.tokenizer.token_bytes(), tuple(model.eos_ids), model.lm.vocab_size)
    try:
        if r.json_schema is not None:
            automaton = grammar.from_json_schema(r.json_schema, *vocab)
        else:
            automaton = grammar.from_regex(r.regex, *vocab)
    except UserInputError as e:
        raise UserInputError(f"{what}: {e}", field) from None
    _, chains_s = chains_of(automaton, model.tokenizer)
    if not chains_s:
        return automaton
    return dataclasses.replace(automaton, compile_s=automaton.compile_s + chains_s)


def _check_logprobs(what: str, name: str, value, limit: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise UserInputError(
            f"{what}: {name} must be an integer >= 0 (alternatives per token), got {value!r}",
            name,
        )
    if limit is None:
        raise UserInputError(f"{what}: this engine keeps no logprobs (max_logprobs None)", name)
    if value > limit:
        raise UserInputError(
            f"{what}: {name} {value} is more than this engine's max_logprobs ({limit})", name
        )


def encode_all(model, defaults: Defaults, prompts: Iterable) -> list[Encoded]:
    """Every prompt of an offline run (text, chat messages, token ids or Request; id: its
    index unless it has one) encoded and checked, ids unique; with several processes,
    checked to be the same prompts in the same order in all (they run the same rounds)."""
    out, seen = [], set()
    for i, p in enumerate(prompts):
        r = p if isinstance(p, Request) else Request(p)
        pid = i if r.id is None else r.id
        if pid in seen:
            raise UserInputError(
                "${request}: the id is used twice", "id", request=f"prompt {pid!r}"
            )
        seen.add(pid)
        out.append(encode(model, defaults, r, pid))
    if not out:
        raise UserInputError("no prompts to decode")
    if multihost.is_multiprocess():
        blob = repr(
            [
                (r.id, r.ids, r.max_new_tokens, r.sampling, r.stop, r.logprobs, r.prompt_logprobs)
                for r in out
            ]
        )
        blob = blob.encode()
        digest = int.from_bytes(hashlib.sha256(blob).digest()[:4], "little") >> 1  # int32
        multihost.agree(digest, "prompts (all of them, in the same order)")
    return out
