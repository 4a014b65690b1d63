"""Guess sources and the draft tree they fill: the protocol every source implements
(guess_source.py), the built-in sources — the n-gram pool (ngram_pool.py), suffix match
over the row's own text (suffix_match.py), token recycling (token_recycling.py) — the
tree and its candidate layout in one forward pass (draft_tree.py, lookahead_layout.py)
and LookaheadConfig, the shape of a step (lookahead_config.py).

Pure array functions of tokens; independent of models/ (they never see a forward).
What a source written outside the package needs is exported here (docs/library.md).
"""

from lookahead_jax.guesses.draft_tree import ROOT, Proposals, chains
from lookahead_jax.guesses.guess_source import (
    GuessSource,
    Prompt,
    Sampler,
    Text,
    Verified,
    WindowNGrams,
)
from lookahead_jax.guesses.ngram_pool import PoolSource
from lookahead_jax.guesses.suffix_match import SuffixSource
from lookahead_jax.guesses.token_recycling import RecyclingSource

__all__ = [
    "ROOT",
    "GuessSource",
    "PoolSource",
    "Prompt",
    "Proposals",
    "RecyclingSource",
    "Sampler",
    "SuffixSource",
    "Text",
    "Verified",
    "WindowNGrams",
    "chains",
]
