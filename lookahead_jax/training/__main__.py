"""python -m lookahead_jax.training --ckpt BASE --prompts FILE.jsonl --out TUNED [...]

Collects Jacobi trajectories of BASE on the prompts (kept in WORK/trajectories.npz),
fine-tunes on them (train state in WORK/state; the same command resumes an interrupted
run) and writes TUNED, an ordinary checkpoint. WORK defaults to TUNED.work beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

from lookahead_jax import prompts_jsonl
from lookahead_jax.cli.exits import OneLineArgumentParser, read_user_file, run_cli
from lookahead_jax.errors import UserInputError


def build_parser(prog: str = "python -m lookahead_jax.training") -> OneLineArgumentParser:
    p = OneLineArgumentParser(
        prog=prog,
        description="Jacobi-consistency fine-tuning: a checkpoint whose lookahead guesses "
        "land more often. Prompts: JSON lines with 'prompt' (text), 'messages' (chat "
        "turns) or 'turns' (MT-bench's; the first is used), as for generate --prompts.",
    )
    p.add_argument("--ckpt", default="smollm2-135m", help="the base checkpoint")
    p.add_argument("--prompts", required=True, help="training prompts, one JSON object a line")
    p.add_argument("--out", required=True, help="the tuned checkpoint directory to create")
    p.add_argument("--work", default=None, help="trajectories and train state (default: OUT.work)")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--max-prompts", type=int, default=None, help="use the first N prompts")
    p.add_argument("--block", type=int, default=16, help="Jacobi block size n")
    p.add_argument("--blocks", type=int, default=4, help="blocks of output per prompt")
    p.add_argument(
        "--max-prompt-tokens",
        "--prompt-slots",  # its name before the rename, kept for scripts that use it
        type=int,
        default=256,
        help="longest prompt kept, tokens",
    )
    p.add_argument("--collect-batch", type=int, default=8, help="prompts per collection pass")
    p.add_argument("--steps", type=int, default=200, help="optimizer updates")
    p.add_argument("--batch", type=int, default=4, help="examples per micro-batch")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per update")
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up updates")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's weight decay")
    p.add_argument("--clip-norm", type=float, default=1.0, help="global gradient norm")
    p.add_argument(
        "--consistency-weight", type=float, default=1.0, help="Jacobi-consistency loss weight"
    )
    p.add_argument("--ar-weight", type=float, default=1.0, help="next-token loss weight")
    p.add_argument("--teacher", default="base", help="whose fixed-point distribution is "
                   "learned: 'base' (default: the frozen base model's, pulling the model "
                   "toward its distribution) or 'self' (the CLLM recipe)")  # fmt: skip
    p.add_argument("--mix", type=float, default=1.0, help="write base + MIX * (trained - "
                   "base), 0 < MIX <= 1 (weight interpolation: less speed-up, quality closer "
                   "to the base); run again with the same --work (default OUT.work) and "
                   "another --mix (--force to replace OUT): no training again")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="data order and initial guesses")
    p.add_argument("--save-every", type=int, default=25, help="updates between saved states")
    p.add_argument("--dtype", default="float32", help="float32 or float64 (with JAX_ENABLE_X64=1)")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M", help="device mesh")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    for action in p._actions:  # every value's default in --help (argparse's formatter
        # would also print "default: None" and "default: False")
        default = action.default
        shown = default not in (None, False, argparse.SUPPRESS)
        if action.help and shown and "default" not in action.help:
            action.help += f" (default: {default})"
    return p


def read_prompts(path: str, limit: int | None) -> list[prompts_jsonl.PromptRecord]:
    """The first `limit` (None: all) records of a prompt file (prompts_jsonl: every line
    checked, errors as `FILE line N: ...`)."""
    text = read_user_file(path, "--prompts", "a JSON-lines file")
    return prompts_jsonl.parse(text, path)[:limit]


def encode(model, records, chat: bool, path: str) -> list[list[int]]:
    """Each record's prompt as token ids (text with the chat template if `chat`, chat
    messages through it); what is wrong with one names its line of `path`."""
    from lookahead_jax.engine import inputs

    ids = []
    for r in records:
        try:
            ids.append(
                inputs.encode_prompt(
                    model.tokenizer, model.lm.vocab_size, r.prompt, chat, "the prompt"
                )
            )
        except UserInputError as e:
            raise prompts_jsonl.line_error(path, r.number, str(e)) from None
    return ids


def _run(args) -> int:
    import jax.numpy as jnp

    import lookahead_jax as lj
    from lookahead_jax import training
    from lookahead_jax.checkpoints import checkpoint
    from lookahead_jax.checkpoints.loading import resolve_dtype
    from lookahead_jax.distributed.sharding import parse_mesh
    from lookahead_jax.training.trajectories import mismatches

    tc = training.TrainConfig(
        steps=args.steps, batch=args.batch, accumulate=args.accumulate,
        learning_rate=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
        clip_norm=args.clip_norm, consistency_weight=args.consistency_weight,
        ar_weight=args.ar_weight, teacher=args.teacher, seed=args.seed, save_every=args.save_every,
    ).check()  # fmt: skip
    training.check_mix(args.mix, "--mix")  # before the model loads and trains
    if args.block < 2 or args.blocks < 1 or args.max_prompt_tokens < 1 or args.collect_batch < 1:
        raise UserInputError(
            "--block must be >= 2; --blocks, --max-prompt-tokens, --collect-batch >= 1"
        )
    if args.max_prompts is not None and args.max_prompts < 1:
        raise UserInputError(f"--max-prompts must be >= 1, got {args.max_prompts}")
    if resolve_dtype(args.dtype) not in (jnp.float32, jnp.float64):
        raise UserInputError(
            f"--dtype {args.dtype}: training needs float32 or float64 (AdamW's small updates "
            "vanish in bfloat16); decode the tuned checkpoint in any dtype afterwards"
        )
    mesh_sizes = parse_mesh(args.mesh) if args.mesh else None
    out = checkpoint.check_out(args.out, args.force)
    records = read_prompts(args.prompts, args.max_prompts)
    work = Path(args.work) if args.work else out.with_name(out.name + ".work")
    progress = not args.quiet and sys.stderr.isatty()

    mesh = lj.make_mesh(**mesh_sizes) if mesh_sizes is not None else None
    # the weights as they are (cpu_kernel=False): training differentiates through the
    # forward, and the CPU kernel's packed weights have no gradient
    model = lj.load(args.ckpt, dtype=args.dtype, mesh=mesh, cpu_kernel=False, fuse=False)
    if model.tokenizer is None:
        raise UserInputError(f"checkpoint {args.ckpt} has no tokenizer; text prompts need one")
    work.mkdir(parents=True, exist_ok=True)
    data_path = work / "trajectories.npz"
    ids = encode(model, records, args.chat, args.prompts)
    settings = dict(block=args.block, blocks=args.blocks, max_prompt_tokens=args.max_prompt_tokens)
    settings.update(seed=args.seed, base=str(model.path), dtype=args.dtype)
    settings["prompts_given"] = len(records)
    # the token ids of the prompts, --chat included
    settings["prompts_sha256"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    if data_path.exists():
        data = training.load_trajectories(data_path)
        shown = {k: v for k, v in settings.items() if k != "prompts_sha256"}
        changed = mismatches(data.meta, shown)
        if data.meta.get("prompts_sha256") != settings["prompts_sha256"]:
            changed.append("the prompts' token ids (--prompts, --chat, --max-prompts)")
        if changed:
            raise UserInputError(
                f"{data_path} was collected otherwise: {'; '.join(changed)}; give a new --work"
            )
        print(f"trajectories: {data_path} ({len(data)} prompts)", file=sys.stderr)
    else:

        def report(done, total):
            if progress:
                print(f"\rcollecting trajectories {done}/{total}", end="", file=sys.stderr)
            elif not args.quiet:
                print(f"collecting trajectories {done}/{total}", file=sys.stderr)

        data = training.collect(model, ids, args.block, args.blocks, args.max_prompt_tokens,
                                args.collect_batch, args.seed, report)  # fmt: skip
        data.meta.update(dtype=args.dtype, prompts_sha256=settings["prompts_sha256"])
        training.save_trajectories(data, data_path)
        if progress:
            print(file=sys.stderr)  # end the \r line
        print(
            f"trajectories: {len(data)} prompts, {data.meta['tokens']} tokens, "
            f"{data.meta['mean_iterations_per_block']:.2f} Jacobi iterations per "
            f"{args.block}-token block; saved to {data_path}",
            file=sys.stderr,
        )
    try:
        log = None if progress or args.quiet else (lambda line: print(line, file=sys.stderr))
        params = training.train(model, data, work, tc, progress=progress, log=log)
    except training.TrainingInterrupted as e:
        print(f"{e}; run the same command again to resume from {work}", file=sys.stderr)
        return 128 + signal.Signals[e.signal_name].value  # 130 for Ctrl-C, 143 for SIGTERM
    source = {
        "kind": "consistency",
        "base": str(model.path),
        "trajectories": str(data_path),
        "train": json.loads(json.dumps(tc.__dict__)),
        "tokens_per_epoch": data.meta["tokens"],
        "mix": args.mix,
    }
    if args.mix != 1:
        params = training.mix(model.params, params, args.mix)
    training.write_checkpoint(model, params, out, source, force=args.force)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv=None, prog: str = "python -m lookahead_jax.training") -> int:
    args = build_parser(prog).parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_cli(lambda: _run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
