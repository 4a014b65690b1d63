"""Weight-only int8 (quantize.py): the quantizer's bounds, the int8 forward against the
float forward of the very weights it stands for, exactness of lookahead on the int8
model, sharded int8 equal to one device; Q8_0 blocks, and a Q8_0 GGUF's own int8 values
and scales back from its converted checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.errors import UserInputError
from lookahead_jax.models import quantize
from lookahead_jax.models.llama import forward
from lookahead_jax.models.llama_params import flat_names, from_flat, param_specs
from lookahead_jax.models.quantize import Int8Weight
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
    err = np.abs(np.asarray(quantize.dequantize(q) - w))
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
        flat = flat_names(int8.params, is_leaf=lambda x: isinstance(x, Int8Weight))
        assert set(quantize.CONTRACTED) & set(flat) == {
            n for n, w in flat.items() if isinstance(w, Int8Weight)
        }
        dq = {
            n: quantize.dequantize(w) if isinstance(w, Int8Weight) else w for n, w in flat.items()
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


# int8 only: Q8_0 differs in where its scales multiply, not in how a T-token pass
# agrees with 1-token passes (test_chunked_int8_einsum; its forward against the float
# one: test_q8_0_gguf_comes_back_as_its_own_int8_values_and_scales)
@pytest.mark.parametrize("weights", ["int8"])
def test_int8_lookahead_equals_int8_plain(tiny_ckpts, weights):
    """Greedy lookahead on the int8 model == greedy plain decoding of the same int8 model
    (float64 activations, so no near-tie can hide a difference)."""
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts["gqa"][1], dtype="float64", weights=weights)
        accepted = lj.testing.assert_lookahead_matches_plain(
            model,
            PROMPTS,
            configs=(lj.LookaheadConfig.for_tokens(16),),  # every guess source
            max_new_tokens=20,
            batch_sizes=(8,),
        )
    assert all(n > 0 for n in accepted.values()), accepted


@pytest.mark.parametrize("weights", ["int8", "q8_0"])
def test_int8_params_shard_and_match_one_device(tiny_ckpts, weights):
    """On a data=2 x model=4 mesh the int8 values shard as the float weights would and the
    scales with them (per channel: the output axes; q8_0: block scales also split where
    the blocks do, as w_down's over its input); the tokens equal one device's."""
    ckpt = tiny_ckpts["eight_heads"][1]
    with jax.enable_x64(True):
        single = lj.load(ckpt, dtype="float64", weights=weights)
        sharded = lj.load(ckpt, dtype="float64", weights=weights, mesh=lj.make_mesh(2, 4))
        P = jax.sharding.PartitionSpec
        layer = sharded.params.layers[1]  # one layer's arrays
        assert layer.wq.q.sharding.spec == P(None, "model", None)
        assert layer.w_down.q.sharding.spec == P("model", None)
        if weights == "int8":
            assert layer.wq.scale.sharding.spec == P("model", None)
            assert layer.w_down.scale.sharding.spec == P(None)
            assert sharded.params.embed.scale.sharding.spec == P("model")
        else:  # [D / 32, H, hd] and [F / 32, D]
            assert layer.wq.scale.sharding.spec == P(None, "model", None)
            assert layer.w_down.scale.sharding.spec == P("model", None)
            assert sharded.params.embed.scale.sharding.spec == P("model", None)
        # plain: the sharded forward is the same code for 1 or T tokens (lookahead on a
        # mesh: tests/test_sharding.py; on int8: the test above)
        want = lj.generate(single, PROMPTS, max_new_tokens=12, lookahead=None).token_ids
        got = lj.generate(sharded, PROMPTS, max_new_tokens=12, lookahead=None).token_ids
    assert got == want


@pytest.mark.parametrize(
    "spec,w_shape,contracted,x_shape,block",
    [
        ("brd,vd->brv", (64, 12), (1,), (2, 3, 12), 0),  # the tied LM head: rows are outputs
        ("btd,dhe->bthe", (12, 4, 16), (0,), (2, 3, 12), 0),  # wq: chunks of head_dim
        ("bthe,hed->btd", (4, 6, 32), (0, 1), (1, 2, 4, 6), 0),  # wo: two contracted axes
        # q8_0: the block scales are cut with their values
        ("brd,vd->brv", (64, 64), (1,), (2, 3, 64), 32),
        ("btd,dhe->bthe", (64, 4, 16), (0,), (2, 3, 64), 32),
        ("bthe,hed->btd", (4, 16, 32), (0, 1), (1, 2, 4, 16), 32),
    ],
)
def test_chunked_int8_einsum_equals_the_whole(
    monkeypatch, spec, w_shape, contracted, x_shape, block
):
    """On CPU a large int8 matrix is converted a chunk at a time; tiny chunks here, so
    every output axis position and chunk boundary is crossed."""
    rng = np.random.default_rng(1)
    w = quantize.quantize(jnp.asarray(rng.standard_normal(w_shape)), contracted, block=block)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    whole = quantize.einsum(spec, x, w)
    monkeypatch.setattr(quantize, "CHUNK_BYTES", 64)
    n, _ = quantize._chunking(spec, w, x.dtype)
    assert n >= 4
    tol = 1e-5 if block else 1e-6  # block scales: more float32 terms, other order
    np.testing.assert_allclose(quantize.einsum(spec, x, w), whole, rtol=tol, atol=tol)


# ---------------------------------------------------------------- Q8_0: blocks of 32


def test_q8_0_blocks_worked_example_and_the_flattened_contraction():
    """One scale per 32 consecutive inputs; wo's inputs are (heads, head_dim) flattened in
    order, as llama.cpp's [out, heads * head_dim] row, so a block may span two heads."""
    w = np.zeros((64, 3), np.float32)  # [in 64, out 3]
    w[:32, 0] = 0.01 * np.arange(-16, 16)  # block 0 of channel 0: max |w| = 0.16
    w[0, 0] = 1.27  # ... now max |w| = 1.27 -> scale 0.01
    w[32:, 0] = 0.5  # block 1: scale 0.5 / 127, every q = 127
    q = quantize.quantize(jnp.asarray(w), (0,), block=32)
    assert q.scale.shape == (2, 3) and q.contracted == (-2,)
    np.testing.assert_allclose(q.scale[:, 0], [0.01, 0.5 / 127], rtol=1e-6)
    np.testing.assert_array_equal(q.q[:4, 0], [127, -15, -14, -13])
    np.testing.assert_array_equal(q.q[32:, 0], 127)
    np.testing.assert_array_equal(q.q[:, 1:], 0)  # all-zero blocks stay exactly zero
    rng = np.random.default_rng(2)
    wo = jnp.asarray(rng.standard_normal((3, 4, 16, 8)))  # [L, H, Dh 16, D]: 2 heads/block
    q = quantize.quantize(wo, (1, 2), block=32)
    assert q.scale.shape == (3, 2, 8)
    flat = np.asarray(wo).reshape(3, 2, 32, 8)  # (H, Dh) flattened, then cut in blocks
    np.testing.assert_allclose(q.scale, np.abs(flat).max(axis=2) / 127, rtol=1e-6)
    err = np.abs(np.asarray(quantize.dequantize(q) - wo)).reshape(3, 2, 32, 8)
    assert (err <= np.asarray(q.scale)[:, :, None] / 2 * (1 + 1e-5)).all()
    x = jnp.asarray(rng.standard_normal((2, 5, 4, 16)))
    np.testing.assert_allclose(
        quantize.einsum("bthe,hed->btd", x, jax.tree.map(lambda a: a[0], q)),
        jnp.einsum("bthe,hed->btd", x, quantize.dequantize(q)[0]),
        rtol=1e-5,
    )


def test_q8_0_needs_whole_blocks():
    """A contraction that is not a multiple of 32 cannot hold Q8_0 blocks: one clear line,
    from the specs (lj.load checks them before reading any weight)."""
    cfg = lj.LlamaConfig.from_hf_dict(
        dict(vocab_size=16, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2)
    )  # fmt: skip
    param_specs(cfg, "int8")  # per-channel scales take any shape
    with pytest.raises(UserInputError, match=r"q8_0 cuts .* blocks of 32, but embed's embed is 48"):
        param_specs(cfg, "q8_0")


@pytest.mark.parametrize("variant", ["gqa", "qwen3_bias"])
def test_q8_0_gguf_comes_back_as_its_own_int8_values_and_scales(tmp_path, variant):
    """A Q8_0 GGUF converted (dequantized exactly to float32) and loaded with
    weights="q8_0" holds the file's int8 values and float16 scales exactly, for every
    matrix (llama's q/k rows permuted back; qwen3: tied embeddings, head_dim 24 so wo's
    blocks span heads), and its forward equals the float checkpoint's."""
    import gguf

    from lookahead_jax.checkpoints.convert.convert import convert
    from tests import tiny
    from tests.test_convert import write_tiny_gguf

    hf = tiny.hf_model(variant, seed=7)
    write_tiny_gguf(hf, tmp_path / "q8.gguf", quant="Q8_0")
    convert(tmp_path / "q8.gguf", tmp_path / "ckpt", progress=False)
    floats = lj.load(tmp_path / "ckpt", cpu_kernel=False)  # flat names of float arrays
    q8 = lj.load(tmp_path / "ckpt", weights="q8_0")
    flat = flat_names(q8.params, is_leaf=lambda x: isinstance(x, Int8Weight))
    want = flat_names(floats.params)
    for name in set(quantize.CONTRACTED) & set(flat):
        np.testing.assert_array_equal(quantize.dequantize(flat[name]), want[name], err_msg=name)

    # the bytes themselves: ffn_up of layer 1 is [out F, in D] in 34-byte blocks
    reader = gguf.GGUFReader(str(tmp_path / "q8.gguf"))
    raw = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    assert raw.tensor_type == gguf.GGMLQuantizationType.Q8_0
    blocks = np.asarray(raw.data).reshape(hf.config.intermediate_size, -1, 34)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]  # [F, D / 32]
    qs = blocks[..., 2:].copy().view(np.int8).reshape(hf.config.intermediate_size, -1)
    up = flat["layers/w_up"]  # q [L, D, F], scale [L, D / 32, F]
    np.testing.assert_array_equal(np.asarray(up.q[1]), qs.T)
    np.testing.assert_array_equal(np.asarray(up.scale[1]), d.T.astype(np.float32))

    tokens = jnp.asarray([PROMPTS[0]], jnp.int32)
    pos = jnp.arange(tokens.shape[1])[None]
    mask = jnp.tril(jnp.ones((1, tokens.shape[1], tokens.shape[1]), bool))
    got = forward(q8.params, q8.cfg, tokens, pos, mask)[0]
    base = forward(floats.params, floats.cfg, tokens, pos, mask)[0]
    np.testing.assert_allclose(got, base, rtol=0, atol=1e-5)
