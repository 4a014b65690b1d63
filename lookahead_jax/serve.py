"""`python -m lookahead_jax.serve`: the OpenAI-compatible HTTP server (code in
cli/serve.py and server/)."""

import sys

from lookahead_jax.cli.serve import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
