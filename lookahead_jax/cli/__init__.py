"""Command lines, behind the front door `lookahead-jax` (lookahead_jax/__main__.py):
generate.py (one prompt, or a dataset through dataset.py), serve.py (the HTTP server),
convert.py (checkpoints), and the error handling every command shares (exits.py: bad
input -> one line, exit 2). Training's command is training/__main__.py."""
