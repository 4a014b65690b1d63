"""Jacobi-consistency fine-tuning (lookahead_jax.training) on a tiny model: the layout's
worked example, the trajectories end at the greedy output, the loss is zero at the fixed
point and its gradient matches finite differences, training lowers the Jacobi iterations
and its checkpoint decodes exactly, and a resumed run equals an uninterrupted one."""

import dataclasses
import importlib
import json
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax import training as C
from lookahead_jax.models.llama_params import flat_names
from lookahead_jax.training import layout
from lookahead_jax.training.loss import losses
from lookahead_jax.training.train import batch_logits, loss_fn, sample_batch
from tests.fork_runner import run_module
from tests.helpers import random_prompts

PROMPTS = random_prompts(16, 128, 2, 10, seed=3)
# the module (the package's `train` attribute is the function of that name)
TRAIN_MODULE = importlib.import_module("lookahead_jax.training.train")
BLOCK, BLOCKS, MAX_PROMPT = 4, 3, 12


@pytest.fixture(scope="module")
def base(tiny_ckpts):
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts["gqa"][1], dtype="float64")
        data = C.collect(model, PROMPTS, BLOCK, BLOCKS, MAX_PROMPT, batch=8)
    return model, data


def test_layout_worked_example():
    """layout.py's docstring: P = 3, n = 2, m = 2, a 2-token prompt, out_len 4."""
    pos, mask = layout.positions_and_mask(jnp.asarray([2]), jnp.asarray([4]), 3, 2, 2)
    np.testing.assert_array_equal(pos[0, 1:], [0, 1, 2, 3, 4, 5, 2, 3, 4, 5])
    sees = {r: np.flatnonzero(mask[0, r]).tolist() for r in range(11)}
    assert sees[0] == [0]  # padding sees only itself
    assert sees[5] == [1, 2, 3, 4, 5]  # f: the causal true text
    assert sees[7] == [1, 2, 7]  # g0[0]: the prompt, itself
    assert sees[8] == [1, 2, 7, 8]  # g0[1]
    assert sees[9] == [1, 2, 3, 4, 9]  # g1[0]: the prompt, y*[:2], itself
    assert sees[10] == [1, 2, 3, 4, 9, 10]
    np.testing.assert_array_equal(layout.logits_rows(3, 2, 2), np.arange(2, 10))


