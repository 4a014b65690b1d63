"""`TokenAutomaton`: a grammar as a deterministic automaton over a model's token ids, in
the form a decode step reads: one row of next states per automaton state.

    next_sv[s, v]   the state after token v in state s; -1: v is not allowed in s
    final_s[s]      the text so far is complete: the model's EOS tokens are allowed in s
                    (and lead back to s), the other tokens only where the grammar goes on

Worked example, the regex `(yes|no)` over a vocabulary with "yes" = 10, "no" = 11,
"y" = 12, "es" = 13 and EOS = 2 (states renumbered densely, the initial one first):

    state 0 (initial): 10 -> 2, 11 -> 2, 12 -> 1     every other token -1
    state 1:           13 -> 2
    state 2 (final):    2 -> 2

A row constrained by it masks its logits in state s to the tokens v with next_sv[s, v]
>= 0, chooses one, and moves to next_sv[s, v]: text that is a prefix of a match at
every token, a match when it ends with EOS.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lookahead_jax.errors import UserInputError

# The largest table a grammar may make (S states x V tokens x 4 bytes): a grammar beyond it
# is refused with its size (a JSON schema of ~30 properties with bounded strings makes a
# few hundred states: ~55 MiB at SmolLM2's 49,152 tokens).
MAX_TABLE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True, eq=False)
class TokenAutomaton:
    """A grammar over token ids (module docstring). `what` names it in messages; its
    arrays are read-only."""

    next_sv: np.ndarray  # [S, V] int32
    final_s: np.ndarray  # [S] bool
    initial: int
    what: str
    compile_s: float = 0.0  # seconds its compilation took (0.0 when it came from the cache)

    @property
    def states(self) -> int:
        return self.next_sv.shape[0]

    @property
    def nbytes(self) -> int:
        return self.next_sv.nbytes

    def allowed(self, state: int) -> np.ndarray:
        """The token ids allowed in `state`, ascending."""
        return np.flatnonzero(self.next_sv[state] >= 0)

    def advance(self, state: int, token: int) -> int:
        """The state after `token` in `state`; -1 if the grammar does not allow it."""
        return int(self.next_sv[state, token]) if state >= 0 else -1

    def walk(self, tokens, state: int | None = None) -> int:
        """The state after `tokens` from `state` (default: the initial one); -1 once one
        is not allowed."""
        state = self.initial if state is None else state
        for t in tokens:
            state = self.advance(state, int(t))
            if state < 0:
                return -1
        return state

    def accepts(self, tokens) -> bool:
        """Whether `tokens` (without EOS) are a complete match."""
        state = self.walk(tokens)
        return state >= 0 and bool(self.final_s[state])

    def forced(self, state: int, limit: int) -> list[int]:
        """The tokens the grammar forces from `state`, at most `limit`: while exactly one
        token is allowed and it is not the end (a final state allows EOS, so a forced run
        stops at one), that token."""
        run: list[int] = []
        while len(run) < limit and state >= 0 and not self.final_s[state]:
            allowed = self.allowed(state)
            if len(allowed) != 1:
                break
            run.append(int(allowed[0]))
            state = int(self.next_sv[state, allowed[0]])
        return run


def from_transitions(
    transitions: dict[int, dict[int, int]],
    initial: int,
    finals,
    vocab_size: int,
    eos_ids: tuple[int, ...],
    what: str,
) -> TokenAutomaton:
    """The automaton of an index's transitions ({state: {token: next state}}, any state
    ids): states renumbered densely, the initial one 0; every EOS id allowed in each final
    state, leading back to it. Refuses a table over MAX_TABLE_BYTES."""
    ids = sorted(set(transitions) | {n for row in transitions.values() for n in row.values()})
    ids.remove(initial)
    ids = [initial, *ids]
    S = len(ids)
    nbytes = S * vocab_size * 4
    if nbytes > MAX_TABLE_BYTES:
        raise UserInputError(
            f"{what} makes {S} automaton states: its table ({S} x {vocab_size} tokens x 4 "
            f"bytes = {nbytes / 2**20:.0f} MiB) is over the bound of "
            f"{MAX_TABLE_BYTES / 2**20:.0f} MiB (lookahead_jax.grammar.MAX_TABLE_BYTES); "
            "bound its strings and arrays (maxLength, maxItems) or split it"
        )
    dense = {s: i for i, s in enumerate(ids)}
    froms, tokens, tos = [], [], []
    for s, row in transitions.items():
        froms += [dense[s]] * len(row)
        tokens += list(row)
        tos += [dense[n] for n in row.values()]
    next_sv = np.full((S, vocab_size), -1, np.int32)
    tokens_a = np.asarray(tokens, np.int64)
    keep = tokens_a < vocab_size  # (a tokenizer entry past the model's logits: never chosen)
    next_sv[np.asarray(froms, np.int64)[keep], tokens_a[keep]] = np.asarray(tos, np.int32)[keep]
    final_s = np.zeros((S,), bool)
    final_s[[dense[s] for s in finals if s in dense]] = True
    for e in eos_ids:
        if 0 <= e < vocab_size:
            next_sv[:, e] = np.where(final_s, np.arange(S, dtype=np.int32), -1)
    next_sv.flags.writeable = False
    final_s.flags.writeable = False
    return TokenAutomaton(next_sv=next_sv, final_s=final_s, initial=0, what=what)
