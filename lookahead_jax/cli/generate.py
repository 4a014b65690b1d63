"""Command line: python -m lookahead_jax.generate [--ckpt CKPT] --prompt TEXT [options]
             or: python -m lookahead_jax.generate --prompts IN.jsonl --output OUT.jsonl

One prompt: prints the generated text on stdout (or one JSON object with --json) and a
stats line on stderr. A file of prompts (dataset.py): decodes them all through the
engine's slots (engine/continuous.py), one result line each, resumable. Bad input: one line on
stderr, exit code 2. Ctrl-C: what is done so far, exit code 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lookahead_jax.cli import report
from lookahead_jax.cli.exits import (
    EXIT_INTERRUPTED,
    OneLineArgumentParser,
    read_user_file,
    run_cli,
)
from lookahead_jax.engine.config import DEFAULT_BATCH, DEFAULT_PREFIX_CACHE_MB
from lookahead_jax.errors import UserInputError


def lookahead_flags(args):
    """The engine's `lookahead` from --lookahead / --no-lookahead (generate's and serve's):
    None (plain), "auto" (the default, or --lookahead auto) or LookaheadConfig.parse's
    layout (tokens=T, N,W,G, ...)."""
    from lookahead_jax.guesses.lookahead_config import LookaheadConfig

    if args.no_lookahead:
        return None
    if args.lookahead is None or args.lookahead.strip().lower() == "auto":
        return "auto"
    return LookaheadConfig.parse(args.lookahead, what="--lookahead", or_auto=True)


def build_parser(prog: str = "python -m lookahead_jax.generate") -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=prog,
        description="Generate text with lookahead decoding (exact: greedy output equals "
        "plain greedy decoding; sampling keeps the model's distribution).",
    )
    p.add_argument(
        "--ckpt",
        default="smollm2-135m",
        help="checkpoint directory from checkpoints_convert, or smollm2-135m for the "
        "bundled SmolLM2-135M-Instruct (default)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file (all of it)")
    src.add_argument(
        "--prompts",
        metavar="IN.jsonl",
        help="dataset mode: one JSON object a line ('prompt', 'messages' or MT-bench's "
        "'turns'; optional 'id', 'max_new_tokens', 'temperature', 'top_k', 'top_p'); '-' "
        "reads stdin",
    )
    p.add_argument(
        "--output",
        default="-",
        metavar="OUT.jsonl",
        help="dataset mode: append one JSON line per prompt here, in finish order (default "
        "'-': stdout); a rerun skips the ids already in it",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="dataset mode: prompts decoded at once; a finished slot takes the next prompt "
        f"(default {DEFAULT_BATCH})",
    )
    p.add_argument(
        "--shared-guesses",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dataset mode: start each prompt's guesses from what earlier prompts left (token "
        "recycling's tables, their outputs' text: benchmarks/cpu/shared_guesses.md); tokens "
        "are unchanged (default: on)",
    )
    p.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=None,
        help="dataset mode: keep prompt K/V up to this many MB, so that prompts sharing a "
        "prefix (a system prompt, few-shot examples) compute it once; 0 turns it off "
        f"(default {DEFAULT_PREFIX_CACHE_MB})",
    )
    chat = p.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat",
        action="store_true",
        default=None,
        help="wrap each text prompt in the tokenizer's chat template as a user turn (the "
        "default where the checkpoint's tokenizer has one, as llama-cli does; an error "
        "where it has none)",
    )
    chat.add_argument(
        "--no-chat",
        "--raw",
        dest="chat",
        action="store_false",
        help="send text prompts as they are, without the chat template (a base model's "
        "continuation)",
    )
    p.add_argument("--max-new-tokens", type=int, default=256, help="token budget (default 256)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--lookahead",
        default=None,
        metavar="tokens=T|N,W,G|auto",
        help="tokens=T: the best measured draft layout feeding at most T tokens per step "
        "(fields may follow, e.g. tokens=16,adapt=False); "
        "N,W,G: the paper's n-gram size, window and candidates (to reproduce older results); "
        "auto (the default): choose T for this machine and model from a measured cost curve "
        "and the running acceptance rate, or plain decoding when no layout is expected to win",
    )
    mode.add_argument("--no-lookahead", action="store_true", help="plain decoding")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        metavar="SCHEMA",
        help="structured output: the answer is JSON valid under this schema (a file, or the "
        'schema inline: \'{"type": "object", ...}\'; docs/engine.md says which keywords)',
    )
    shape.add_argument(
        "--regex", help="structured output: the answer matches this regular expression, whole"
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default), bfloat16, or float64 (with JAX_ENABLE_X64=1)",
    )
    p.add_argument(
        "--weights",
        default="float",
        help="float (default: every weight in --dtype), int8 (matrices quantized to int8 "
        "with per-output-channel scales at load; a quarter of float32's bytes per step) or "
        "q8_0 (int8 with a scale per 32 inputs, llama.cpp's Q8_0: a Q8_0 GGUF's own weights)",
    )
    p.add_argument(
        "--mesh",
        default=None,
        metavar="data=D,model=M",
        help="shard over a device mesh, e.g. data=2,model=4 (default: one device, "
        "or model=all local devices when the weights do not fit on one)",
    )
    p.add_argument(
        "--distributed",
        action="store_true",
        help="multi-host: join jax.distributed first (also when LOOKAHEAD_JAX_DISTRIBUTED=1); "
        "the cluster is auto-detected on TPU slices, SLURM and Open MPI, or given with the "
        "three flags below. Each process generates its own prompt (one row per process)",
    )
    p.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="multi-host: address of process 0 (default: auto-detect)",
    )
    p.add_argument("--num-processes", type=int, default=None, help="multi-host: process count")
    p.add_argument("--process-id", type=int, default=None, help="multi-host: this process")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument(
        "--color",
        nargs="?",
        const="auto",
        default="never",
        choices=("auto", "always", "never"),
        help="show tokens that came from verified guesses (2nd+ token of a step) in green: "
        "auto (a bare --color) only when stdout is a terminal and NO_COLOR is unset, "
        "always, or never (the default)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(argv=None, prog: str = "python -m lookahead_jax.generate") -> int:
    """Run the command on `argv` (default: sys.argv[1:]); `prog` is its name in help and
    errors (`lookahead-jax generate` from the front door)."""
    t_start = time.perf_counter()
    args = build_parser(prog).parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_cli(lambda: _run(args, t_start), debug=args.debug)


def _read_prompt(args) -> str:
    if args.prompt_file is not None:
        text = read_user_file(args.prompt_file, "--prompt-file", "a UTF-8 text file")
        where = f"--prompt-file {args.prompt_file}"
    elif args.prompt is not None:
        text, where = args.prompt, "--prompt"
    else:
        raise UserInputError("no prompt: give --prompt TEXT or --prompt-file FILE")
    if not text.strip():
        raise UserInputError(f"the prompt is empty ({where} holds {text!r}); give some text")
    return text


def _read_schema(value: str | None) -> dict | None:
    """--json-schema: inline JSON, or a file holding it; checked for what the grammar can
    enforce now, before the weights load (grammar/json_schema.py)."""
    if value is None:
        return None
    from lookahead_jax.grammar import json_schema

    text = (
        value
        if value.lstrip().startswith("{")
        else read_user_file(value, "--json-schema", "a JSON file")
    )
    schema = json_schema.as_schema(text)
    json_schema.check(schema)
    return schema


def _sampling(args) -> dict:
    """The sampling flags as keyword arguments of lj.generate / lj.Engine."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def _validate(args):
    """Everything checkable from the flags alone, so bad flags fail fast: the command's
    own here, the engine's by the one set of rules (EngineConfig). Returns the prompt text
    (None in dataset mode) and the engine's settings (a single prompt: one row)."""
    from lookahead_jax.checkpoints.loading import resolve_dtype
    from lookahead_jax.engine.config import EngineConfig
    from lookahead_jax.models.quantize import check_weights

    if args.stream and args.json:
        raise UserInputError("--stream and --json cannot be combined; choose one")
    if args.prompts is not None:
        for flag in ("stream", "json", "color", "distributed"):
            if getattr(args, flag) not in (False, None, "never"):
                raise UserInputError(f"--{flag} does not apply to --prompts (dataset mode)")
        if args.batch is None:
            args.batch = DEFAULT_BATCH
        if args.prefix_cache_mb is None:
            args.prefix_cache_mb = DEFAULT_PREFIX_CACHE_MB
        if args.shared_guesses is None:
            args.shared_guesses = True
        if args.output != "-" and os.path.abspath(args.output) == os.path.abspath(args.prompts):
            raise UserInputError("--output must not be the --prompts file")
        from lookahead_jax.cli.dataset import check_writable

        check_writable(args.output)
    else:
        dataset_only = (
            ("output", args.output != "-"),
            ("batch", args.batch is not None),
            ("prefix-cache-mb", args.prefix_cache_mb is not None),
            ("shared-guesses", args.shared_guesses is not None),
        )
        for flag, value in dataset_only:
            if value:
                raise UserInputError(f"--{flag} is for dataset mode: give --prompts IN.jsonl too")
    resolve_dtype(args.dtype)
    check_weights(args.weights)
    args.json_schema = _read_schema(args.json_schema)
    if args.regex is not None:
        from lookahead_jax.grammar import check_regex

        check_regex(args.regex)
    if args.prompts is not None and (args.json_schema is not None or args.regex is not None):
        raise UserInputError(
            "--json-schema and --regex are for a single prompt: in dataset mode give each "
            'line its own "json_schema" or "regex"'
        )
    config = EngineConfig(
        batch=1 if args.prompts is None else args.batch,
        max_new_tokens=args.max_new_tokens,
        lookahead=lookahead_flags(args),
        prefix_cache_mb=args.prefix_cache_mb,
        shared_guesses=bool(args.shared_guesses),
        **_sampling(args),
    )
    return (None if args.prompts is not None else _read_prompt(args)), config


