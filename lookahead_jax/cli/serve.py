"""Command line: python -m lookahead_jax.serve [--ckpt CKPT] [--host H] [--port P] ...

Loads the model, warms the engine (auto's choice, the decode loop and the smallest
prompt bucket's prefill are compiled before the first request), and serves the
OpenAI-compatible API (server/app.py) with uvicorn until SIGINT or SIGTERM: then new
requests are refused, streams in flight end with an error chunk, and it exits 0. If
decoding keeps failing it exits 1 with the reason on stderr. Bad flags: one line on
stderr, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from lookahead_jax.cli.exits import OneLineArgumentParser, run_cli
from lookahead_jax.engine.config import DEFAULT_BATCH, DEFAULT_PREFIX_CACHE_MB
from lookahead_jax.errors import UserInputError
from lookahead_jax.server.activity_log import DEFAULT_EVERY_S, ActivityLog

DEFAULT_MAX_PROMPT = 1024
GRACE_S = 10  # seconds a shutdown waits for handlers still running


def build_parser(prog: str = "python -m lookahead_jax.serve") -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=prog,
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /health, /metrics), decoding with lookahead: "
        "each request gets exactly the tokens of a lone decode of its prompt.",
    )
    p.add_argument(
        "--ckpt",
        default="smollm2-135m",
        help="checkpoint directory from checkpoints_convert, or smollm2-135m for the "
        "bundled SmolLM2-135M-Instruct (default)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (8000)")
    p.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help=f"slots decoding at once ({DEFAULT_BATCH})"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="the most tokens a request may ask for (max_tokens); sizes the cache (256)",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help=f"the longest prompt, in tokens (default: {DEFAULT_MAX_PROMPT}, or less where "
        "the model's context is shorter)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--lookahead",
        default=None,
        metavar="tokens=T|N,W,G|auto",
        help="auto (the default): a layout chosen for this machine and model at one row, "
        "and each decode round runs it or plain steps, whichever the rows live then "
        "decode faster at their number (measured as it serves); tokens=T a fixed layout "
        "of T tokens per step",
    )
    mode.add_argument("--no-lookahead", action="store_true", help="plain decoding")
    p.add_argument(
        "--auto-temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="the temperature auto chooses its layout for (default 0: greedy, where "
        "lookahead gains most; sampling accepts fewer guesses and wants smaller steps). "
        "Rounds whose rows do not gain from the layout run plain steps whatever this "
        "says; requests decode at their own temperature",
    )
    p.add_argument(
        "--model-name",
        default=None,
        help="the name clients ask for (default: the checkpoint's directory name)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: none; also LOOKAHEAD_JAX_API_KEY)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="requests that may wait for a slot; more get 429 (default: no limit)",
    )
    p.add_argument(
        "--shared-guesses",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start each request's guesses from what earlier requests left (token "
        "recycling's tables, their outputs' text; a prompt asked again: benchmarks/cpu/"
        "shared_guesses.md); tokens are unchanged (default: on)",
    )
    p.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=DEFAULT_PREFIX_CACHE_MB,
        help="keep prompt K/V up to this many MB, so that requests sharing a prefix (a "
        "system prompt, a conversation's earlier turns) compute it once; 0 turns it off "
        f"(default {DEFAULT_PREFIX_CACHE_MB})",
    )
    p.add_argument(
        "--prefill-chunk",
        default="auto",
        metavar="TOKENS|auto|0",
        help="with the prefix cache, a long prompt arriving while others decode is "
        "prefilled this many tokens at a time between decode rounds, so the streams in "
        "flight keep their pace (a multiple of 16); auto (default): what this machine "
        "prefills in one round; 0: in one piece",
    )
    p.add_argument(
        "--row-buckets",
        default="auto",
        choices=("auto", "on", "off"),
        help="a decode round steps only the live requests, gathered into the smallest of "
        "1, 2, 4, ... rows (then --batch) that holds them: auto (default) or on (either "
        "way every bucket's loop is compiled at start-up), or off (every round steps all "
        "--batch rows)",
    )
    p.add_argument(
        "--grammar-states",
        type=int,
        default=4096,
        help="structured output (response_format json_schema, json_object): the automaton "
        "states of the grammars in flight (at most 15 distinct) that the device tables hold, 4 "
        "KiB a state (a schema of a few properties makes 300-1,000, any JSON object 1,505 at "
        "SmolLM2's vocabulary); a step masks logits only while some row follows a grammar; 0: "
        "off (default 4096: 19 MiB at SmolLM2's vocabulary)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default), bfloat16, or float64 (with JAX_ENABLE_X64=1)",
    )
    p.add_argument("--weights", default="float", help="float (default), int8 or q8_0")
    p.add_argument(
        "--mesh", default=None, metavar="data=D,model=M", help="shard over a device mesh"
    )
    p.add_argument(
        "--steps-per-call",
        type=int,
        default=16,
        help="decoding steps between looks at the queue (16): a new request waits for "
        "at most this many steps",
    )
    p.add_argument(
        "--stream-steps",
        type=int,
        default=4,
        help="decoding steps between chunks while a request streams (4)",
    )
    p.add_argument("--no-warmup", action="store_true", help="compile at the first request")
    p.add_argument(
        "--log-every",
        type=float,
        default=DEFAULT_EVERY_S,
        metavar="SECONDS",
        help="every SECONDS with requests finished, a line on stderr: requests, tokens, "
        "tokens a step (1.00 for plain decoding), guesses accepted, auto's rounds "
        f"({DEFAULT_EVERY_S:g}; 0: none)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn's log level (info)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(argv=None, prog: str = "python -m lookahead_jax.serve") -> int:
    args = build_parser(prog).parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_cli(lambda: _run(args), debug=args.debug)


def _validate(args):
    """Everything checkable from the flags alone, before the model loads: the server's own
    flags here, the engine's by the one set of rules (EngineConfig). Returns the engine's
    settings (max_prompt_tokens as given: _run sizes a default from the context)."""
    from lookahead_jax.checkpoints.loading import resolve_dtype
    from lookahead_jax.cli.generate import lookahead_flags
    from lookahead_jax.engine.config import EngineConfig
    from lookahead_jax.models.quantize import check_weights
    from lookahead_jax.server.protocol import MAX_LOGPROBS

    if not args.log_every >= 0:  # (nan too)
        raise UserInputError(f"--log-every must be >= 0 seconds, got {args.log_every}")
    if args.max_queue is not None and args.max_queue < 1:
        raise UserInputError(f"--max-queue must be >= 1, got {args.max_queue}")
    chunk = args.prefill_chunk
    if chunk != "auto":  # "auto", 0 (None: in one piece) or a number of tokens
        if not chunk.isdigit():
            raise UserInputError(f"--prefill-chunk must be auto, 0 or a number, got {chunk!r}")
        chunk = int(chunk) or None
    if not 0 < args.port < 65536:
        raise UserInputError(f"--port must be in 1..65535, got {args.port}")
    if not 0.0 <= args.auto_temperature <= 2.0:  # the API's range of temperatures
        raise UserInputError(f"--auto-temperature must be in 0..2, got {args.auto_temperature}")
    resolve_dtype(args.dtype)
    check_weights(args.weights)
    config = EngineConfig(
        batch=args.batch,
        max_new_tokens=args.max_new_tokens,
        lookahead=lookahead_flags(args),
        steps_per_call=args.steps_per_call,
        stream_steps=args.stream_steps,
        max_prompt_tokens=args.max_prompt_tokens,
        sampled=True,
        prefix_cache_mb=args.prefix_cache_mb,
        shared_guesses=args.shared_guesses,
        prefill_chunk=chunk,
        row_buckets={"auto": "auto", "on": True, "off": False}[args.row_buckets],
        max_logprobs=MAX_LOGPROBS,  # what the API lets a request ask (server/protocol.py)
        grammar_states=args.grammar_states,
        # requests bring their own settings (server/app.py): the engine's default
        # temperature is only what auto tunes for
        temperature=args.auto_temperature,
    )
    _check_port_free(args.host, args.port)  # last: the cheap checks first
    return config


def _check_port_free(host: str, port: int) -> None:
    """Refuse an address another process listens on now, before the model loads and
    warms (uvicorn would find out only then, after tens of seconds). Bound as uvicorn
    binds it (SO_REUSEADDR: a port in TIME_WAIT is free), then let go."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserInputError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            raise UserInputError(
                f"cannot listen on {host}:{port} ({e.strerror}): another server may be "
                "running there; pick another --port"
            ) from None


