"""lookahead_jax: exact lookahead decoding for Llama-family models in JAX."""

from lookahead_jax.config import LlamaConfig
from lookahead_jax.errors import CheckpointError, MissingFileError, UserInputError
from lookahead_jax.generation import GenerationInterrupted, GenerationOutput, generate
from lookahead_jax.loading import Model, load
from lookahead_jax.lookahead import DEFAULT_LOOKAHEAD, LookaheadConfig
from lookahead_jax.sampling import SamplingConfig
from lookahead_jax.sharding import make_mesh

__all__ = [
    "DEFAULT_LOOKAHEAD",
    "CheckpointError",
    "GenerationInterrupted",
    "GenerationOutput",
    "LlamaConfig",
    "LookaheadConfig",
    "MissingFileError",
    "Model",
    "SamplingConfig",
    "UserInputError",
    "generate",
    "load",
    "make_mesh",
]
