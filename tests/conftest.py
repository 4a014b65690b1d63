"""Test setup: 8 simulated CPU devices, offline hubs, a repo-local cache directory."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault(
    "LOOKAHEAD_JAX_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "test")
)
# One persistent compilation cache per run, fresh (nothing carried over from an earlier
# run), shared by the xdist workers and the commands the tests start: the decode programs
# of the real model take seconds each to compile (its 30 layers unrolled) and many tests,
# in several processes, compile the same ones. Made here in the controlling process,
# which the workers inherit the variable from; removed when that process exits.
if "LOOKAHEAD_JAX_COMPILE_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _run_cache = tempfile.mkdtemp(prefix="lookahead-jax-compiled-")
    os.environ["LOOKAHEAD_JAX_COMPILE_CACHE"] = _run_cache
    atexit.register(shutil.rmtree, _run_cache, ignore_errors=True)

# The suite is compile-bound: most tests run tiny models for a few steps, and each new
# shape or layout is a new program. LLVM's optimizations at level 0 cut the CPU compile
# time by about 30 % (a tiny model's tokens=16 test: 36 -> 25 s on an AMD EPYC) and make
# the real model's steps a little slower (its exactness test: 46 -> 50 s). XLA:CPU's
# older loop emitters instead of its MLIR fusion emitters halve it again (a tiny model's
# tokens=16 and 4,3,3 programs at batch 8: 9.4-10.9 -> 4.2-5.5 s of compiling, 3 runs
# each, AMD EPYC), and its 2048-row sampled steps run no slower (5.8-6.3 -> 5.1-5.3 s).
# Results do not depend on either: the exactness tests compare programs compiled alike,
# and the parity tests hold a tolerance. Workers and the commands the tests start
# inherit them.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = (
        "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    )

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import contextlib  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402

import pytest  # noqa: E402

from lookahead_jax.decoding import programs  # noqa: E402
from tests import tiny  # noqa: E402
from tests.helpers import memory_maps  # noqa: E402


def _max_memory_maps() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530  # Linux's default


MAX_MEMORY_MAPS = _max_memory_maps()  # read once: the kernel setting does not change mid-run


@pytest.fixture(autouse=True)
def _few_memory_maps():
    """Drop every compiled program once the process holds half the mappings Linux allows.

    Each XLA:CPU executable maps its JIT code in a few dozen to hundreds of regions, and
    a pytest worker compiles thousands of programs: at vm.max_map_count (65530) the next
    compile segfaults (workers died so at 64660 mappings, in whatever test came next).
    """
    yield
    if memory_maps() > MAX_MEMORY_MAPS // 2:
        programs.clear()
        jax.clear_caches()
        gc.collect()


# The files that take longest, longest first (seconds of their tests summed, one run of
# the suite on an AMD EPYC, 2 workers, junitxml): scripts/test.sh hands whole files to
# the workers in collection order (--dist loadfile --no-loadscope-reorder), so these
# start first and the suite ends on short files. In xdist's own order (most tests
# first) a long file could start last: one worker ran it alone for ~45 s at the end.
LONGEST_FILES = (
    "test_lookahead_exactness.py",  # 138 s
    "test_server.py",  # 88
    "test_sampling_distribution.py",  # 72
    "test_engine.py",  # 61
    "test_consistency.py",  # 51
    "test_lm_eval.py",  # 49
    "test_bad_input.py",  # 48
    "test_generation.py",  # 45
    "test_grammar_decoding.py",  # 44
    "test_loop_copies.py",  # 44
    "test_sharding.py",  # 43
    "test_prefix_cache.py",  # 37
    "test_int8.py",  # 35
    "test_model_parity.py",  # 32
    "test_autotune.py",  # 30
    "test_logprobs.py",  # 30
)


def pytest_collection_modifyitems(items):
    """LONGEST_FILES first, in that order; the rest after, as collected (a stable sort:
    each file's tests keep their order)."""
    here = Path(__file__).parent
    gone = [name for name in LONGEST_FILES if not (here / name).is_file()]
    assert not gone, f"tests/conftest.py LONGEST_FILES names files that are gone: {gone}"
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# The tiny "gqa" model's cost curve {T: seconds}, measured by `auto` on an idle AMD EPYC
# (2 cores). Seeded into the test cache for the batch sizes the tests decode at, so that
# `auto` chooses from it instead of measuring: on a machine kept busy by the other worker
# a measured curve is never cached (cost_curve.BUSY_CORES), and every process running
# `auto` measured it again (seconds of compiling each, and a noisy curve could make it
# choose plain decoding where a test needs lookahead). Also seeded for one device: the
# commands the tests start (CLI, server) see one. tests/test_autotune.py measures.
TINY_COST_CURVE = {1: 1.11e-3, 2: 1.09e-3, 4: 1.56e-3, 8: 1.85e-3, 12: 2.59e-3, 16: 2.33e-3}
SEEDED_BATCHES = (1, 2, 3, 4, 8)


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory):
    """{variant name: (HF dir, converted checkpoint dir)} for every tiny variant, with the
    "gqa" model's cost curve seeded (TINY_COST_CURVE)."""
    import lookahead_jax as lj
    from lookahead_jax.decoding import cost_curve

    root = tmp_path_factory.mktemp("tiny")
    ckpts = {name: tiny.build(root, name) for name in tiny.VARIANTS}
    gqa = lj.load(ckpts["gqa"][1])
    # for this process's 8 devices and for the one a command started by a test sees
    for batch, devices in itertools.product(SEEDED_BATCHES, (None, 1)):
        if not cost_curve.cost_curve_path(gqa, batch, devices).is_file():
            cost_curve.save_cost_curve(
                gqa, TINY_COST_CURVE, batch, devices, seeded="tests/conftest.py"
            )
    return ckpts