def _run(args) -> int:
    config = _validate(args)
    import uvicorn

    import lookahead_jax as lj
    from lookahead_jax.distributed.sharding import parse_mesh
    from lookahead_jax.server import host_memory
    from lookahead_jax.server.app import create_app
    from lookahead_jax.server.runner import EngineRunner

    mesh = lj.make_mesh(**parse_mesh(args.mesh)) if args.mesh else "auto"
    info = lj.inspect(args.ckpt)
    context = info.cfg.max_position_embeddings
    config.check_context(context)  # before the weights load
    if config.max_prompt_tokens is None:  # (fits the context: max_new_tokens leaves room)
        max_prompt = min(DEFAULT_MAX_PROMPT, context - config.max_new_tokens)
        config = dataclasses.replace(config, max_prompt_tokens=max_prompt)
    t = time.perf_counter()
    model = lj.load(info, dtype=args.dtype, mesh=mesh, weights=args.weights)
    engine = lj.Engine(model, config)
    if not args.no_warmup:
        # with logprobs asked: an offline run compiles the logprob code only when some
        # request asks, and the server's programs (online) always have it
        # (and every row bucket's loop: engine/row_buckets.py)
        warm = lj.Request([info.cfg.bos_token_id or 1], max_new_tokens=1, logprobs=0)
        engine.warm_up(warm)  # the stats: the server's own from here
        host_memory.release()  # its compile temporaries: a third to a half of the RSS
    name = args.model_name or (
        args.ckpt if not Path(args.ckpt).exists() else Path(args.ckpt).resolve().name
    )
    api_key = args.api_key or os.environ.get("LOOKAHEAD_JAX_API_KEY") or None
    server = None
    fatal: list[str] = []

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    runner = EngineRunner(engine, args.max_queue, on_fatal)
    app = create_app(runner, name, api_key)
    # a bounded graceful shutdown: streams are ended at once (Server.handle_exit), and a
    # handler that still waits after GRACE_S is not worth hanging for
    http_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=GRACE_S,
    )
    server = _server_class()(http_config, runner)
    runner.start()
    activity = ActivityLog(engine, args.log_every)
    activity.start()
    print(
        f"serving {name} on http://{args.host}:{args.port}/v1 "
        f"(batch {args.batch}, loaded and warmed in {time.perf_counter() - t:.1f} s; "
        f"{engine.decoding()})",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.run()
    finally:
        runner.shutdown()
        activity.stop()
    if fatal:
        print(f"error: {fatal[0]}", file=sys.stderr)
        return 1
    return 0


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a shutdown signal first ends the streams in flight (with
        an error chunk) and refuses new requests, so that the graceful shutdown does not
        wait for every stream to run to its end."""

        def __init__(self, config, runner):
            super().__init__(config)
            self.runner = runner

        def handle_exit(self, sig, frame):
            self.runner.end_streams()
            super().handle_exit(sig, frame)
            # uvicorn re-raises a captured signal once it has shut down, so the process
            # would die by it; a shutdown asked for by SIGINT/SIGTERM is a clean exit (0)
            self._captured_signals.clear()

    return Server
