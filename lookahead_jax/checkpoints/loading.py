"""`load`: a checkpoint directory -> a ready Model (seam, params on devices, tokenizer);
`inspect`: its config and tokenizer without the weights (for checks before loading)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from lookahead_jax.cache_dir import enable_compilation_cache
from lookahead_jax.checkpoints import checkpoint
from lookahead_jax.checkpoints.tokenizer import Tokenizer
from lookahead_jax.distributed.sharding import default_mesh, shardings_for
from lookahead_jax.errors import UserInputError
from lookahead_jax.models import cpu_matmul_warmup, fused, packed
from lookahead_jax.models.bundle import Model
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.llama import LlamaLM, attention_block_for, head_rows_for
from lookahead_jax.models.llama_params import param_specs, quantize_params, split_layers
from lookahead_jax.models.quantize import check_weights

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


@dataclasses.dataclass
class ModelInfo:
    """What a checkpoint says without its weights: path, config, tokenizer, manifest."""

    path: Path
    cfg: LlamaConfig
    tokenizer: Tokenizer | None
    manifest: dict

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


def inspect(ckpt, verify: bool = False) -> ModelInfo:
    """Read a checkpoint's config, manifest and tokenizer, not its weights (fast; checks
    that the checkpoint is complete, and with `verify` every file's CRC-32)."""
    from lookahead_jax.checkpoints import default_model

    path = default_model.resolve(ckpt)
    cfg, manifest = checkpoint.read_config(path, verify=verify)
    has_tokenizer = (path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()
    return ModelInfo(path, cfg, Tokenizer(path) if has_tokenizer else None, manifest)


def load(
    ckpt,
    dtype="float32",
    mesh=None,
    compilation_cache: bool = True,
    verify: bool = True,
    weights: str = "float",
    cpu_kernel: bool | None = None,
    fuse: bool | None = None,
) -> Model:
    """Load a converted checkpoint (checkpoints/convert/; CLI: python -m checkpoints_convert)
    or the bundled default.

    ckpt: a checkpoint directory, "smollm2-135m" for the bundled SmolLM2-135M
    (converted into the cache directory on first use), or a ModelInfo from `inspect`.
    mesh: None (one device), a mesh from lj.make_mesh (params are restored straight
    into their shards), or "auto": one device unless the params do not fit in one
    device's memory, then data=1, model=all local devices.
    verify: check every params file against its CRC-32 (about 0.3 s per GB).
    weights: "float" (every weight in `dtype`), "int8" (matrices quantized at load to int8
    with per-output-channel scales) or "q8_0" (int8 with one scale per 32 inputs, llama.cpp's
    Q8_0 layout: a checkpoint converted from a Q8_0 GGUF gets back that file's own int8
    values and scales); activations in `dtype` (quantize.py).
    cpu_kernel: pack the matrices for the CPU's small-M kernel (models/packed.py): None
    where it applies (float32 or int8 weights, one CPU device, the kernel built here),
    False never (e.g. to differentiate through the model: the kernel has no gradient).
    fuse: each layer's Q/K/V and gate/up matrices as one matmul each (models/fused.py):
    None on GPUs and TPUs with one device and where the CPU kernel runs (its panels,
    packed.pack_params), True also elsewhere on one device, False never (e.g. to train or
    save the params: their checkpoint form).
    """
    dtype = resolve_dtype(dtype)
    check_weights(weights)
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh) and mesh != "auto":
        raise UserInputError(
            f"mesh must be a jax Mesh (lj.make_mesh), 'auto' or None, not {mesh!r}"
        )
    if compilation_cache:
        enable_compilation_cache()
    info = ckpt if isinstance(ckpt, ModelInfo) else inspect(ckpt)
    devices = jax.devices() if not isinstance(mesh, jax.sharding.Mesh) else mesh.devices.flat
    platform = next(iter(devices)).platform
    cpu_matmul_warmup.warm_soon()  # (a CPU's one-time set-up, beside the reading)
    lm = LlamaLM(
        info.cfg, weights, attention_block_for(platform), head_rows=head_rows_for(platform)
    )
    param_specs(info.cfg, weights)  # a shape the layout cannot take fails before reading
    if verify:
        checkpoint.check_files(info.path, info.cfg, info.manifest)
    if mesh == "auto":
        itemsize = jnp.dtype(dtype).itemsize
        per_param = {"float": itemsize, "int8": 1, "q8_0": 1 + itemsize / 32}[weights]
        n_params = sum(math.prod(t["shape"]) for t in info.manifest["tensors"].values())
        mesh = default_mesh(n_params * per_param)
    if fuse and mesh is not None:
        raise UserInputError("fuse=True needs one device (mesh=None): a mesh shards the heads")
    if cpu_kernel is not False:
        packed.build_kernel_soon(dtype, weights, mesh)
    # read and quantized in the checkpoint's stacked form, then one array per layer
    # (llama_params.split_layers: what the unrolled forward reads in place)
    params = checkpoint.read_params(
        info.path, info.cfg, dtype, shardings_for(param_specs(info.cfg), mesh)
    )
    if weights != "float":
        stacked = shardings_for(param_specs(info.cfg, weights), mesh)
        params = quantize_params(params, info.cfg, stacked, weights)
    params = jax.device_put(split_layers(params), lm.param_shardings(mesh))
    runs_here = packed.wanted(dtype, weights, mesh)
    if cpu_kernel and not runs_here:
        raise UserInputError(
            "cpu_kernel=True needs float32 with float or int8 weights on one CPU device, "
            "and the kernel built here (models/cpu_kernel: x86-64 with AVX2 and FMA, g++)"
        )
    if runs_here and cpu_kernel is not False:  # the kernel's panels, fused but with fuse=False
        fuse_layer = None if fuse is False else fused.fuse_layer
        params = packed.pack_params(params, info.cfg, free=True, fuse_layer=fuse_layer)
    elif fuse or (fuse is None and fused.fuse_where_it_pays(platform, mesh)):
        params = fused.fuse_layers(params, free=True)
    return Model(
        lm=lm,
        params=params,
        eos_ids=info.eos_ids,
        tokenizer=info.tokenizer,
        mesh=mesh,
        path=info.path,
    )
