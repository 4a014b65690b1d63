"""Structured output: a JSON schema or a regex compiled to a token automaton over a
model's vocabulary (automaton.py), the arrays a decode step reads to keep every token it
chooses inside the grammar.

The automaton is built with outlines-core (the index it builds is exactly this: per state,
the tokens allowed and the state each leads to); json_schema.py checks a schema against
the keywords it can enforce first, so that one it cannot is refused, naming where, rather
than silently loosened. compile.py keeps the automata per (grammar, tokenizer).
"""

from lookahead_jax.grammar.automaton import MAX_TABLE_BYTES, TokenAutomaton
from lookahead_jax.grammar.compile import check_regex, from_json_schema, from_regex

__all__ = ["MAX_TABLE_BYTES", "TokenAutomaton", "check_regex", "from_json_schema", "from_regex"]
