"""Sharded decoding on 8 simulated CPU devices equals one device, token for token."""

import jax
import pytest

import lookahead_jax as lj
from lookahead_jax.distributed.sharding import parse_mesh, spec_for
from tests.helpers import accepted_guesses, random_prompts

LA = lj.LookaheadConfig(4, 3, 3)
# Each mesh decodes plain and lookahead, greedy and sampled, in two of the four pairings
# (each pairing compiles its own sharded program: seconds apiece). Lookahead on
# data=2 x model=4 is the engine test's, below, and tests/test_multihost.py's.
MESHES = {
    "data8xmodel1": (dict(data=8, model=1), [(None, 0.0), (LA, 1.0)]),
    "data1xmodel8": (dict(data=1, model=8), [(LA, 0.0), (None, 1.0)]),
}  # data=2 x model=4: tests/test_multihost.py (two processes against one device)
PROMPTS = random_prompts(8, 128, 1, 14, seed=21)


def test_eight_simulated_devices():
    assert len(jax.devices()) == 8


@pytest.fixture(scope="module")
def eight_heads(tiny_ckpts):
    return tiny_ckpts["eight_heads"][1]


@pytest.fixture(scope="module")
def single_device_reference(eight_heads):
    with jax.enable_x64(True):
        model = lj.load(eight_heads, dtype="float64")
        return {
            (la is not None, temp): lj.generate(
                model, PROMPTS, max_new_tokens=20, lookahead=la, temperature=temp, seed=5
            ).token_ids
            for la in (None, LA)
            for temp in (0.0, 1.0)
        }


@pytest.mark.parametrize("mesh_name", MESHES)
def test_mesh_gives_the_same_tokens(eight_heads, single_device_reference, mesh_name):
    sizes, runs = MESHES[mesh_name]
    with jax.enable_x64(True):
        model = lj.load(eight_heads, dtype="float64", mesh=lj.make_mesh(**sizes))
        for la, temp in runs:
            out = lj.generate(
                model, PROMPTS, max_new_tokens=20, lookahead=la, temperature=temp, seed=5
            )
            want = single_device_reference[(la is not None, temp)]
            assert out.token_ids == want, (sizes, la, temp)
            if la is not None and temp == 0:  # not vacuous: guesses were accepted
                assert accepted_guesses(out.stats) > 0, sizes


def test_engine_slots_over_the_data_axis_give_the_same_tokens(eight_heads, single_device_reference):
    """The engine's 4 slots split over data=2 (heads over model=4), 8 prompts through them,
    greedy and sampled ones in one run (settings are per row): each prompt's tokens equal
    the single-device static batch's row at its temperature."""
    temps = [1.0 if i % 2 else 0.0 for i in range(len(PROMPTS))]
    with jax.enable_x64(True):
        model = lj.load(eight_heads, dtype="float64", mesh=lj.make_mesh(data=2, model=4))
        engine = lj.Engine(model, batch=4, max_new_tokens=20, lookahead=LA, seed=5)
        reqs = [lj.Request(p, id=i, temperature=temps[i]) for i, p in enumerate(PROMPTS)]
        got = {r.id: r.token_ids for r in engine.run(reqs)}
    for i, t in enumerate(temps):
        assert got[i] == single_device_reference[(True, t)][i], (i, t)
    assert engine.stats.rounds > 1
    assert accepted_guesses(engine.stats) > 0


def test_params_are_really_sharded(eight_heads):
    model = lj.load(eight_heads, mesh=lj.make_mesh(data=2, model=4))
    assert len(model.params.layers) == 2  # one LayerParams per layer
    for layer in model.params.layers:
        wq = layer.wq  # [D, H=8, E]
        assert wq.sharding.spec == jax.sharding.PartitionSpec(None, "model", None)
        for shard in wq.addressable_shards:
            assert shard.data.shape == (wq.shape[0], 2, wq.shape[2])
        assert layer.w_down.addressable_shards[0].data.shape[0] == 128 // 4  # mlp rows
        # norms are replicated
        assert layer.attn_norm.addressable_shards[0].data.shape == layer.attn_norm.shape
    assert model.params.embed.addressable_shards[0].data.shape == (128 // 4, 64)
    per_device = {}
    for arr in jax.tree.leaves(model.params):
        for shard in arr.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    total = sum(a.nbytes for a in jax.tree.leaves(model.params))
    norms = model.params.final_norm.nbytes + sum(
        layer.attn_norm.nbytes + layer.mlp_norm.nbytes for layer in model.params.layers
    )
    for nbytes in per_device.values():  # every sharded weight is split 4 ways
        assert nbytes == pytest.approx((total - norms) / 4 + norms)


def test_biases_shard_with_their_projection_and_qk_norms_replicate():
    from lookahead_jax.models.llama import LlamaLM

    cfg = lj.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=8,
        num_kv_heads=4,
        head_dim=16,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        qk_norm=True,
    )
    layers = LlamaLM(cfg).param_shardings(lj.make_mesh(data=2, model=4)).layers
    P = jax.sharding.PartitionSpec
    for layer in layers:  # one layer's: [H, Dh], [F], [D], [Dh]
        assert layer.bq.spec == layer.bk.spec == layer.bv.spec == P("model", None)
        assert layer.b_gate.spec == layer.b_up.spec == P("model")  # as w_gate's F axis
        for replicated in (layer.bo, layer.b_down, layer.q_norm, layer.k_norm):
            assert replicated.spec == P(None)


def test_kv_heads_that_do_not_divide_are_replicated():
    mesh = lj.make_mesh(data=1, model=4)
    assert spec_for(
        ("batch", "kv_heads", "positions", "head_dim"), (1, 3, 1, 64), mesh
    ) == jax.sharding.PartitionSpec(None, None, None, None)
    assert spec_for(("embed", "mlp"), (576, 1536), mesh) == jax.sharding.PartitionSpec(
        None, "model"
    )


def test_mesh_errors(eight_heads):
    with pytest.raises(ValueError, match="needs 16 devices"):
        lj.make_mesh(data=4, model=4)
    with pytest.raises(ValueError, match="positive"):
        lj.make_mesh(data=0)
    for bad in ["data=2,model", "data=x", "pipeline=2", "data=2,data=2"]:
        with pytest.raises(ValueError, match="--mesh"):
            parse_mesh(bad)
    assert parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
    model = lj.load(eight_heads, mesh=lj.make_mesh(data=2, model=4))
    with pytest.raises(ValueError, match="does not divide"):
        lj.generate(model, PROMPTS[:3], max_new_tokens=4, lookahead=None)


# The real model on a mesh (SmolLM2-135M on data=2 x model=4 and four other meshes, plain
# and lookahead, the same tokens as one device) was scripts/bench/mesh_bench.py's check
# (script retired after 8008873: `git show 8008873:scripts/bench/mesh_bench.py`;
# benchmarks/cpu/mesh.md): its 30-layer programs compiled for 8 devices took about 95 s
# of a CI run, and the tiny models above cover every sharding rule.
