"""`Model`: what `lj.load` and `lj.from_nnx` return, and what `lj.generate` and
`lj.Engine` take — a model behind the seam (seam.py) with its params, EOS ids, and
optionally a tokenizer and the mesh its params live on."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from lookahead_jax.models.config import LlamaConfig

if TYPE_CHECKING:
    from lookahead_jax.models.seam import CausalLM


@dataclasses.dataclass
class Model:
    """A model ready to decode: the seam (`lm`, seam.py), its params, EOS ids, and
    optionally a tokenizer and the mesh its params live on."""

    lm: CausalLM  # the seam the decoding programs call (seam.py)
    params: object
    eos_ids: tuple[int, ...]
    tokenizer: object = None  # checkpoints.tokenizer.Tokenizer, or any with encode/decode
    mesh: object = None
    path: Path | None = None

    @property
    def cfg(self) -> LlamaConfig:
        """The Llama config (checkpoints loaded by `load`)."""
        return self.lm.cfg

    @property
    def dtype(self):
        return float_dtype(self.params)


def float_dtype(params):
    """The dtype of the params' floating arrays (an int8 model's scales: its activations')."""
    return next(x.dtype for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating))