def inspect_checkpoint(args, config):
    """What needs the checkpoint's config and tokenizer but not its weights (one prompt or
    a dataset): the settings against its context, a tokenizer for text prompts, and
    whether they go through its chat template (args.chat resolved). Runs before the
    weights are loaded; returns its ModelInfo."""
    import lookahead_jax as lj

    info = lj.inspect(args.ckpt)  # lj.load verifies the checksums
    config.check_context(info.cfg.max_position_embeddings)
    if info.tokenizer is None:
        raise UserInputError(
            f"checkpoint {args.ckpt} has no tokenizer (tokenizer.json or tokenizer.model); "
            "text prompts need one: convert a source that has a tokenizer"
        )
    args.chat = info.tokenizer.wants_chat(args.chat)
    return info


def _check_against_checkpoint(args, prompt: str, config):
    """inspect_checkpoint, then the prompt + budget against the context. Returns the
    checkpoint's ModelInfo and the prompt's token ids."""
    from lookahead_jax.engine.inputs import check_context

    info = inspect_checkpoint(args, config)
    ids = info.tokenizer.encode_prompt(prompt, args.chat)
    check_context(info.cfg.max_position_embeddings, len(ids), args.max_new_tokens)
    return info, ids


# XLA:CPU's YNN dot fusions pack a program's weights at its first run: a 1x256 prefill of
# SmolLM2-135M float32 took 0.75 s at its first run and 0.46 s after (0.51 / 0.49 s
# without them), the decode loop the same either way (2-core Intel Xeon, JAX 0.10.2). A
# single prompt runs each program once: this command turns them off (the dataset command
# and the server, which run their programs many times, keep them).
ONE_SHOT_XLA_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
ONE_SHOT_SINCE_JAXLIB = (0, 10)  # (a flag XLA does not know aborts the process)


