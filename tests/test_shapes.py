"""The shape legend as a contract (lookahead_jax/shapes.py): the state's dataclasses are
annotated with the legend's letters, and a step checks them, with one binding per letter,
when it is traced. Everything here only traces (jax.eval_shape): nothing is compiled."""

import dataclasses
import functools
import importlib
import pkgutil
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import AbstractArray

import lookahead_jax as lj
from lookahead_jax import shapes
from lookahead_jax.decoding import DecodeSpec, RowSampling, row_keys
from lookahead_jax.decoding.loop import start, step
from lookahead_jax.decoding.sampling import SamplingConfig
from lookahead_jax.models.llama import LlamaLM
from lookahead_jax.models.llama_params import init_params, split_layers
from tests import tiny

ROOT = Path(__file__).resolve().parent.parent
CFG = tiny.llama_config()
PARAMS = jax.eval_shape(lambda: split_layers(init_params(CFG, jax.random.PRNGKey(0))))
B, P = 3, 8


def trace(lm, lookahead, steps: int = 1):
    """eval_shape of start + `steps` steps: every check runs, nothing compiles."""
    spec = DecodeSpec(lm=lm, eos_ids=(2,), lookahead=lookahead)
    sampling = RowSampling.of([SamplingConfig()] * B)

    def run(params):
        state = start(
            params,
            jnp.zeros((B, P), jnp.int32),
            jnp.full((B,), P, jnp.int32),
            jnp.full((B,), 16, jnp.int32),
            row_keys(0, B),
            jax.tree.map(jnp.asarray, sampling),
            spec=spec,
            new_positions=16,
        )
        for _ in range(steps):
            state = step(params, state, spec=spec)
        return state

    return jax.eval_shape(run, PARAMS)


@pytest.mark.parametrize(
    "la", [None, lj.LookaheadConfig.for_tokens(16), lj.LookaheadConfig(4, 3, 3)]
)
def test_a_traced_decode_keeps_every_contract(la):
    state = trace(LlamaLM(CFG), la)
    assert state.tokens.shape[0] == B and state.cache.k[0].shape[:2] == (B, CFG.num_kv_heads)


@dataclasses.dataclass(frozen=True)
class NarrowLM(LlamaLM):
    """A model that breaks the seam: its logits lose the last vocabulary entry."""

    def apply(self, *args):
        logits, k, v = super().apply(*args)
        return logits[..., :-1], k, v


@dataclasses.dataclass(frozen=True)
class HeadsLM(LlamaLM):
    """A model whose new K/V have the heads and the tokens axes swapped."""

    def apply(self, *args):
        logits, k, v = super().apply(*args)
        swap = lambda xs: tuple(x.swapaxes(1, 2) for x in xs)  # noqa: E731
        return logits, swap(k), swap(v)


def test_a_model_that_breaks_the_seam_is_named_at_trace_time():
    with pytest.raises(shapes.ShapeError, match=r"NarrowLM.apply: logits \[3, 1, 31\]"):
        trace(NarrowLM(CFG), None)
    # the prefill binds T = P = 8 from its tokens; the first layer's new K then holds
    # [B, T, K, Dh] = [3, 8, 1, 8], whose third axis breaks T
    broken = r"HeadsLM.apply\.new_k\[0\] is float32\[3, 8, 1, 8\]"
    with pytest.raises(shapes.ShapeError, match=broken):
        trace(HeadsLM(CFG), None, steps=0)


@dataclasses.dataclass(frozen=True)
class FloatTokens:
    """A guess source that proposes float tokens (and one chain of 2 nodes)."""

    name: str = "float_tokens"
    nodes: int = 2
    depth: int = 2

    def init(self, prompt):
        return None

    def propose(self, state, text):
        chain = lj.guesses.chains(
            text.tokens[:, None, :2], jnp.full((text.tokens.shape[0], 1), 2), jnp.ones((B, 1, 2))
        )
        return dataclasses.replace(chain, tokens=chain.tokens.astype(jnp.float32))

    def feed(self, state, step):
        return None


def test_a_source_that_proposes_the_wrong_dtype_is_named():
    la = dataclasses.replace(lj.LookaheadConfig.for_tokens(16), extra_sources=(FloatTokens(),))
    with pytest.raises(shapes.ShapeError, match=r"float_tokens.propose\(\)\.tokens is float32"):
        trace(LlamaLM(CFG), la)


def test_letters_are_bound_once_across_nested_states():
    zeros = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731 (eval_shape's structs)
    state = jax.tree.map(zeros, trace(LlamaLM(CFG), None, steps=0))
    shapes.check(state)
    short = dataclasses.replace(state.cache, lengths=jnp.zeros((B + 1,), jnp.int32))
    with pytest.raises(shapes.ShapeError, match=r"DecodeState.cache.lengths .*B=3"):
        shapes.check(dataclasses.replace(state, cache=short))


@functools.cache
def legend() -> set[str]:
    """The letters of docs/architecture.md's shape legend."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Shape letters")[1]
    letters = set()
    for row in re.findall(r"^\| ([^|]+) \|", text, re.M):
        letters |= {x.strip() for x in row.split(",")}
    return letters - {"letter"}


def annotated_dims():
    """{(class, field): dims} of every jaxtyping annotation on a dataclass in the package."""
    out = {}
    for mod in pkgutil.walk_packages(lj.__path__, "lookahead_jax."):
        if mod.name.endswith(("__main__", ".generate", ".serve", ".consistency")):
            continue  # command entry points (they parse argv or alias other modules)
        module = importlib.import_module(mod.name)
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                continue
            if cls.__module__ != module.__name__:
                continue
            for name, hint in shapes._hints(cls).items():
                for arg in (hint, *getattr(hint, "__args__", ())):
                    if isinstance(arg, type) and issubclass(arg, AbstractArray):
                        out[(cls.__name__, name)] = arg.dim_str
    return out


def test_every_annotated_letter_is_in_the_legend():
    dims = annotated_dims()
    for cls in ("DecodeState", "KVCache", "DraftTree", "Proposals", "Verified", "ForwardPass"):
        assert any(c == cls for c, _ in dims), f"{cls} has no shape annotations"
    for (cls, field), dim_str in dims.items():
        for dim in dim_str.split():
            name = dim.lstrip("#*")
            if name.isdigit() or name == "_" or name.islower():  # sizes, not axes
                continue
            assert name in legend(), f"{cls}.{field}: {name!r} is not a letter of the legend"
