"""lookahead_jax: exact lookahead decoding for Llama-family models in JAX."""

from lookahead_jax import decoding, seam, testing
from lookahead_jax.api import GenerationInterrupted, GenerationOutput, generate
from lookahead_jax.config import LlamaConfig
from lookahead_jax.engine import Engine, Request, Result
from lookahead_jax.errors import CheckpointError, MissingFileError, UserInputError
from lookahead_jax.loading import Model, ModelInfo, inspect, load
from lookahead_jax.lookahead_config import DEFAULT_LOOKAHEAD, LookaheadConfig
from lookahead_jax.nnx_model import from_nnx
from lookahead_jax.sampling import SamplingConfig
from lookahead_jax.sharding import make_mesh
from lookahead_jax.streaming import StreamDetokenizer

__all__ = [
    "DEFAULT_LOOKAHEAD",
    "CheckpointError",
    "Engine",
    "GenerationInterrupted",
    "GenerationOutput",
    "LlamaConfig",
    "LookaheadConfig",
    "MissingFileError",
    "Model",
    "ModelInfo",
    "Request",
    "Result",
    "SamplingConfig",
    "StreamDetokenizer",
    "UserInputError",
    "decoding",
    "from_nnx",
    "generate",
    "inspect",
    "load",
    "make_mesh",
    "seam",
    "testing",
]