def one_shot_xla_flags() -> None:
    """Add ONE_SHOT_XLA_FLAG to XLA_FLAGS (before JAX starts its backend), unless the
    user set that flag, or jaxlib is older than the versions known to have it."""
    from importlib.metadata import version

    flags = os.environ.get("XLA_FLAGS", "")
    try:
        known = tuple(int(x) for x in version("jaxlib").split(".")[:2]) >= ONE_SHOT_SINCE_JAXLIB
    except (ValueError, ImportError):
        known = False
    if known and "ynn_fusion_type" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {ONE_SHOT_XLA_FLAG}".strip()


def _run(args, t_start: float) -> int:
    prompt, config = _validate(args)
    args.color = report.wants_color(args.color)
    from lookahead_jax.distributed.sharding import check_batch, parse_mesh

    mesh_sizes = parse_mesh(args.mesh) if args.mesh else None
    if args.prompts is None:
        one_shot_xla_flags()

    import jax

    import lookahead_jax as lj
    from lookahead_jax.engine.streaming import StreamDetokenizer, steps_of

    if args.prompts is not None:
        from lookahead_jax.cli import dataset

        return dataset.run(args, config, inspect_checkpoint(args, config), mesh_sizes, t_start)
    if args.distributed or os.environ.get("LOOKAHEAD_JAX_DISTRIBUTED") == "1":
        from lookahead_jax.distributed import multihost

        multihost.initialize(args.coordinator, args.num_processes, args.process_id)
    mesh = lj.make_mesh(**mesh_sizes) if mesh_sizes is not None else "auto"
    if mesh_sizes is not None:
        check_batch(mesh, jax.process_count())  # one prompt per process
    info, ids = _check_against_checkpoint(args, prompt, config)
    t = time.perf_counter()
    model = lj.load(info, dtype=args.dtype, mesh=mesh, weights=args.weights)
    load_s = time.perf_counter() - t

    printer = StreamDetokenizer(model.tokenizer, args.color) if args.stream else None

    def on_tokens(new_rows):  # one call per forward pass: one step's tokens
        sys.stdout.write(printer.add_step(new_rows[0]))
        sys.stdout.flush()

    kwargs = dict(max_new_tokens=args.max_new_tokens, lookahead=config.lookahead, **_sampling(args))
    kwargs.update(json_schema=args.json_schema, regex=args.regex)
    interrupted = False
    try:
        if printer is not None:
            out = lj.generate(model, [ids], stream=on_tokens, **kwargs)
        else:
            out = lj.generate(model, [ids], steps_per_call=16, **kwargs)
    except lj.GenerationInterrupted as e:
        out, interrupted = e.partial, True
    total_s = time.perf_counter() - t_start

    if args.json:
        print(json.dumps(report.json_record(out, load_s, total_s)))
    elif printer is not None:
        print(printer.flush(), flush=True)
    elif args.color:
        colored = StreamDetokenizer(model.tokenizer, color=True)
        text = "".join(
            colored.add_step(s) for s in steps_of(out.token_ids[0], out.step_of_token[0])
        )
        print(text + colored.flush(), flush=True)
    else:
        print(out.texts[0], flush=True)
    note = report.empty_answer_note(out, args.chat)
    if note is not None:
        print(note, file=sys.stderr)
    print(report.stats_line(out, total_s), file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