def test_trajectories_end_at_the_greedy_output(base):
    model, data = base
    with jax.enable_x64(True):
        greedy = lj.generate(
            model, PROMPTS, max_new_tokens=BLOCK * BLOCKS, lookahead=None
        ).token_ids
    assert data.meta["tokens"] > 0.8 * len(PROMPTS) * BLOCK * BLOCKS  # few EOS cuts
    for e, y in enumerate(greedy):
        n_kept = data.out_len[e]
        assert n_kept % BLOCK == 0 and list(data.fixed[e, :n_kept]) == y[:n_kept]
        np.testing.assert_array_equal(data.states[e, BLOCK, :n_kept], data.fixed[e, :n_kept])
    kept = np.arange(BLOCKS)[None] < (data.out_len // BLOCK)[:, None]
    assert (data.iters[kept] <= BLOCK).all() and data.iters[kept].mean() > 2  # real work


def test_trajectories_file_round_trip_and_bad_files(base, tmp_path):
    _, data = base
    path = C.save_trajectories(data, tmp_path / "t.npz")
    again = C.load_trajectories(path)
    assert again.meta == data.meta
    for f in ("prompt", "prompt_len", "fixed", "out_len", "states", "iters"):
        np.testing.assert_array_equal(getattr(again, f), getattr(data, f))
    # a file from before the rename names the longest prompt prompt_slots
    meta = {("prompt_slots" if k == "max_prompt_tokens" else k): v for k, v in data.meta.items()}
    old = C.save_trajectories(dataclasses.replace(data, meta=meta), tmp_path / "old.npz")
    assert C.load_trajectories(old).max_prompt_tokens == data.max_prompt_tokens
    path.write_bytes(path.read_bytes()[:100])  # cut short
    with pytest.raises(lj.CheckpointError, match="not a trajectory dataset"):
        C.load_trajectories(path)


def test_loss_is_zero_at_the_fixed_point_and_its_gradient_is_right(base):
    """Consistency is exactly 0 when the guesses are y* and positive away from it. The
    gradient (the fixed point's distributions held constant) matches a central finite
    difference of  ar(θ) + consistency(fixed-point logits at θ0, guess logits at θ)
    along a random direction (float64)."""
    model, data = base
    tc = C.TrainConfig(teacher="self")
    batch = {k: jnp.asarray(v) for k, v in sample_batch(data, 0, 4, seed=0).items()}
    at_fixed = dict(batch, guess=batch["fixed"])
    N = BLOCK * BLOCKS
    with jax.enable_x64(True):
        _, (cons, ar) = loss_fn(model.lm, model.params, at_fixed, tc, BLOCK)
        assert float(cons) == 0.0 and float(ar) > 0
        _, (cons, _) = loss_fn(model.lm, model.params, batch, tc, BLOCK)
        assert float(cons) > 1e-3

        grads = jax.jit(jax.grad(lambda p: loss_fn(model.lm, p, batch, tc, BLOCK)[0]))(model.params)
        target = batch_logits(model.lm, model.params, batch, BLOCK)[:, :N]

        @jax.jit
        def held(params):  # the target frozen at θ0 by hand, not by stop_gradient
            logits = batch_logits(model.lm, params, batch, BLOCK)
            cons, _ = losses(jnp.concatenate([target, logits[:, N:]], 1), batch["fixed"],
                             batch["guess"], batch["out_len"], BLOCK)  # fmt: skip
            _, ar = losses(logits, batch["fixed"], batch["guess"], batch["out_len"], BLOCK)
            return cons + ar

        leaves, treedef = jax.tree.flatten(model.params)
        keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
        direction = treedef.unflatten(
            [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)]
        )
        eps = 1e-6
        moved = [jax.tree.map(lambda p, d, s=s: p + s * eps * d, model.params, direction)
                 for s in (1, -1)]  # fmt: skip
        numeric = (float(held(moved[0])) - float(held(moved[1]))) / (2 * eps)
        pairs = zip(jax.tree.leaves(grads), jax.tree.leaves(direction), strict=True)
        analytic = sum(float(jnp.vdot(g, d)) for g, d in pairs)
    assert abs(numeric - analytic) <= 1e-6 * abs(analytic), (numeric, analytic)


def test_base_teacher_is_a_distance_to_the_base_and_its_gradient_is_right(base):
    """Teacher "base": at the base's own parameters the next-token KL is 0 and the
    consistency term is the "self" teacher's; moved away from them both are positive, and
    the gradient (the base is a separate constant: no stop-gradient involved) matches a
    central finite difference of the loss itself (float64)."""
    model, data = base
    tc = C.TrainConfig(teacher="base")
    batch = {k: jnp.asarray(v) for k, v in sample_batch(data, 0, 4, seed=0).items()}
    with jax.enable_x64(True):
        _, (cons, ar) = loss_fn(model.lm, model.params, batch, tc, BLOCK, model.params)
        _, (cons_self, _) = loss_fn(
            model.lm, model.params, batch, C.TrainConfig(teacher="self"), BLOCK
        )
        assert abs(float(ar)) < 1e-12 and float(cons) == pytest.approx(float(cons_self), 1e-12)

        leaves, treedef = jax.tree.flatten(model.params)
        keys = jax.random.split(jax.random.PRNGKey(1), 2 * len(leaves))
        d1, d2 = (
            treedef.unflatten([jax.random.normal(k, x.shape, x.dtype)
                               for k, x in zip(keys[i::2], leaves, strict=True)])
            for i in (0, 1)
        )  # fmt: skip
        moved = jax.tree.map(lambda p, d: p + 1e-2 * d, model.params, d1)

        @jax.jit
        def total(params):
            return loss_fn(model.lm, params, batch, tc, BLOCK, model.params)

        (_, (_, ar_moved)), grads = total(moved), jax.jit(jax.grad(lambda p: total(p)[0]))(moved)
        assert float(ar_moved) > 1e-4
        eps = 1e-6
        ends = [jax.tree.map(lambda p, d, s=s: p + s * eps * d, moved, d2) for s in (1, -1)]
        numeric = (float(total(ends[0])[0]) - float(total(ends[1])[0])) / (2 * eps)
        pairs = zip(jax.tree.leaves(grads), jax.tree.leaves(d2), strict=True)
        analytic = sum(float(jnp.vdot(g, d)) for g, d in pairs)
    assert abs(numeric - analytic) <= 1e-6 * abs(analytic), (numeric, analytic)


