"""Command line: lookahead-jax convert --src HF_DIR_OR_GGUF --out CKPT [--dtype float32] [--force]
(also `python -m checkpoints_convert`, the name the design card gives it).

Converts a Hugging Face Llama directory or a llama.cpp GGUF file into a lookahead_jax
checkpoint (checkpoints/convert/). Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from lookahead_jax.checkpoints.convert.convert import DTYPES, convert
from lookahead_jax.cli.exits import OneLineArgumentParser, run_cli


def build_parser(prog: str = "python -m checkpoints_convert") -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog=prog,
        description="Convert a Hugging Face Llama directory (safetensors or PyTorch .bin, "
        "sharded or not) or a llama.cpp GGUF file into a lookahead_jax checkpoint "
        "(orbax params + config.json + tokenizer). The output appears only when complete.",
    )
    parser.add_argument("--src", required=True, help="Hugging Face model directory or .gguf file")
    parser.add_argument("--out", required=True, help="checkpoint directory to create")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="dtype of the stored weights (default: float32)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bar (shown only on a terminal)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv=None, prog: str = "python -m checkpoints_convert") -> int:
    args = build_parser(prog).parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def work():
        # a progress bar only on a terminal: in a log it is noise around the one-line result
        progress = not args.quiet and sys.stderr.isatty()
        out = convert(args.src, args.out, args.dtype, args.force, progress=progress)
        print(f"wrote {out}", file=sys.stderr)
        return 0

    return run_cli(work, debug=args.debug)
