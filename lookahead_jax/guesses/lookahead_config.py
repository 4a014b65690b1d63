"""What a lookahead step feeds and verifies: `LookaheadConfig`, and the draft layouts by
tokens per step (`LookaheadConfig.for_tokens`).

A step feeds T tokens through the model (lookahead_layout.py): the input, the Jacobi
window's (N-1)*W tokens and the draft tree's Z nodes; `tokens_per_step` is T. The knobs
and what each source is are described in lookahead.py; `for_tokens(T)` picks the best
measured layout that feeds at most T tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses import jacobi_window
from lookahead_jax.guesses.built_in import BUILT_IN
from lookahead_jax.guesses.guess_source import GuessSource, SourceSettings, check_int
from lookahead_jax.guesses.lookahead_layout import StepLayout

# The Jacobi window's own paths (verify_window) count as a source in the stats and the
# acceptance record, after the configured ones (jacobi_window.py).
WINDOW_SOURCE = jacobi_window.SOURCE


@dataclasses.dataclass(frozen=True, init=False)
class LookaheadConfig:
    """What one lookahead step feeds and verifies (all static: a jit argument).

    n, w, g     the paper's knobs: n-gram size N (window levels + 1), window columns W
                (0: no window), pool n-grams G looked up per step (they compete with
                the other sources for the tree's nodes)
    tree        draft-tree nodes Z fed per step (None: one per proposed node)
    verify_window  also verify the window's own paths
    window_sampling  under sampling, the window's new level is the sample at its
                position (True) rather than the argmax
    adapt       fill the tree by each row's acceptance record (acceptance_record.py):
                proposals' scores weighed by what their source got accepted at their
                depth for the row lately (False: the priors alone, as before)
    extra_sources  guess sources beyond the built-in ones (guess_source.GuessSource,
                e.g. one written outside the package: docs/library.md); they propose
                after them and compete with them for the tree's nodes
    layout_tokens  set by for_tokens: the T of the layout it is (or was changed from)
    built_in    the built-in sources' settings, one per class of built_in.BUILT_IN, in
                its order (guess_source.SourceSettings)

    The built-in sources' knobs are given by their settings' field names, as keywords
    (LookaheadConfig(3, 1, 2, recycle=40, suffix=2), dataclasses.replace) or in `parse`,
    and read back as attributes (config.suffix_span):
      the pool      pool_capacity (n-grams kept per key; None: G), prompt_pool (seed the
                    pool with the prompt's n-grams): ngram_pool.PoolSettings
      suffix match  suffix (continuations a step), suffix_span, suffix_key, suffix_memory
                    (the engine's earlier outputs matched too): suffix_match.SuffixSettings
      recycling     recycle (template nodes), recycle_k: token_recycling.RecyclingSettings

    `sources` are the guess sources these knobs make (the pool if G > 0, suffix match,
    token recycling), then `extra_sources`.
    """

    n: int  # no defaults: the one default layout is "auto" (lj.generate, lj.Engine, CLI)
    w: int
    g: int
    verify_window: bool = False
    tree: int | None = None
    window_sampling: bool = True
    adapt: bool = True
    extra_sources: tuple[GuessSource, ...] = ()
    layout_tokens: int | None = None  # set by for_tokens: its layout's tokens per step
    built_in: tuple[SourceSettings, ...] = ()

    # Written out (init=False) so that the built-in sources' knobs come as keywords of
    # their own (the settings' field names) and land in their settings: dataclasses'
    # generated __init__ takes only the config's fields.
    def __init__(
        self,
        n: int,
        w: int,
        g: int,
        *,
        verify_window: bool = False,
        tree: int | None = None,
        window_sampling: bool = True,
        adapt: bool = True,
        extra_sources: tuple[GuessSource, ...] = (),
        layout_tokens: int | None = None,
        built_in: tuple[SourceSettings, ...] = (),
        **knobs,
    ):
        given = {type(s): s for s in built_in}
        settings = []
        for kind in BUILT_IN:
            mine = {k: knobs.pop(k) for k in _names(kind) if k in knobs}
            base = given.get(kind) or kind()
            settings.append(dataclasses.replace(base, **mine) if mine else base)
        if knobs:
            raise TypeError(f"LookaheadConfig got unknown knobs {sorted(knobs)}")
        values = dict(
            n=n,
            w=w,
            g=g,
            verify_window=verify_window,
            tree=tree,
            window_sampling=window_sampling,
            adapt=adapt,
            extra_sources=extra_sources,
            layout_tokens=layout_tokens,
            built_in=tuple(settings),
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __getattr__(self, name: str):
        """A built-in source's knob (config.suffix_span): its settings' field."""
        for settings in self.__dict__.get("built_in", ()):
            if name in _names(type(settings)):
                return getattr(settings, name)
        raise AttributeError(f"LookaheadConfig has no field or knob {name!r}")

    def __post_init__(self):
        for name, value, low in (("N", self.n, 2), ("W", self.w, 0), ("G", self.g, 0)):
            check_int(name, value, low)
        check_int("tree", self.tree, 0, none_ok=True)
        for settings in self.built_in:
            settings.check(self)
        self._check_extra_sources()
        if self.tree is not None and self.tree > self.proposed_nodes:
            raise UserInputError(
                f"lookahead tree={self.tree} has more nodes than the guess sources propose "
                f"({self.proposed_nodes} nodes: "
                + ", ".join(f"{s.name} {s.nodes}" for s in self.sources)
                + "): the rest would always be empty"
            )

    def knobs(self) -> dict:
        """Every knob by the name `parse` takes: the config's own fields (not
        extra_sources, layout_tokens), then each built-in source's."""
        own = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("built_in", "extra_sources", "layout_tokens")
        }
        for settings in self.built_in:
            own.update({k: getattr(settings, k) for k in _names(type(settings))})
        return own

    def _check_extra_sources(self) -> None:
        if not isinstance(self.extra_sources, tuple):
            raise UserInputError(
                f"lookahead extra_sources must be a tuple of guess sources, got "
                f"{type(self.extra_sources).__name__}"
            )
        for src in self.extra_sources:
            if not isinstance(src, GuessSource):
                raise UserInputError(
                    f"lookahead extra_sources: {src!r} is not a guess source (it needs name, "
                    "nodes, depth, init, propose and feed: guesses/guess_source.py)"
                )
            try:
                hash(src)
            except TypeError:
                raise UserInputError(
                    f"lookahead extra_sources: {src.name!r} must be hashable (a frozen "
                    "dataclass): the config is a static argument of the compiled step"
                ) from None
            for attr in ("nodes", "depth"):
                value = getattr(src, attr)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise UserInputError(
                        f"lookahead source {src.name!r}: {attr} must be an integer >= 0, "
                        f"got {value!r}"
                    )
        names = self.source_names
        if len(set(names)) != len(names):
            raise UserInputError(f"lookahead guess sources need distinct names, got {names}")

    # ------------------------------------------------------------ derived shape

    @property
    def m(self) -> int:
        return self.n - 1

    @functools.cached_property
    def sources(self) -> tuple[GuessSource, ...]:
        """The guess sources, in proposal order: the built-in ones these knobs enable,
        then `extra_sources`."""
        made = (settings.source(self) for settings in self.built_in)
        built_in = [source for source in made if source is not None]
        return (*built_in, *self.extra_sources)

    @property
    def source_names(self) -> tuple[str, ...]:
        """Each source's name by its index in the draft tree's `source`, the stats and
        the acceptance record: the sources, then the window's own paths."""
        return (*(s.name for s in self.sources), WINDOW_SOURCE)

    @property
    def proposed_nodes(self) -> int:
        """Draft nodes the sources offer per step (before merging)."""
        return sum(s.nodes for s in self.sources)

    @property
    def tree_nodes(self) -> int:
        return self.proposed_nodes if self.tree is None else self.tree

    @property
    def tree_depth(self) -> int:
        """The deepest draft-tree node any source can offer."""
        return max((s.depth for s in self.sources if s.nodes), default=0)

    @property
    def layout(self) -> StepLayout:
        return StepLayout(self.n, self.w, self.tree_nodes, self.verify_window)

    @property
    def verify_depth(self) -> int:
        """The longest path verification can accept (tree, or window with verify_window)."""
        window = int(self.layout.window_depths.max(initial=0)) if self.verify_window else 0
        return max(self.tree_depth, window)

    @property
    def max_emit(self) -> int:
        """Most tokens one step emits: the longest accepted path plus the bonus token."""
        return self.verify_depth + 1

    @property
    def tuning_key(self) -> tuple[int, int, int] | int | str:
        """What autotune keeps this config's measurements under: T for a for_tokens
        layout, its name for one with fields changed, (N, W, G) otherwise."""
        if self.layout_tokens is None:
            return (self.n, self.w, self.g)
        T = self.layout_tokens
        return T if self == LookaheadConfig.for_tokens(T) else self.name

    @property
    def name(self) -> str:
        """How `parse` (and the CLI's --lookahead) spells this config: 'tokens=T' for a
        for_tokens layout (then ',key=value' for each field changed from it), 'N,W,G' for
        the paper's knobs alone, else 'key=value,...'."""
        fields = self.knobs()
        suffix = "".join(f"+{s.name}" for s in self.extra_sources)  # shown, not parsed
        base = LAYOUTS.get(self.layout_tokens)
        if base is not None:
            changed = {k: v for k, v in fields.items() if v != getattr(base, k)}
            parts = [f"tokens={self.layout_tokens}"] + [f"{k}={v}" for k, v in changed.items()]
            return ",".join(parts) + suffix
        changed = {
            k: v for k, v in fields.items() if k not in ("n", "w", "g") and v != _DEFAULTS[k]
        }
        if not changed:
            return f"{self.n},{self.w},{self.g}" + suffix
        knobs = {"n": self.n, "w": self.w, "g": self.g, **changed}
        return ",".join(f"{k}={v}" for k, v in knobs.items()) + suffix

    @classmethod
    def parse(cls, text: str, what: str = "lookahead", or_auto: bool = False) -> LookaheadConfig:
        """'tokens=T' (for_tokens; fields may follow, e.g. tokens=16,adapt=False), 'N,W,G'
        (e.g. 5,7,7), or LookaheadConfig fields as 'key=value,...' (e.g.
        n=3,w=1,g=2,recycle=40,suffix=2,tree=13)."""
        text = text.strip()
        hint = (
            f"{what} must be tokens=T (e.g. tokens=16), N,W,G (three integers, e.g. 5,7,7) "
            f"or fields as key=value,... with n, w and g (e.g. n=3,w=1,g=0,recycle=20,tree=7)"
            + (" or auto" if or_auto else "")
        )
        if text.lower().startswith("tokens="):
            first, *rest = text.split(",")
            try:
                tokens = int(first.split("=", 1)[1])
            except ValueError:
                raise UserInputError(
                    f"{what} tokens=T needs an integer T >= 2 (tokens per step), got {text!r}"
                ) from None
            base = cls.for_tokens(tokens)
            if not rest:
                return base
            changed = dataclasses.replace(base, **_fields(rest, hint, text))
            if changed.tokens_per_step > base.layout_tokens:
                raise UserInputError(
                    f"{what} {text} feeds {changed.tokens_per_step} tokens per step, more than "
                    f"the {base.layout_tokens} of tokens={base.layout_tokens}"
                )
            return changed
        if "=" not in text:
            try:
                n, w, g = (int(p) for p in text.split(","))
            except ValueError:  # not three parts, or one of them not an integer
                raise UserInputError(f"{hint}; got {text!r}") from None
            return cls(n, w, g)
        fields = _fields(text.split(","), hint, text)
        missing = [k for k in ("n", "w", "g") if k not in fields]
        if missing:
            raise UserInputError(f"{hint}; got {text!r} (no {', '.join(missing)})")
        return cls(**fields)

    @classmethod
    def for_tokens(cls, tokens: int) -> LookaheadConfig:
        """The best measured layout that feeds at most `tokens` tokens per step (see
        LAYOUTS; tokens >= 2)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int | np.integer) or tokens < 2:
            raise UserInputError(
                f"lookahead tokens per step must be an integer >= 2, got {tokens!r}"
            )
        T = max(t for t in LAYOUTS if t <= tokens)
        return dataclasses.replace(LAYOUTS[T], layout_tokens=T)

    @property
    def tokens_per_step(self) -> int:
        return self.layout.num_tokens

    def check_fits(self, max_context: int) -> None:
        """Refuse a step whose token count is not well below the model's context."""
        tokens, limit = self.tokens_per_step, max_step_tokens(max_context)
        if tokens > limit:
            raise UserInputError(
                f"lookahead {self.name} makes {tokens} tokens per step; at most {limit} are "
                f"allowed for this model (a quarter of its {max_context}-token context, and "
                f"never more than {MAX_STEP_TOKENS})"
            )

    def describe(self) -> dict:
        settings = {}
        for each in self.built_in:
            settings.update(each.describe(self))
        return {
            "name": self.name,
            "n": self.n,
            "w": self.w,
            "g": self.g,
            **settings,
            "tree": self.tree_nodes,
            "step_tokens": self.tokens_per_step,
            "verify_window": self.verify_window,
            "window_sampling": self.window_sampling,
            "adapt": self.adapt,
            "sources": {s.name: {"nodes": s.nodes, "depth": s.depth} for s in self.sources},
        }


def _names(kind) -> tuple[str, ...]:
    """A settings class's knobs: its field names."""
    return tuple(f.name for f in dataclasses.fields(kind))


# every knob's default, by the name parse takes
_DEFAULTS = {
    **{
        f.name: f.default
        for f in dataclasses.fields(LookaheadConfig)
        if f.name not in ("built_in", "extra_sources", "layout_tokens")
    },
    **{f.name: f.default for kind in BUILT_IN for f in dataclasses.fields(kind)},
}


def _fields(parts: list[str], hint: str, text: str) -> dict:
    """LookaheadConfig fields from 'key=value' parts (True/False, None or integers)."""
    kwargs: dict = {}
    for part in parts:
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if key not in _DEFAULTS:
            raise UserInputError(f"{hint}; got {text!r} (unknown field {key!r})")
        if value in ("True", "False", "true", "false"):
            kwargs[key] = value.lower() == "true"
        elif value == "None":
            kwargs[key] = None
        else:
            try:
                kwargs[key] = int(value)
            except ValueError:
                raise UserInputError(f"{hint}; got {text!r} ({key}={value!r})") from None
    return kwargs


# A step feeding more tokens than this (or than a quarter of the model's context) is far
# past any useful size, and its pool and attention buffers grow without bound: refused.
MAX_STEP_TOKENS = 1024


def max_step_tokens(max_context: int) -> int:
    """The most tokens a lookahead step may feed a model with this context."""
    return min(MAX_STEP_TOKENS, max_context // 4)


# Draft layouts by tokens fed per step (T = 1 + (N-1)*W + tree), chosen with SmolLM2-135M
# on subsets of MT-bench and code, greedy: the best of the few layouts tried at each T
# up to 32 (e.g. at T=8, no window beat a (3,1,1) window by 2.17 to 2.11 tokens per step);
# 64 and 128 are scaled up from 32, not tuned. Compression of each: benchmarks/cpu/
# budgets.md and budgets_large.md. Small layouts spend every token on the draft tree; from
# 16 on, a one-column window feeding the pool pays its tokens.
#
# Each also matches the engine's last SHARED_TEXT tokens of output when it shares guesses
# across requests (suffix_match.py; a prompt asked again: 4.4x tokens per step,
# benchmarks/cpu/shared_guesses.md); without sharing that text stays empty, and a
# proposal over it costs ~0.1 ms (benchmarks/cpu/suffix_match_cost.md).
SHARED_TEXT = 2048


def _layout(n: int, w: int, g: int, tree: int, **knobs) -> LookaheadConfig:
    """A measured layout, with the knobs of the built-in sources listed (built_in.py):
    a source taken out of the list takes its knobs out of the layouts, and its share of
    the tree when the others propose fewer nodes."""
    known = {k for kind in BUILT_IN for k in _names(kind)}
    kept = {k: v for k, v in knobs.items() if k in known}
    if "suffix" in kept:
        kept["suffix_memory"] = SHARED_TEXT
    proposed = LookaheadConfig(n, w, g, **kept).proposed_nodes
    return LookaheadConfig(n, w, g, tree=min(tree, proposed), **kept)


LAYOUTS: dict[int, LookaheadConfig] = {
    2: _layout(2, 0, 0, recycle=4, suffix=1, suffix_span=4, tree=1),
    4: _layout(2, 0, 0, recycle=12, suffix=1, suffix_span=4, tree=3),
    8: _layout(2, 0, 0, recycle=20, suffix=2, tree=7),
    12: _layout(2, 0, 0, recycle=30, suffix=2, tree=11),
    16: _layout(3, 1, 2, recycle=40, suffix=2, tree=13),
    32: _layout(3, 1, 4, recycle=80, suffix=3, suffix_span=12, tree=29),
    64: _layout(4, 2, 4, recycle=120, suffix=4, suffix_span=16, tree=57),
    128: _layout(5, 4, 8, recycle=200, suffix=4, suffix_span=16, tree=111),
}
for _t, _la in LAYOUTS.items():  # (fewer with a built-in source taken out)
    assert _la.tokens_per_step <= _t, (_t, _la.tokens_per_step)

# A fixed layout for callers that want one (the CLI's default is "auto", which measures
# the machine instead).
DEFAULT_LOOKAHEAD = LookaheadConfig.for_tokens(16)
