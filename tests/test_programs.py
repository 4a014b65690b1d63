"""How the decode programs are compiled: float32 matmuls at full precision (GPUs would
otherwise run them in TF32 and break exactness: benchmarks/gpu/), the user's choice of
precision respected, and cuBLAS matmuls on NVIDIA GPUs."""

import gc
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.checkpoints.loading import Model
from lookahead_jax.decoding import programs
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.llama import LlamaLM
from lookahead_jax.models.llama_params import init_params
from tests.helpers import memory_maps

CFG = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    max_position_embeddings=256,
)


def dot_precisions(dtype) -> set[str]:
    """The operand precisions of every dot in the compiled decode loop of a model."""
    programs.clear()
    model = Model(LlamaLM(CFG), init_params(CFG, jax.random.PRNGKey(0), dtype), eos_ids=())
    lj.generate(model, [[1, 2, 3]], max_new_tokens=2, lookahead=None)
    texts = [exe.as_text() for (_, name), exe in programs._COMPILED.items() if name == "run_loop"]
    programs.clear()
    assert len(texts) == 1
    return set(re.findall(r"operand_precision=\{([a-z]+),", texts[0]))


@pytest.mark.parametrize(
    "dtype, user, want",
    [
        (jnp.float32, None, {"highest"}),
        (jnp.float32, "default", set()),  # the user's choice (e.g. TF32 on a GPU) wins
        (jnp.bfloat16, None, set()),  # the platform's default: no precision config
    ],
)
def test_matmul_precision_of_the_decode_programs(dtype, user, want):
    assert programs.matmul_precision(dtype) == ("highest" if dtype == jnp.float32 else None)
    if user is None:
        assert dot_precisions(dtype) == want
        return
    with jax.default_matmul_precision(user):
        assert programs.matmul_precision(dtype) == user
        assert dot_precisions(dtype) == want


def test_compiler_options_per_platform():
    """Copy insertion by region analysis everywhere (else the cache is copied around the
    attention's block loop: tests/test_loop_copies.py); on GPUs Triton GEMMs (faster than
    cuBLAS at every measured shape; for int8 they fuse its convert)."""
    region = "copy_insertion_use_region_analysis"
    assert programs.compiler_options("cpu") == {f"xla_cpu_{region}": True}
    assert programs.compiler_options("gpu") == {
        "xla_gpu_enable_triton_gemm": True,
        f"xla_gpu_{region}": True,
    }
    assert programs.compiler_options("tpu") == {}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_programs_beyond_max_kept_are_dropped_and_their_code_unmapped(monkeypatch):
    """The least recently used executables go, and with them their JIT code's memory
    mappings: a process that decodes many shapes stays below vm.max_map_count."""
    monkeypatch.setattr(programs, "MAX_KEPT", 2)
    programs.clear()
    model = Model(LlamaLM(CFG), init_params(CFG, jax.random.PRNGKey(0), jnp.float32), eos_ids=())

    def decode_batch(b: int) -> int:  # new shapes: a start and a loop program (one
        # prompt, of a longer bucket each time: several prompts would prefill packed, a
        # start program keyed apart from its loop's)
        lj.generate(model, [[1, 2, 3] * 6 * 2 ** (b - 1)], max_new_tokens=2, lookahead=None)
        gc.collect()
        return memory_maps()

    first = decode_batch(1)
    pair_1 = set(programs._COMPILED)
    evicting = decode_batch(2) - first  # pair 1 dropped as pair 2 came
    assert len(programs._COMPILED) == 2 and not pair_1 & set(programs._COMPILED)
    assert len(programs._JITTED) == 1
    monkeypatch.setattr(programs, "MAX_KEPT", 100)
    keeping = decode_batch(3) - first - evicting  # nothing dropped
    assert len(programs._COMPILED) == 4
    programs.clear()
    assert evicting < keeping / 2, (evicting, keeping)


def test_every_program_cache_is_bounded_and_cleared_by_one_call():
    from lookahead_jax.decoding.program_caches import ProgramCache
    from lookahead_jax.engine import slot_state

    cache = ProgramCache("test", 2)
    made = [cache.get_or_make(k, lambda k=k: object()) for k in "abc"]
    assert cache.get("a") is None and cache.get("c") is made[2] and len(cache) == 2
    assert cache.get_or_make("c", object) is made[2]  # kept: not made again
    jitted = slot_state.program(slot_state.retire, None)
    assert slot_state.program(slot_state.retire, None) is jitted
    programs.clear()  # this module's decode programs, the slot edits, chunks, and this one
    assert len(cache) == 0 and slot_state.program(slot_state.retire, None) is not jitted


def test_one_key_for_an_argument_as_a_shape_a_device_array_or_a_host_array():
    """On one device a program compiled from argument shapes (the server's warm-up: its
    grammar tables as GrammarBank.shaped) is the one a call with device arrays
    (GrammarBank.on_device) or host arrays finds: keyed apart, a fresh server's first
    chats compiled their prefills again in the foreground."""
    from lookahead_jax.decoding.decode_state import DecodeSpec

    model = Model(LlamaLM(CFG), init_params(CFG, jax.random.PRNGKey(0), jnp.float32), eos_ids=())
    spec = DecodeSpec(lm=model.lm, eos_ids=())
    host = np.zeros((4, 8), np.int32)
    shape = jax.ShapeDtypeStruct(host.shape, host.dtype)
    given = (shape, jnp.asarray(host), jax.device_put(host, jax.devices()[0]), host)
    keys = {programs._key(model, spec, 8, (model.params, x)) for x in given}
    assert len(keys) == 1
    assert programs._key(model, spec, 8, (model.params, host[:2])) not in keys  # shapes count
    # params on another device: programs of their own (what runs there is compiled there)
    if len(jax.devices()) > 1:
        elsewhere = jax.device_put(model.params, jax.devices()[-1])
        assert programs._key(model, spec, 8, (elsewhere, shape)) not in keys
