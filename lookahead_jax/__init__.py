"""lookahead_jax: exact lookahead decoding for Llama-family models in JAX."""

from lookahead_jax import decoding, guesses
from lookahead_jax.checkpoints.loading import ModelInfo, inspect, load
from lookahead_jax.decoding.sampling import SamplingConfig
from lookahead_jax.distributed.sharding import make_mesh
from lookahead_jax.engine import testing
from lookahead_jax.engine.config import EngineConfig
from lookahead_jax.engine.continuous import Engine
from lookahead_jax.engine.generate import (
    GenerationInterrupted,
    GenerationOutput,
    generate,
)
from lookahead_jax.engine.requests import Request, Result, TokenLogprob
from lookahead_jax.engine.stats import SourceStats, Stats
from lookahead_jax.engine.streaming import StreamDetokenizer
from lookahead_jax.errors import CheckpointError, MissingFileError, UserInputError
from lookahead_jax.guesses.lookahead_config import DEFAULT_LOOKAHEAD, LookaheadConfig
from lookahead_jax.models import seam
from lookahead_jax.models.bundle import Model
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.nnx_model import from_nnx

__all__ = [
    "DEFAULT_LOOKAHEAD",
    "CheckpointError",
    "Engine",
    "EngineConfig",
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
    "SourceStats",
    "Stats",
    "StreamDetokenizer",
    "TokenLogprob",
    "UserInputError",
    "decoding",
    "from_nnx",
    "generate",
    "guesses",
    "inspect",
    "load",
    "make_mesh",
    "seam",
    "testing",
]