@pytest.mark.parametrize("teacher", ["self", "base"])
def test_training_lowers_jacobi_iterations_and_decodes_exactly(base, tmp_path, teacher):
    """A few dozen updates on the model's own trajectories: its Jacobi iterations per
    block fall (re-collected with the tuned model), and the written checkpoint loads and
    passes the exactness harness (lookahead greedy == plain greedy, float64)."""
    model, data = base
    tc = C.TrainConfig(
        steps=30, batch=8, learning_rate=3e-3, warmup=2, save_every=10, teacher=teacher
    )
    with jax.enable_x64(True):
        params = C.train(model, data, tmp_path / "work", tc, progress=False)
        out = C.write_checkpoint(model, params, tmp_path / "tuned", {"kind": "consistency"})
        tuned = lj.load(out, dtype="float64")
        after = C.collect(tuned, PROMPTS, BLOCK, BLOCKS, MAX_PROMPT, batch=8)
        lj.testing.assert_lookahead_matches_plain(
            tuned,
            PROMPTS[:6],
            configs=(lj.LookaheadConfig.for_tokens(8),),
            max_new_tokens=16,
            batch_sizes=(6,),
        )
    before_i = data.meta["mean_iterations_per_block"]
    after_i = after.meta["mean_iterations_per_block"]
    assert after_i < 0.9 * before_i, (before_i, after_i)


