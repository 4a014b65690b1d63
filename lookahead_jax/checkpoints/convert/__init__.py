"""Checkpoint conversion: Hugging Face directories and GGUF files -> lookahead_jax
checkpoints (the readers, the name/shape map and the converter). `python -m
checkpoints_convert` is its command line; the library converts the bundled default
model with it on first use."""

from lookahead_jax.checkpoints.convert.convert import DTYPES, convert

__all__ = ["DTYPES", "convert"]
