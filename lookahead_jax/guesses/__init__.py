"""Guess sources and the draft tree they fill: the protocol every source implements
(guess_source.py), the built-in sources — the n-gram pool (ngram_pool.py), suffix match
over the row's own text (suffix_match.py), token recycling (token_recycling.py), listed in
built_in.py, each with its settings — the
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

__all__ = [
    "ROOT",
    "GuessSource",
    "Prompt",
    "Proposals",
    "Sampler",
    "Text",
    "Verified",
    "WindowNGrams",
    "chains",
]
