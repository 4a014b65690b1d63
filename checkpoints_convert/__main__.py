"""`python -m checkpoints_convert`: the converter's command line under the name the design
card gives it; the same command as `lookahead-jax convert` (code in
lookahead_jax/cli/convert.py)."""

import sys

from lookahead_jax.cli.convert import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