@pytest.fixture(scope="session")
def tiny_text_ckpt(tiny_ckpts, tmp_path_factory):
    """The tiny "gqa" checkpoint with a character-level tokenizer and a chat template (text
    prompts, chat, stop strings); the same weights and shapes, so the same programs."""
    import shutil

    ckpt = tmp_path_factory.mktemp("tiny_text") / "gqa-text"
    shutil.copytree(tiny_ckpts["gqa"][1], ckpt)
    tiny.add_tokenizer(ckpt)
    return ckpt


@pytest.fixture(scope="session")
def smollm2_ckpt():
    """The converted SmolLM2-135M checkpoint (converted once into the cache)."""
    from lookahead_jax.checkpoints import default_model

    try:
        default_model.gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return default_model.resolve(None)


@pytest.fixture(scope="session")
def smollm2(smollm2_ckpt):
    import lookahead_jax as lj

    return lj.load(smollm2_ckpt)


_GGUF_ONCE: dict = {}


@contextlib.contextmanager
def gguf_parsed_once():
    """While transformers reads a GGUF: each file parsed once, each tensor-name map built
    once, for the whole session.

    transformers parses the file's metadata in full for the config, again for the weights
    and again for the tokenizer (8 s each for SmolLM2's 49k-token vocabulary), and builds
    gguf's tensor-name map once per tensor (397 times, 10 s). The objects returned are the
    ones gguf makes; only the repeats are skipped. Patched only inside this block, so our
    own GGUF reader (checkpoints/convert) is never given a shared one.
    """
    import functools

    import gguf

    if not _GGUF_ONCE:
        _GGUF_ONCE["reader"] = functools.lru_cache(maxsize=None)(gguf.GGUFReader)
        _GGUF_ONCE["names"] = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", _GGUF_ONCE["reader"])
        mp.setattr(gguf, "get_tensor_name_map", _GGUF_ONCE["names"])
        yield


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer():
    """transformers' own tokenizer from the GGUF (seconds; the model's weights take ~20)."""
    from transformers import AutoTokenizer

    from lookahead_jax.checkpoints import default_model

    path = default_model.gguf_path()
    with gguf_parsed_once():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_hf_tokenizer):
    """transformers' own reading of the GGUF: the reference for parity."""
    import torch
    from transformers import AutoModelForCausalLM

    from lookahead_jax.checkpoints import default_model

    path = default_model.gguf_path()
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
    return model, smollm2_hf_tokenizer