def test_resume_after_an_interruption_equals_an_uninterrupted_run(base, tmp_path, monkeypatch):
    """SIGTERM arrives while micro-batch 2 is made (mid-accumulation: 2 per update): that
    step finishes, the state after it is saved, and running again ends where an
    uninterrupted run does. A changed setting is refused by name."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    model, data = base
    tc = C.TrainConfig(steps=4, batch=4, accumulate=2, learning_rate=1e-3, warmup=1, save_every=4)

    def sample_and_signal(data, micro_step, batch, seed):
        if micro_step == 2:
            signal.raise_signal(signal.SIGTERM)
        return sample_batch(data, micro_step, batch, seed)

    with jax.enable_x64(True):
        straight = C.train(model, data, tmp_path / "a", tc, progress=False)
        with monkeypatch.context() as m:
            m.setattr(TRAIN_MODULE, "sample_batch", sample_and_signal)
            with pytest.raises(C.TrainingInterrupted, match="SIGTERM after micro-step 3"):
                C.train(model, data, tmp_path / "b", tc, progress=False)
        resumed = C.train(model, data, tmp_path / "b", tc, progress=False)
        with pytest.raises(lj.UserInputError, match=r"train\.seed \(0 then, 1 now\)"):
            C.train(model, data, tmp_path / "b", dataclasses.replace(tc, seed=1), progress=False)
        bf16 = dataclasses.replace(
            model, params=jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
        )
        with pytest.raises(lj.UserInputError, match="float32 or float64"):
            C.train(bf16, data, tmp_path / "c", tc, progress=False)
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(model.params), strict=True)
    )


def test_mix_walks_from_the_base_to_the_trained_parameters(base):
    model, _ = base
    with jax.enable_x64(True):
        trained = jax.tree.map(lambda x: 2 * x + 1, model.params)
        for fraction in (0.25, 1.0):
            mixed = C.mix(model.params, trained, fraction)
            for b, m in zip(jax.tree.leaves(model.params), jax.tree.leaves(mixed), strict=True):
                np.testing.assert_allclose(m, b + fraction * (b + 1), rtol=1e-12)
    with pytest.raises(lj.UserInputError, match="mix must be in"):
        C.mix(model.params, trained, 1.5)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--prompts", "{missing}"], "--prompts not found"),
        (["--prompts", "{bad}"], "bad.jsonl line 2: unknown key 'text'"),
        (["--prompts", "{good}", "--block", "1"], "--block must be >= 2"),
        (["--prompts", "{good}", "--prompt-slots", "0"], "--max-prompt-tokens"),  # old name
        (["--prompts", "{good}", "--warmup", "300"], "warmup must be in [0, steps=200)"),
        (["--prompts", "{good}", "--teacher", "me"], "teacher must be one of ('self', 'base')"),
        (["--prompts", "{good}", "--mix", "0"], "--mix must be in (0, 1], got 0.0"),
    ],
)
def test_cli_bad_input_is_one_line(tiny_ckpts, tmp_path, args, needle):
    (tmp_path / "good.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "hi"}\n{"text": "no"}\n')
    paths = {"missing": tmp_path / "nope.jsonl", "bad": tmp_path / "bad.jsonl"}
    paths["good"] = tmp_path / "good.jsonl"
    argv = [a.format(**paths) for a in args]
    cmd = ["--ckpt", str(tiny_ckpts["gqa"][1]), "--out", str(tmp_path / "out"), *argv]
    r = run_module("lookahead_jax.training", cmd, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_training_on_a_mesh_equals_one_device(tiny_ckpts, tmp_path):
    """Data parallel (batch rows over data=2) and model parallel (heads and MLP over
    model=4, the decoding rules): the trained params equal one device's."""
    ckpt = tiny_ckpts["eight_heads"][1]
    tc = C.TrainConfig(steps=2, batch=4, learning_rate=1e-3, warmup=1)
    with jax.enable_x64(True):
        single = lj.load(ckpt, dtype="float64")
        data = C.collect(single, PROMPTS[:4], BLOCK, 2, MAX_PROMPT, batch=4)
        sharded = lj.load(ckpt, dtype="float64", mesh=lj.make_mesh(2, 4))
        want = C.train(single, data, tmp_path / "one", tc, progress=False)
        got = C.train(sharded, data, tmp_path / "mesh", tc, progress=False)
    w_up = lambda params: params.layers[0].w_up  # noqa: E731
    assert w_up(got).sharding.spec == w_up(sharded.params).sharding.spec
    assert not np.array_equal(np.asarray(w_up(want)), np.asarray(w_up(single.params)))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)


def test_weight_decay_spares_norms_and_biases(tiny_ckpts):
    """Norms and biases ([D], [F]: one layer's, as matrices' rows would be) are spared by
    name, in every layer (flat_names stacks the per-layer masks)."""
    norms = ["final_norm", "layers/attn_norm", "layers/mlp_norm"]
    want = {
        "llama_bias": ["layers/b_down", "layers/b_gate", "layers/b_up", "layers/bk",
                       "layers/bo", "layers/bq", "layers/bv"],
        "qwen3_bias": ["layers/bk", "layers/bo", "layers/bq", "layers/bv", "layers/k_norm",
                       "layers/q_norm"],
    }  # fmt: skip
    for variant, spared_too in want.items():
        params = lj.load(tiny_ckpts[variant][1], cpu_kernel=False).params  # as training has them
        mask = flat_names(TRAIN_MODULE.decayed(params))
        assert all(np.all(m) or not np.any(m) for m in mask.values())  # the same per layer
        spared = sorted(name for name, decays in mask.items() if not np.any(decays))
        assert spared == sorted(norms + spared_too), (variant, spared)
        assert np.all(mask["layers/wq"]) and np.all(mask["layers/w_down"]) and mask["embed"]
