"""The text a grammar fixes ahead of each state, as the tokens a model would likely write
it in: a lookahead step's guesses under a grammar (guesses/grammar_source.py).

A grammar over a BPE vocabulary rarely forces one *token* — after `{"name":"Ava"` the
text `","age":` is fixed, but `"`, `",` and `","` all fit — so the guess is the fixed
text's own tokenization (the tokenizer's encode), cut where the automaton would not allow
it. It is only a guess: verification keeps the model's tokens either way.

Worked example (a schema with properties "name" then "age", compact JSON): in the state
after `{"name":"Ava"`, every allowed token's bytes start with `"` (the string may only
end), and the one equal to it leads on to a state where every allowed token starts with
`,`, then `"age":`: the fixed text is `","age":`, encoded e.g. as [`","`, `age`, `":`].
"""

from __future__ import annotations

import os

import numpy as np

from lookahead_jax.grammar.automaton import TokenAutomaton

MAX_BYTES = 64  # of fixed text looked ahead from a state


def fixed_bytes(a: TokenAutomaton, token_bytes, state: int) -> bytes:
    """The bytes every answer writes next from `state`: while the allowed tokens share a
    first byte, their common prefix, followed on through the token equal to it."""
    out = b""
    while len(out) < MAX_BYTES and state >= 0 and not a.final_s[state]:
        allowed = a.allowed(state)
        common = os.path.commonprefix([token_bytes[t] or b"" for t in allowed])
        if not common:
            break
        out += common
        exact = [t for t in allowed if token_bytes[t] == common]
        if not exact:
            break
        state = a.advance(state, exact[0])
    return out


def chains(a: TokenAutomaton, token_bytes, encode, length: int) -> np.ndarray:
    """[S, length] int32: from each state, the tokens of its fixed text as `encode` (bytes
    -> token ids) writes them, as far as the automaton allows them; -1 after."""
    out = np.full((a.states, length), -1, np.int32)
    for s in range(a.states):
        text = fixed_bytes(a, token_bytes, s)
        if not text:
            continue
        state = s
        for i, t in enumerate(encode(text)[:length]):
            state = a.advance(state, t)
            if state < 0:
                break
            out[s, i] = t
    return out
