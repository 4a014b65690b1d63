"""`load`: a checkpoint directory -> a ready Model (config, params on devices, tokenizer)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from lookahead_jax import checkpoint
from lookahead_jax.cache_dir import enable_compilation_cache
from lookahead_jax.config import LlamaConfig
from lookahead_jax.errors import UserInputError
from lookahead_jax.model import Params, unflatten
from lookahead_jax.sharding import default_mesh, param_shardings
from lookahead_jax.tokenizer import Tokenizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


@dataclasses.dataclass
class Model:
    cfg: LlamaConfig
    params: Params
    tokenizer: Tokenizer | None
    mesh: object = None
    path: Path | None = None

    @property
    def dtype(self):
        return self.params["embed"].dtype

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a row: the config's, and the tokenizer's EOS."""
        ids = set(self.cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_id is not None:
            ids.add(self.tokenizer.eos_id)
        return tuple(sorted(ids))


def resolve_dtype(dtype):
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UserInputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        raise UserInputError("dtype float64 needs jax_enable_x64 (JAX_ENABLE_X64=1)")
    return dtype


def load(
    ckpt, dtype="float32", mesh=None, compilation_cache: bool = True, verify: bool = True
) -> Model:
    """Load a converted checkpoint (see checkpoints_convert) or the bundled default.

    ckpt: a checkpoint directory, or "smollm2-135m" for the bundled SmolLM2-135M
    (converted into the cache directory on first use).
    mesh: None (one device), a mesh from lj.make_mesh (params are restored straight
    into their shards), or "auto": one device unless the params do not fit in one
    device's memory, then data=1, model=all local devices.
    verify: check every params file against its CRC-32 (about 0.3 s per GB).
    """
    dtype = resolve_dtype(dtype)
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh) and mesh != "auto":
        raise UserInputError(
            f"mesh must be a jax Mesh (lj.make_mesh), 'auto' or None, not {mesh!r}"
        )
    if compilation_cache:
        enable_compilation_cache()
    from lookahead_jax import default_model

    path = default_model.resolve(ckpt)
    cfg, manifest = checkpoint.read_config(path, verify=verify)
    if mesh == "auto":
        per_param = jnp.dtype(dtype).itemsize
        n_params = sum(math.prod(t["shape"]) for t in manifest["tensors"].values())
        mesh = default_mesh(n_params * per_param)
    flat = checkpoint.read_params(path, cfg, dtype, param_shardings(cfg, mesh))
    has_tokenizer = (path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()
    tokenizer = Tokenizer(path) if has_tokenizer else None
    return Model(cfg=cfg, params=unflatten(flat), tokenizer=tokenizer, mesh=mesh, path=path)
