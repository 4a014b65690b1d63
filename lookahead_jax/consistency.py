"""`python -m lookahead_jax.consistency`: the earlier name of `python -m lookahead_jax.training`
(Jacobi-consistency fine-tuning, code in training/), kept so that scripts that use it run."""

import sys

from lookahead_jax.training.__main__ import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
