"""The compiled decode loop copies no weights and no state: read from its HLO.

A step reads the weights and the live K/V once and writes only the new tokens' K/V in
place (docs/architecture.md). The check (decoding/loop_copies.py) reads the loop program
as XLA compiled it and lists every copy, transpose or slice of a weight matrix, a layer's
K/V buffer, the pool, a recycling table or the token buffer made inside the loop; here it
must find none, for plain and lookahead steps, at several batch sizes and on a mesh. The
cache is longer than the attention's block, so the loop over blocks is in the program.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import pytest

import lookahead_jax as lj
from lookahead_jax import decoding
from lookahead_jax.decoding import loop, programs
from lookahead_jax.decoding.decode_state import DecodeSpec
from lookahead_jax.decoding.grammar_rows import GrammarRows
from lookahead_jax.decoding.loop_copies import loop_copies, protected_shapes
from lookahead_jax.decoding.sampling import RowSampling
from lookahead_jax.distributed import sharding
from lookahead_jax.engine.grammar_bank import GrammarBank
from lookahead_jax.models import cpu_kernel, packed
from lookahead_jax.models.llama import attention_block_for
from lookahead_jax.models.llama_params import stack_layers

PROMPT, CAP, BLOCK = 16, 64, 24  # S = 16 + 64 + E > 24: several attention blocks


def decode_loop(
    model, lookahead, batch: int, sampled: bool = False, name: str = "run_loop", grammar=False
):
    """(the compiled decode loop, its spec, the start program's argument shapes); name:
    run_loop, or run_plain (plain steps over the lookahead state: auto's plain rounds);
    grammar: rows follow grammars (16-state tables: grammar_rows.py)."""
    spec = DecodeSpec(
        lm=model.lm,
        eos_ids=tuple(model.eos_ids),
        sampled=sampled,
        lookahead=lookahead,
        cache_dtype="float32",
        grammar=grammar,
    )
    rows = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct((batch, *shape), dtype)  # noqa: E731
    sampling = RowSampling.shaped(batch)
    args = (model.params, rows(PROMPT), rows(), rows(), rows(2, dtype=jnp.uint32), sampling)
    if grammar:
        tables = GrammarBank([], model.lm.vocab_size, shape=(16, 64, 4)).shaped()
        args = (*args, None, GrammarRows(rows(), tables))
    exe, _ = programs.compiled(model, spec, CAP, args, name)
    return exe, spec, args


def copies(
    model, lookahead, batch: int, sampled: bool = False, name: str = "run_loop", grammar=False
) -> list:
    exe, spec, args = decode_loop(model, lookahead, batch, sampled, name, grammar)
    state = jax.eval_shape(functools.partial(decoding.start, spec=spec, new_positions=CAP), *args)
    assert state.cache.positions > BLOCK
    if model.mesh is not None:  # each device's shards too
        where = sharding.state_shardings(state, model.mesh)
        state = jax.tree.map(
            lambda x, w: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=w), state, where
        )
    return loop_copies(exe.as_text(), protected_shapes(model.params, state, min_elements=256))


@pytest.fixture(scope="module", autouse=True)
def default_cpu_emitters():
    """The programs as a user compiles them: with XLA:CPU's default (fusion) emitters, not
    the loop emitters the suite's XLA_FLAGS choose for speed (tests/conftest.py); with
    those, the plain loop at batch 3 copies a layer's K/V buffer every step. Compiled
    apart from the other tests' programs, which are cached without their options."""
    mp = pytest.MonkeyPatch()
    default = loop.compiler_options
    mp.setattr(
        loop,
        "compiler_options",
        lambda platform=None, **kw: {
            **default(platform, **kw),
            "xla_cpu_use_fusion_emitters": True,
        },
    )
    programs.clear()
    yield
    programs.clear()
    mp.undo()


@pytest.fixture(scope="module")
def model(tiny_ckpts):
    model = lj.load(tiny_ckpts["gqa"][1])
    return dataclasses.replace(model, lm=dataclasses.replace(model.lm, attention_block=BLOCK))


@pytest.mark.parametrize(
    "lookahead, batch, sampled, name",
    [
        (None, 3, False, "run_loop"),
        (lj.LookaheadConfig.for_tokens(8), 1, False, "run_loop"),
        (lj.LookaheadConfig.for_tokens(16), 3, True, "run_loop"),  # with per-row sampling
        # auto's plain rounds: the guess sources' buffers pass through, never copied
        (lj.LookaheadConfig.for_tokens(8), 1, False, "run_plain"),
        # rows under grammars: the table is read in place, never copied
        (lj.LookaheadConfig.for_tokens(16), 3, True, "grammar"),
    ],
    ids=[
        "plain-b3",
        "tokens=8-b1",
        "tokens=16-b3-sampled",
        "plain-rounds-tokens=8-b1",
        "tokens=16-b3-sampled-grammar",
    ],
)
def test_the_decode_loop_copies_no_weights_and_no_state(model, lookahead, batch, sampled, name):
    grammar = name == "grammar"
    found = copies(model, lookahead, batch, sampled, "run_loop" if grammar else name, grammar)
    assert not found, "\n".join(map(str, found))


def test_rope_angles_are_computed_once_a_step_on_the_cpu(model):
    """models/rope.py: XLA:CPU would fuse cos and sin into each layer's RoPE multiplies (q
    in two layouts, and k: 3 a layer, 6 here), evaluating them per head; computed once,
    the loop holds one cos — and one more in the conditional's branch never taken."""
    exe, _, _ = decode_loop(model, lj.LookaheadConfig.for_tokens(8), 1)
    assert exe.as_text().count(" cosine(") == 2


def test_the_argmax_logsumexp_and_noise_bits_are_the_kernels_where_the_model_is(model):
    """The decode loop's argmax (sampling.first_max_index), token recycling's logsumexp
    (sampling.logsumexp) and a sampling loop's noise bits (sampling.gumbel_noise) are the
    CPU kernel's exactly where the model's matmuls are (packed params; the loops of the
    test above); without recycling no logsumexp is computed (Verified.log_norm unread)."""
    exe, _, _ = decode_loop(model, lj.LookaheadConfig.for_tokens(8), 1)
    kernel = packed.is_packed(model.params)
    assert (cpu_kernel.ARGMAX_TARGET in exe.as_text()) == kernel
    assert (cpu_kernel.LOGSUMEXP_TARGET in exe.as_text()) == kernel
    # a sampling loop's Gumbel noise draws its bits from the kernel too (the sampled
    # program of the copies test above: compiled once)
    exe, _, _ = decode_loop(model, lj.LookaheadConfig.for_tokens(16), 3, sampled=True)
    assert (cpu_kernel.THREEFRY_TARGET in exe.as_text()) == kernel
    if kernel:
        no_recycling = lj.LookaheadConfig(n=2, w=0, g=0, tree=7, suffix=2)
        exe, _, _ = decode_loop(model, no_recycling, 1)
        assert cpu_kernel.LOGSUMEXP_TARGET not in exe.as_text()


def test_nor_on_a_mesh(model):
    on_mesh = lj.load(model.path, mesh=lj.make_mesh(data=2, model=2))
    on_mesh = dataclasses.replace(on_mesh, lm=model.lm)
    found = copies(on_mesh, lj.LookaheadConfig.for_tokens(8), 4)
    assert not found, "\n".join(map(str, found))


def while_loops(model, lookahead, batch: int) -> int:
    """How many while loops the compiled decode loop has (the loop over steps included)."""
    exe, _, _ = decode_loop(model, lookahead, batch)
    return len(re.findall(r"\swhile\(", exe.as_text()))


def test_on_accelerators_the_attention_adds_no_loop_to_a_step(model):
    """GPU and TPU (attention_block_for: the whole cache, masked): the compiled plain
    greedy decode loop has one while loop, the loop over steps, none per layer (issue 49:
    each would read its trip count back to the host and split the step's CUDA graph).
    Blocks up to the longest row, as on the CPU, are one loop per layer: the count can
    fail. (Still in other steps: sampling's bisection for top-p, a loop until its
    interval closes, and the lookahead step's loops of a fixed count over tree depth.)"""
    assert lj.load(model.path).lm.attention_block == attention_block_for("cpu") > 0
    # unpacked weights, as on a GPU: the attention is XLA's (packed float32 weights on one
    # CPU run the CPU kernel's, a custom call with no loop either)
    unpacked = lj.load(model.path, cpu_kernel=False)
    layers = model.cfg.num_layers
    blocks = dataclasses.replace(unpacked, lm=model.lm)  # BLOCK < S: a loop over blocks
    assert while_loops(blocks, None, 3) == 1 + layers
    for platform in ("gpu", "tpu"):
        lm = dataclasses.replace(model.lm, attention_block=attention_block_for(platform))
        assert while_loops(dataclasses.replace(unpacked, lm=lm), None, 3) == 1, platform


def test_the_check_finds_the_copies_of_a_scan_over_stacked_weights(model):
    """Stacked [L, ...] weights: the forward cuts each layer's matrices out of them inside
    the loop, and the check must name every one of them (so it can fail)."""
    apart = lj.load(model.path, fuse=False)  # (stack_layers stacks unfused layers)
    stacked = dataclasses.replace(apart, params=stack_layers(apart.params))
    found = copies(stacked, None, 3)
    layers, matrices = model.cfg.num_layers, 7  # wq wk wv wo gate up down
    assert len([c for c in found if "slice" in c.op]) >= layers * matrices, found
