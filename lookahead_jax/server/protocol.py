"""The OpenAI API's request and response shapes the server speaks: pydantic request models
(an unknown field is an error that names it), the error object, and the JSON of
completions, chat completions, their streamed chunks and usage.

What is accepted: a completion's `prompt` as one text, one token-id list, or a list of
either; `n` choices per prompt (1..MAX_CHOICES; choice i of a request is
prompt i // n, sampled with seed + i); `logprobs` (completions: 0..MAX_LOGPROBS
alternatives; chat: `logprobs` + `top_logprobs`), the new tokens' logprobs under the
model (server/logprobs.py); `echo` (completions), the prompt before the new text, and
with `logprobs` the prompt tokens' logprobs (the first one's null), `max_tokens` 0
allowed; `top_k` is an extension (as vLLM's); `seed` makes a sampled request exactly reproducible
(docs/serving.md). A request without `temperature` samples at 1.0,
as OpenAI's API does.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# strict: "16" is not a number nor "yes" a bool (a JSON int is still a float)
STRICT = ConfigDict(extra="forbid", strict=True)
INT64 = 2**63  # OpenAI's seed is an int64
INT32 = 2**31
MAX_CHOICES = 128  # prompts x n of one request: each is an engine request
# OpenAI's API takes 4; evaluation harnesses send a task's `until` list and the EOS's
# text (lm-eval's generate_until), often more
MAX_STOPS = 16
MAX_LOGPROBS = 20  # alternatives a token (OpenAI's limit; the engine's max_logprobs)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """response_format's json_schema: the schema an answer is valid under."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = Field(min_length=1, max_length=64)
    schema_: dict = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # every answer is held to the schema, strict or not


JSON_OBJECT = {"type": "object"}  # response_format json_object's schema: any JSON object


class ResponseFormat(BaseModel):
    """OpenAI's response_format: "text" (none), "json_schema" (structured output: the
    engine's grammar, lookahead_jax/grammar) or "json_object" (any JSON object: the schema
    JSON_OBJECT, objects nested up to outlines-core's depth)."""

    model_config = STRICT
    type: str
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _known(self):
        if self.type not in ("text", "json_schema", "json_object"):
            raise ValueError(
                f'type must be "text", "json_schema" or "json_object", got {self.type!r}'
            )
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('"json_schema" goes with type "json_schema", and only with it')
        return self


class _Sampling(BaseModel):
    """The fields completions and chat completions share."""

    model_config = STRICT

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, lt=INT32)
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    user: str | None = None  # accepted and ignored, as a tag for the caller's records
    response_format: ResponseFormat | None = None
    # accepted at their neutral values only
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _neutral(cls, v):
        if v != 0:
            raise ValueError("penalties are not supported (they would change the model's tokens)")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return tuple(stops)

    def stops(self) -> tuple[str, ...]:
        return tuple(self.stop or ())

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def json_schema(self) -> dict | None:
        """The schema response_format holds the answer to (None: free text)."""
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            return JSON_OBJECT
        return None if fmt is None or fmt.json_schema is None else fmt.json_schema.schema_


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=COMPLETIONS_DEFAULT_MAX_TOKENS, ge=0)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def alternatives(self) -> int | None:
        """Alternatives a token with its logprob (None: no logprobs)."""
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, v):
        """One prompt (a text or a token-id list) or a list of them, as a list."""
        if isinstance(v, str) or (isinstance(v, list) and v and isinstance(v[0], int)):
            v = [v]
        if not v:
            raise ValueError("the prompt is empty")
        if any(not p for p in v):
            raise ValueError("a prompt is empty")
        return v

    def prompts(self) -> list:
        """The prompts, each a text or a token-id list."""
        return list(self.prompt)

    @model_validator(mode="after")
    def _nothing_needs_echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 needs echo: true (the prompt's logprobs)")
        return self

    def new_tokens(self) -> int:
        """max_tokens; null: OpenAI's default."""
        return COMPLETIONS_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    def prompt_alternatives(self) -> int | None:
        """Alternatives a prompt token with its logprob (echo with logprobs; with
        max_tokens 0 always: such a request exists for its prompt's)."""
        if not self.echo:
            return None
        if self.logprobs is not None:
            return self.logprobs
        return 0 if self.new_tokens() == 0 else None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        if v:
            raise ValueError("suffix is not supported")
        return v


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict]
    name: str | None = None

    def text(self) -> str:
        """The content as text (OpenAI's content parts: text parts only)."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def alternatives(self) -> int | None:
        """Alternatives a token with its logprob (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


# ---------------------------------------------------------------------- responses


def error_body(message: str, type_: str = "invalid_request_error", param=None, code=None):
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"


def finish_reason(finish: str) -> str:
    """The engine's finish ("eos", "stop", "length") as OpenAI's finish_reason."""
    return "length" if finish == "length" else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Reply:
    """The JSON of one request's answer, whole or in chunks: `chat` says which API."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, chunk: bool) -> dict:
        obj = "chat.completion.chunk" if chunk and self.chat else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, choices: list, prompt_tokens: int, completion_tokens: int):
        """The whole answer; `choices`: (text, finish, logprobs JSON or None) per choice,
        in index order."""
        out = []
        for index, (text, finish, logprobs) in enumerate(choices):
            if self.chat:
                choice = {"index": index, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": index, "text": text}
            choice["logprobs"] = logprobs
            choice["finish_reason"] = finish_reason(finish)
            out.append(choice)
        return {
            **self._head(False),
            "choices": out,
            "usage": usage(prompt_tokens, completion_tokens),
        }

    def chunk(
        self,
        text: str,
        finish: str | None = None,
        first: bool = False,
        index: int = 0,
        logprobs: dict | None = None,
    ) -> dict:
        """One streamed chunk of choice `index` (logprobs: of the tokens it brings)."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            if finish is not None and not text:
                delta = {}
            choice = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text}
        choice["logprobs"] = logprobs
        choice["finish_reason"] = None if finish is None else finish_reason(finish)
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._head(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
