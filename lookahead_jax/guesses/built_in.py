"""The built-in guess sources, in proposal order: each one's settings (its knobs in
LookaheadConfig: guess_source.SourceSettings), kept in its own file with the source.

A built-in source is added by its file and a line here, and removed the same way:
LookaheadConfig takes its knobs (constructor keywords, `parse`, the CLI's --lookahead)
by the field names of the settings listed here, and its measured layouts (LAYOUTS) keep
only the knobs of the sources listed.
"""

from lookahead_jax.guesses.grammar_source import GrammarSettings
from lookahead_jax.guesses.ngram_pool import PoolSettings
from lookahead_jax.guesses.suffix_match import SuffixSettings
from lookahead_jax.guesses.token_recycling import RecyclingSettings

BUILT_IN = (
    GrammarSettings,
    PoolSettings,
    SuffixSettings,
    RecyclingSettings,
)
