"""The OpenAI-compatible HTTP API over the online engine (FastAPI).

    POST /v1/completions        prompt (text or token ids) -> text, streamed or whole
    POST /v1/chat/completions   messages through the chat template -> text
    GET  /v1/models, /health, /metrics

A request is checked whole before it is queued: bad JSON, an unknown field, a setting
out of range, another model's name, prompt + max_tokens past the context: 400 (404 for
the model) with OpenAI's error object naming the field; the server keeps serving. With
an API key, a missing or wrong `Authorization: Bearer` is 401; a full queue is 429.

Streaming: Server-Sent Events in OpenAI's chunk format, a chunk after each engine round
that committed tokens (one lookahead step can add several tokens to a chunk), text that
could start a stop string held back until it is known not to; then a chunk with the
finish_reason, the usage chunk when asked for, and `data: [DONE]`. A client that
disconnects cancels its request: its slot is free at the next round.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lookahead_jax.engine import inputs
from lookahead_jax.engine.requests import Request as EngineRequest
from lookahead_jax.errors import UserInputError
from lookahead_jax.server import protocol
from lookahead_jax.server.logprobs import LogprobsJson
from lookahead_jax.server.metrics import Metrics
from lookahead_jax.server.protocol import ChatCompletionRequest, CompletionRequest, Reply
from lookahead_jax.server.runner import Closed, EngineRunner, ShuttingDown
from lookahead_jax.server.streamed_choice import StreamedChoice, listed

DISCONNECT_POLL_S = 0.25  # how often a non-streamed request checks its client is there


class ApiError(Exception):
    def __init__(self, status: int, message: str, param=None, type_="invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_


def create_app(runner: EngineRunner, model_name: str, api_key: str | None = None) -> FastAPI:
    """The app for one model behind `runner` (its engine's model and limits)."""
    metrics = Metrics(runner.engine)
    app = FastAPI(title="lookahead_jax", docs_url=None, redoc_url=None)
    app.state.runner, app.state.metrics = runner, metrics
    _error_handlers(app, metrics)
    if api_key is not None:
        app.add_middleware(ApiKeyCheck, key=api_key, metrics=metrics)
    answers = Answers(runner, metrics, model_name)

    @app.get("/health")
    async def health():
        if runner.fatal or runner.stopping:
            return JSONResponse({"status": "unavailable", "reason": runner.fatal}, 503)
        return {"status": "ok", "decoding": runner.engine.decoding()}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.scrape(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "lookahead_jax"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(http: Request, body: CompletionRequest):
        return await answers.answer(http, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request, body: ChatCompletionRequest):
        return await answers.answer(http, body, chat=True)

    return app


def _error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """OpenAI's error object for an ApiError and for a body that fails validation (400
    naming the field)."""

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        metrics.requests.labels(request.url.path, str(e.status)).inc()
        return JSONResponse(protocol.error_body(e.message, e.type, e.param), e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {"msg": "invalid request", "loc": ()}
        loc = _field_path(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            message, param = f"the body is not valid JSON: {first.get('msg')}", None
        elif first.get("type") == "extra_forbidden":
            message, param = f"unknown field {'.'.join(loc)!r}", ".".join(loc) or None
        else:
            param = ".".join(loc) or None
            # a validator's ValueError comes as "Value error, <its message>": the message
            said = str(first.get("msg")).removeprefix("Value error, ")
            message = f"{param}: {said}" if param else said
        metrics.requests.labels(request.url.path, "400").inc()
        return JSONResponse(protocol.error_body(message, param=param), 400)


class Answers:
    """The completions endpoints: a request's body to an engine request, submitted, and
    its answer, whole or streamed."""

    def __init__(self, runner: EngineRunner, metrics: Metrics, model_name: str):
        self.runner, self.metrics, self.model_name = runner, metrics, model_name
        self.engine = runner.engine
        self.tokenizer = self.engine.model.tokenizer

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                404,
                f"the model {name!r} does not exist; this server has {self.model_name!r}",
                "model",
                "not_found_error",
            )

    def prompt_ids(self, prompt, field: str) -> list[int]:
        """One prompt (a text, token ids, or chat messages as dicts) as token ids, through
        the engine's one prompt encoder (engine/inputs.py; here a blank prompt is served,
        as OpenAI's API does); 400 naming the field when it cannot be."""
        try:
            vocab = self.engine.model.lm.vocab_size
            return inputs.encode_prompt(
                self.tokenizer, vocab, prompt, False, field, allow_blank=True
            )
        except (ValueError, UserInputError) as e:  # a non-text content part, a bad id, ...
            message = e.render(WORDS) if isinstance(e, UserInputError) else str(e)
            raise ApiError(400, message, field) from None

    def engine_requests(self, body, chat: bool) -> list[EngineRequest]:
        """The body as engine requests, one a choice: prompt i // n, seed + i (a fresh
        draw without a seed, as OpenAI's API samples). The engine checks each whole when
        it is submitted (requests.encode: the prompt against its max_prompt_tokens,
        prompt + max_tokens against the context, stop strings; Engine.submit: max_tokens
        against the server's)."""
        if chat:
            if self.tokenizer is None or self.tokenizer.chat_template is None:
                raise ApiError(
                    400, "this model has no chat template; use /v1/completions", "messages"
                )
            try:
                messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            except ValueError as e:  # a non-text content part
                raise ApiError(400, str(e), "messages") from None
            prompts = [self.prompt_ids(messages, "messages")]
            max_new_tokens = body.budget(self.engine.max_new_tokens)
        else:
            prompts = [self.prompt_ids(p, "prompt") for p in body.prompts()]
            max_new_tokens = body.new_tokens()
        if len(prompts) * body.n > protocol.MAX_CHOICES:
            raise ApiError(
                400,
                f"{len(prompts)} prompts x n = {body.n} is more than "
                f"{protocol.MAX_CHOICES} choices in one request",
                "n",
            )
        seed = secrets.randbits(31) if body.seed is None else body.seed
        return [
            EngineRequest(
                prompts[i // body.n],
                max_new_tokens=max_new_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                seed=seed + i,
                stop=body.stops(),
                logprobs=body.alternatives(),
                prompt_logprobs=None if chat else body.prompt_alternatives(),
                json_schema=body.json_schema(),
            )
            for i in range(len(prompts) * body.n)
        ]

    def submit(self, requests: list[EngineRequest], body, chat: bool, updates: asyncio.Queue, loop):
        """Queue the requests, all reporting to `updates` on `loop`: their ids in choice
        order. The engine's refusal of one is a 400 naming the API's field (max_tokens or
        max_completion_tokens for max_new_tokens), and those queued before it are
        cancelled."""
        rids = []
        try:
            for request in requests:
                rids.append(self.runner.submit(request, body.stream, updates, loop))
        except ShuttingDown:
            for rid in rids:
                self.runner.cancel(rid)
            raise ApiError(503, "the server is shutting down", type_="server_error") from None
        except UserInputError as e:
            for rid in rids:
                self.runner.cancel(rid)
            tokens_field = (
                "max_completion_tokens"
                if chat and body.max_completion_tokens is not None
                else "max_tokens"
            )
            param = {
                "max_new_tokens": tokens_field,
                "prompt": "messages" if chat else "prompt",
                "id": None,
                "logprobs": "top_logprobs" if chat else "logprobs",
                "prompt_logprobs": "logprobs",  # echo's
                "json_schema": "response_format",
            }.get(e.field, e.field)
            raise ApiError(
                400, e.render({**WORDS, "max_new_tokens": tokens_field}), param
            ) from None
        return rids

    async def _submit_off_loop(self, *args) -> list[str]:
        """`submit` on a worker thread; a client that leaves meanwhile has what it queued
        cancelled once the thread is done."""
        job = asyncio.ensure_future(asyncio.to_thread(self.submit, *args))

        def cancel_queued(done) -> None:
            if not done.cancelled() and done.exception() is None:
                for rid in done.result():
                    self.runner.cancel(rid)

        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(cancel_queued)
            raise

    async def answer(self, http: Request, body, chat: bool):
        t0 = time.perf_counter()
        self.check_model(body.model)
        runner, metrics = self.runner, self.metrics
        if runner.stopping or runner.fatal:
            raise ApiError(503, "the server is shutting down", type_="server_error")
        requests = self.engine_requests(body, chat)  # a body that cannot be encoded: 400 first
        if runner.full(len(requests)):  # each choice is a request in the engine's queue
            raise ApiError(
                429, "too many requests are waiting; try again later", type_="rate_limit_error"
            )
        updates: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        if body.json_schema() is None:
            rids = self.submit(requests, body, chat, updates, loop)
        else:  # its grammar compiles as it is queued (~6 s for any JSON object at a 49k
            # vocabulary, once a process): on a worker thread, not the event loop's
            rids = await self._submit_off_loop(requests, body, chat, updates, loop)
        # each prompt counted once, however many choices it has
        n_prompt = sum(len(r.prompt) for r in requests[:: body.n])
        metrics.prompt_tokens.inc(n_prompt)
        reply = Reply(self.model_name, chat)
        endpoint = http.url.path
        if body.stream:
            choices = {
                rid: StreamedChoice(
                    self.tokenizer,
                    chat,
                    None if chat else self.echo(body, i),
                    requests[i].prompt,
                )
                for i, rid in enumerate(rids)
            }
            events = self.stream(
                choices, updates, reply, body.stops(), n_prompt, body.include_usage(), t0, endpoint
            )
            return StreamingResponse(events, media_type="text/event-stream")
        results = await self.whole(http, rids, updates, t0)
        generated = sum(len(r.token_ids) for r in results)
        metrics.generated_tokens.inc(generated)
        metrics.duration.observe(time.perf_counter() - t0)
        metrics.requests.labels(endpoint, "200").inc()
        choices = []
        for i, r in enumerate(results):
            echo = None if chat else self.echo(body, i)
            text = (echo or "") + (r.text or "")
            choices.append((text, r.finish, self.logprobs_json(r, requests[i], echo, chat)))
        return reply.whole(choices, n_prompt, generated)

    def echo(self, body: CompletionRequest, choice: int) -> str | None:
        """Choice `choice`'s prompt as text when the body asks for echo (the text sent,
        or the token ids sent, decoded), else None."""
        if not body.echo:
            return None
        prompt = body.prompts()[choice // body.n]
        if isinstance(prompt, str):
            return prompt
        return "" if self.tokenizer is None else self.tokenizer.decode(prompt)

    def logprobs_json(self, result, request: EngineRequest, echo, chat: bool) -> dict | None:
        """A whole choice's logprobs in the API's shape, its prompt's first with echo
        (None: not asked)."""
        if result.logprobs is None:
            return None
        prompt = result.prompt_logprobs if echo is not None else None
        ids, lps = listed(request.prompt, prompt, result.token_ids, result.logprobs, result.eos)
        return LogprobsJson(self.tokenizer, chat).add(ids, lps)

    async def whole(self, http: Request, rids: list, updates: asyncio.Queue, t0: float):
        """Wait for every choice's result (in choice order); cancel them all if the client
        goes away."""
        results, first = {}, True
        while len(results) < len(rids):
            try:
                update = await asyncio.wait_for(updates.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await http.is_disconnected():
                    for rid in rids:
                        self.runner.cancel(rid)
                    raise ApiError(499, "the client disconnected") from None
                continue
            if isinstance(update, Closed):
                raise ApiError(503, Closed.message, type_="server_error")
            if first and update.token_ids:
                self.metrics.ttft.observe(time.perf_counter() - t0)
                first = False
            if update.result is not None:
                if update.result.finish == "error":
                    for rid in rids:
                        self.runner.cancel(rid)
                    raise ApiError(
                        500, f"decoding failed: {update.result.error}", type_="server_error"
                    )
                results[update.id] = update.result
        return [results[rid] for rid in rids]

    async def stream(
        self, choices: dict, updates, reply: Reply, stops, n_prompt, with_usage, t0, endpoint
    ):
        """The SSE events of one request (`choices`: each choice's request id and its
        StreamedChoice, in index order): each choice's chunks as its tokens come (a chunk
        names its choice's index), text that could start a stop string held back, then
        its finish; once every choice finished, the usage chunk when asked for and
        [DONE]."""
        rids = list(choices)
        index = {rid: i for i, rid in enumerate(rids)}
        open_, generated, first_token, done = set(rids), 0, True, False
        try:
            while open_:
                update = await updates.get()
                if isinstance(update, Closed) or (
                    update.result is not None and update.result.finish == "error"
                ):
                    why = (
                        Closed.message
                        if isinstance(update, Closed)
                        else f"decoding failed: {update.result.error}"
                    )
                    yield _sse(protocol.error_body(why, "server_error"))
                    yield "data: [DONE]\n\n"
                    done = True
                    self.metrics.requests.labels(endpoint, "500").inc()
                    return
                if first_token and update.token_ids:
                    self.metrics.ttft.observe(time.perf_counter() - t0)
                    first_token = False
                choice, i = choices[update.id], index[update.id]
                for text, finish, first, logprobs in choice.add(update, stops):
                    yield _sse(reply.chunk(text, finish, first=first, index=i, logprobs=logprobs))
                if update.result is not None:
                    open_.discard(update.id)
                    generated += len(update.result.token_ids)
            if with_usage:
                yield _sse(reply.usage_chunk(n_prompt, generated))
            yield "data: [DONE]\n\n"
            done = True
            self.metrics.generated_tokens.inc(generated)
            self.metrics.duration.observe(time.perf_counter() - t0)
            self.metrics.requests.labels(endpoint, "200").inc()
        finally:
            for rid in open_:  # an error ended it, or the client went away: free the slots
                self.runner.cancel(rid)
            if not done:
                self.metrics.requests.labels(endpoint, "499").inc()


# The server's words for the engine's errors' slots (errors.py): its client never saw the
# engine's request id, and sets the engine's limits with the server's flags
WORDS = {
    "request": "the prompt",
    "max_new_tokens": "max_tokens",
    "engine_max_new_tokens": "the server's --max-new-tokens",
    "max_prompt_tokens": "the server's --max-prompt-tokens",
}


class ApiKeyCheck:
    """ASGI middleware: /v1/ requests without `Authorization: Bearer KEY` get 401, before
    their body is read (a bad body without the key is a 401, not a 400). Plain ASGI, not
    Starlette's BaseHTTPMiddleware, which would sit between a stream and its client."""

    def __init__(self, app, key: str, metrics: Metrics):
        self.app, self.want, self.metrics = app, f"Bearer {key}".encode(), metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.want):
                self.metrics.requests.labels(scope["path"], "401").inc()
                body = protocol.error_body("missing or wrong API key", "authentication_error")
                await JSONResponse(body, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _field_path(loc) -> list[str]:
    """A validation error's location as the request's field path: "body" and pydantic's
    union and validator tags ("str", "list[int]", "function-after[...]") left out."""
    tags = {"str", "int", "float", "bool", "dict", "list", "none"}
    return [
        str(x) for x in loc if x != "body" and not (isinstance(x, str) and (x in tags or "[" in x))
    ]


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"
