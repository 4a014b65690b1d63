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

Where the encoding's first token is not allowed — a sentencepiece tokenizer writes a
fragment with a leading "▁" (a space), which compact JSON never has — the text is
written instead by the longest allowed token at each point (`longest_match`).
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
    -> token ids) writes them, as far as the automaton allows them (or, where it allows
    none of them, as `longest_match` does); -1 after."""
    out = np.full((a.states, length), -1, np.int32)
    by_bytes: dict[bytes, list[int]] = {}  # (made at the first state that needs it)
    for s in range(a.states):
        text = fixed_bytes(a, token_bytes, s)
        if not text:
            continue
        run, state = [], s
        for t in encode(text)[:length]:
            state = a.advance(state, t)
            if state < 0:
                break
            run.append(t)
        if not run:
            by_bytes = by_bytes or _by_bytes(token_bytes)
            run = longest_match(a, by_bytes, s, text, length)
        out[s, : len(run)] = run
    return out


def _by_bytes(token_bytes) -> dict[bytes, list[int]]:
    """bytes -> the token ids that write them (a vocabulary's, every non-empty entry)."""
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(token_bytes):
        if b:
            by_bytes.setdefault(b, []).append(i)
    return by_bytes


def longest_match(a: TokenAutomaton, by_bytes: dict, state: int, text: bytes, length: int):
    """Up to `length` tokens writing `text` from `state`: at each point the longest token
    (by_bytes: bytes -> token ids) that is a prefix of the rest and that the automaton
    allows; stops where none is."""
    run: list[int] = []
    while text and len(run) < length:
        for k in range(len(text), 0, -1):
            t = next((i for i in by_bytes.get(text[:k], ()) if a.advance(state, i) >= 0), None)
            if t is not None:
                break
        else:
            break
        run.append(t)
        state, text = a.advance(state, t), text[k:]
    return run
