"""Command lines: `python -m lookahead_jax.generate` (generate.py, one prompt or a
dataset through dataset.py) and the error handling every command shares (exits.py:
bad input -> one line, exit 2)."""
