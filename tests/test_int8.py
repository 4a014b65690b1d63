"""Weight-only int8 (quantize.py): the quantizer's bounds, the int8 forward against the
float forward of the very weights it stands for, exactness of lookahead on the int8
model, sharded int8 equal to one device, and the CLI flag."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax import quantize
from lookahead_jax.model import flat_names, forward, from_flat, param_specs
from lookahead_jax.quantize import Int8Weight
from tests.helpers import random_prompts

PROMPTS = random_prompts(8, 128, 1, 14, seed=31)


def test_worked_example_and_error_bound():
    w = jnp.asarray([[0.50, -1.27, 0.02, 0.00], [0.0, 0.0, 0.0, 0.0]]).T  # [in 4, out 2]
    q = quantize.quantize(w, (0,))
    assert q.q.dtype == jnp.int8
    np.testing.assert_array_equal(q.q[:, 0], [50, -127, 2, 0])
    np.testing.assert_allclose(q.scale, [0.01, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(q.q[:, 1], 0)  # an all-zero channel stays exactly zero
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 40, 5, 6)) * rng.uniform(0.01, 3, (3, 1, 5, 6)))
    q = quantize.quantize(w, (1,))
    assert q.scale.shape == (3, 5, 6)
    err = np.abs(np.asarray(quantize.dequantize(q, (1,)) - w))
    bound = np.abs(np.asarray(w)).max(axis=1, keepdims=True) / 254
    assert (err <= bound * (1 + 1e-5)).all()
    assert np.abs(np.asarray(q.q)).max(axis=1).min() == 127  # every channel uses the range


@pytest.mark.parametrize("variant", ["gqa", "qwen3_bias"])
def test_int8_forward_is_the_float_forward_of_its_dequantized_weights(tiny_ckpts, variant):
    """The int8 program ((x @ q) * scale, lookup of q rows * row scale) computes the same
    function as the float forward of q * scale, and stays near the original model;
    qwen3_bias: tied embeddings (one per-row scale for lookup and LM head), biases."""
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts[variant][1], dtype="float64")
        int8 = lj.load(tiny_ckpts[variant][1], dtype="float64", weights="int8")
        cfg = model.cfg
        specs = flat_names(param_specs(cfg))
        flat = flat_names(int8.params, is_leaf=lambda x: isinstance(x, Int8Weight))
        assert set(quantize.CONTRACTED) & set(flat) == {
            n for n, w in flat.items() if isinstance(w, Int8Weight)
        }
        dq = {
            n: quantize.dequantize(w, quantize.contracted_dims(n, specs[n].axes))
            if isinstance(w, Int8Weight)
            else w
            for n, w in flat.items()
        }
        tokens = jnp.asarray([PROMPTS[0] + PROMPTS[1]], jnp.int32)
        pos = jnp.arange(tokens.shape[1])[None]
        mask = jnp.tril(jnp.ones((1, tokens.shape[1], tokens.shape[1]), bool))
        got = forward(int8.params, cfg, tokens, pos, mask)[0]
        want = forward(from_flat(cfg, dq), cfg, tokens, pos, mask)[0]
        base = forward(model.params, cfg, tokens, pos, mask)[0]
    got, want, base = np.asarray(got), np.asarray(want), np.asarray(base)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    err = float(np.abs(got - base).max() / np.abs(base).max())
    assert 0 < err < 0.05, err  # quantized, and close


def test_int8_lookahead_equals_int8_plain(tiny_ckpts):
    """Greedy lookahead on the int8 model == greedy plain decoding of the same int8 model
    (float64 activations, so no near-tie can hide a difference)."""
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts["gqa"][1], dtype="float64", weights="int8")
        accepted = lj.testing.assert_lookahead_matches_plain(
            model,
            PROMPTS,
            configs=(lj.LookaheadConfig.for_budget(16),),  # every guess source
            max_new_tokens=20,
            batch_sizes=(8,),
        )
    assert all(n > 0 for n in accepted.values()), accepted


def test_int8_params_shard_and_match_one_device(tiny_ckpts):
    """On a data=2 x model=4 mesh the int8 values shard as the float weights would and the
    scales as the weights' output axes; the tokens equal one device's."""
    ckpt = tiny_ckpts["eight_heads"][1]
    with jax.enable_x64(True):
        single = lj.load(ckpt, dtype="float64", weights="int8")
        sharded = lj.load(ckpt, dtype="float64", weights="int8", mesh=lj.make_mesh(2, 4))
        P = jax.sharding.PartitionSpec
        layers = sharded.params.layers
        assert layers.wq.q.sharding.spec == P(None, None, "model", None)
        assert layers.wq.scale.sharding.spec == P(None, "model", None)
        assert layers.w_down.q.sharding.spec == P(None, "model", None)
        assert layers.w_down.scale.sharding.spec == P(None, None)
        assert sharded.params.embed.scale.sharding.spec == P("model")
        la = lj.LookaheadConfig(4, 3, 3)
        want = lj.generate(single, PROMPTS, max_new_tokens=12, lookahead=la).token_ids
        got = lj.generate(sharded, PROMPTS, max_new_tokens=12, lookahead=la).token_ids
    assert got == want


@pytest.mark.parametrize(
    "spec,w_shape,contracted,x_shape",
    [
        ("brd,vd->brv", (64, 12), (1,), (2, 3, 12)),  # the tied LM head: rows are outputs
        ("btd,dhe->bthe", (12, 4, 16), (0,), (2, 3, 12)),  # wq: chunks of the head_dim axis
        ("bthe,hed->btd", (4, 6, 32), (0, 1), (1, 2, 4, 6)),  # wo: two contracted axes
    ],
)
def test_chunked_int8_einsum_equals_the_whole(monkeypatch, spec, w_shape, contracted, x_shape):
    """On CPU a large int8 matrix is converted a chunk at a time; tiny chunks here, so
    every output axis position and chunk boundary is crossed."""
    rng = np.random.default_rng(1)
    w = quantize.quantize(jnp.asarray(rng.standard_normal(w_shape)), contracted)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    whole = quantize.einsum(spec, x, w)
    monkeypatch.setattr(quantize, "CHUNK_BYTES", 64)
    n, _ = quantize._chunking(spec, w, x.dtype)
    assert n >= 4
    np.testing.assert_allclose(quantize.einsum(spec, x, w), whole, rtol=1e-6, atol=1e-6)
