"""Fused layers (models/fused.py): Q/K/V and gate/up as one matmul each give the unfused
layers' logits (float64, to rounding) and tokens (lookahead greedy == plain greedy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.errors import UserInputError
from lookahead_jax.models import fused
from lookahead_jax.models.llama import forward
from lookahead_jax.models.seam import causal_mask
from tests import tiny


def logits(model, ids: np.ndarray) -> np.ndarray:
    B, T = ids.shape
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    out, _, _ = jax.jit(forward, static_argnums=1)(
        model.params, model.cfg, jnp.asarray(ids), positions, causal_mask(T)
    )
    return np.asarray(out)


@pytest.mark.parametrize(
    "variant,weights",
    # biases on q/k/v and the MLP, Qwen3's q/k norms and free head_dim, MQA; int8 weights
    # per channel and in Q8_0 blocks (their scales fuse with their values)
    [("llama_bias", "float"), ("qwen3_bias", "float"), ("mqa", "int8"), ("gqa", "q8_0")],
)
def test_fused_layers_give_the_unfused_logits(tiny_ckpts, variant, weights):
    ckpt = tiny_ckpts[variant][1]
    ids = np.random.default_rng(0).integers(0, tiny.VOCAB, (2, 24))
    with jax.enable_x64(True):
        apart = lj.load(ckpt, dtype="float64", weights=weights, fuse=False)
        one = lj.load(ckpt, dtype="float64", weights=weights, fuse=True)
        assert fused.has_fused(one.params) and not fused.has_fused(apart.params)
        want, got = logits(apart, ids), logits(one, ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert want.std() > 0.1  # not vacuous


def test_fused_lookahead_equals_unfused_plain(tiny_ckpts):
    """The decode loop over fused layers: lookahead greedy == plain greedy over the
    unfused ones, token for token (float64)."""
    ckpt = tiny_ckpts["gqa"][1]
    prompts = [list(range(5, 25)), [7, 8, 9, 7, 8, 9, 7, 8]]
    with jax.enable_x64(True):
        apart = lj.load(ckpt, dtype="float64", fuse=False)
        one = lj.load(ckpt, dtype="float64", fuse=True)
        want = lj.generate(apart, prompts, max_new_tokens=24, lookahead=None)
        got = lj.generate(
            one, prompts, max_new_tokens=24, lookahead=lj.LookaheadConfig.for_tokens(8)
        )
    assert got.token_ids == want.token_ids
    assert got.stats.compression > 1.0  # guesses were accepted


def test_fuse_is_refused_where_it_cannot_apply(tiny_ckpts):
    ckpt = tiny_ckpts["gqa"][1]
    with pytest.raises(UserInputError, match="fuse=True needs one device"):
        lj.load(ckpt, fuse=True, mesh=lj.make_mesh(data=1, model=2))
    # the CPU's default without its kernel: XLA's matmuls, unfused (with it: its panels
    # fused, tests/test_cpu_kernel.py)
    assert not fused.has_fused(lj.load(ckpt, cpu_kernel=False).params)
