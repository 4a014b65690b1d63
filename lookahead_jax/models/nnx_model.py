"""Bring your own Flax NNX model: `from_nnx` wraps an `nnx.Module` in the model seam.

The module is split into its graph (static, hashable) and its state (the params pytree)
with `nnx.split`; every jitted decoding program merges them back with `nnx.merge` and
calls the module — the pattern of Flax's own gemma sampler. The module's `__call__`
follows the seam's `apply` (seam.py):

    module(tokens [B, T], positions [B, T], mask [B|1, T, T], cache, logits_rows [B, R])
        -> logits [B, R, V], new_k, new_v (each L arrays [B, K, T, Dh])

where `cache` is a kv_cache.KVCache (k, v: L buffers [B, K, S, Dh]; lengths [B]) or None
for the prefill: attend to positions below each row's length, never write it. Example (a complete,
runnable one: examples/tiny_nnx_lm.py):

    model = lj.from_nnx(MyLM(cfg, rngs=nnx.Rngs(0)), max_context=2048, eos_ids=(2,),
                        cache_shape=(num_layers, num_kv_heads, head_dim))
    out = lj.generate(model, [[1, 5, 9]], lookahead=lj.LookaheadConfig.for_tokens(16))
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from lookahead_jax.errors import UserInputError
from lookahead_jax.models import kv_cache, seam
from lookahead_jax.models.bundle import Model


@dataclasses.dataclass(frozen=True)
class NnxLM:
    """An NNX module's graph behind the seam; its state is the params."""

    graphdef: object  # nnx.GraphDef (hashable)
    state_treedef: object  # the params' pytree structure (hashable)
    vocab_size: int
    max_context: int
    cache_shape: tuple[int, int, int]  # (layers L, kv heads K, head dim Dh)

    def apply(self, params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br=None):
        from flax import nnx

        module = nnx.merge(self.graphdef, params)
        return module(tokens_bt, positions_bt, mask_btu, cache, logits_rows_br)

    def init_cache(self, batch: int, positions: int, dtype):
        layers, heads, head_dim = self.cache_shape
        return kv_cache.init_cache(layers, batch, positions, heads, head_dim, dtype)

    def param_shardings(self, mesh):
        """Replicated on every device of the mesh (or one device without a mesh)."""
        where = (
            SingleDeviceSharding(jax.devices()[0])
            if mesh is None
            else NamedSharding(mesh, PartitionSpec())
        )
        leaves = [where] * self.state_treedef.num_leaves
        return jax.tree_util.tree_unflatten(self.state_treedef, leaves)


def from_nnx(
    module,
    *,
    max_context: int,
    eos_ids: tuple[int, ...] = (),
    cache_shape: tuple[int, int, int] | None = None,
    vocab_size: int | None = None,
    tokenizer=None,
) -> Model:
    """A Model (for lj.generate) from a Flax NNX causal LM following the seam's call.

    cache_shape: (layers, kv heads, head dim) of its KV cache; by default read from the
    module's `num_layers`, `num_kv_heads` and `head_dim` attributes.
    vocab_size: by default the module's `vocab_size` attribute.
    tokenizer: optional (lookahead_jax.checkpoints.tokenizer.Tokenizer) for text prompts.
    """
    from flax import nnx

    if not isinstance(module, nnx.Module):
        raise UserInputError(f"from_nnx needs a flax.nnx.Module, got {type(module).__name__}")
    if cache_shape is None:
        try:
            cache_shape = (module.num_layers, module.num_kv_heads, module.head_dim)
        except AttributeError:
            raise UserInputError(
                "from_nnx: pass cache_shape=(layers, kv_heads, head_dim), or give the module "
                "num_layers, num_kv_heads and head_dim attributes"
            ) from None
    vocab_size = vocab_size if vocab_size is not None else getattr(module, "vocab_size", None)
    if vocab_size is None:
        raise UserInputError("from_nnx: pass vocab_size, or give the module a vocab_size")
    graphdef, state = nnx.split(module)
    lm = NnxLM(
        graphdef,
        jax.tree_util.tree_structure(state),
        int(vocab_size),
        int(max_context),
        tuple(int(x) for x in cache_shape),
    )
    seam.check_model(lm)
    return Model(lm=lm, params=state, eos_ids=tuple(eos_ids), tokenizer=tokenizer)
