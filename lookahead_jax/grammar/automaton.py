"""`TokenAutomaton`: a grammar as a deterministic automaton over a model's token ids, in
the form a decode step reads. Tokens that act alike in every state share a *class* (a
grammar's automaton has hundreds of thousands of (state, token) moves but its tokens
fall in a few hundred classes: every plain word piece inside a bounded string moves the
same way), so the table is one row of next states per state and class:

    class_v[v]      token v's class; class 0: allowed in no state
    next_sc[s, c]   the state after a token of class c in state s; -1: not allowed in s
    final_s[s]      the text so far is complete: the model's EOS tokens (their own class)
                    are allowed in s (and lead back to s), the others only where the
                    grammar goes on

Worked example, the regex `(yes|no)` over a vocabulary with "yes" = 10, "no" = 11,
"y" = 12, "es" = 13 and EOS = 2 (states renumbered densely, the initial one first):

    classes:           10, 11 -> 1 (both lead from state 0 to 2), 12 -> 2, 13 -> 3,
                       EOS -> 4, every other token -> 0
    state 0 (initial): class 1 -> 2, class 2 -> 1          every other class -1
    state 1:           class 3 -> 2
    state 2 (final):   class 4 -> 2

A row constrained by it masks its logits in state s to the tokens v with
next_sc[s, class_v[v]] >= 0, chooses one, and moves to that state: text that is a prefix
of a match at every token, a match when it ends with EOS.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from lookahead_jax.errors import UserInputError

# The largest table a grammar may make (S states x C classes x 4 bytes, and its class of
# each token): a grammar beyond it is refused with its size (JSON schemas of a few
# properties make 300-1,000 states of 100-200 classes: under 1 MiB; any JSON object,
# 1,505 states x 101 classes at SmolLM2's vocabulary).
MAX_TABLE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True, eq=False)
class TokenAutomaton:
    """A grammar over token ids (module docstring). `what` names it in messages; its
    arrays are read-only."""

    next_sc: np.ndarray  # [S, C] int32
    class_v: np.ndarray  # [V] int32
    final_s: np.ndarray  # [S] bool
    initial: int
    what: str
    compile_s: float = 0.0  # seconds its compilation took (0.0 when it came from the cache)

    @property
    def states(self) -> int:
        return self.next_sc.shape[0]

    @property
    def classes(self) -> int:
        return self.next_sc.shape[1]

    @property
    def nbytes(self) -> int:
        return self.next_sc.nbytes + self.class_v.nbytes

    def next_v(self, state: int) -> np.ndarray:
        """[V] int32: the state after each token in `state` (-1: not allowed)."""
        return self.next_sc[state][self.class_v]

    def allowed(self, state: int) -> np.ndarray:
        """The token ids allowed in `state`, ascending."""
        return np.flatnonzero(self.next_v(state) >= 0)

    def advance(self, state: int, token: int) -> int:
        """The state after `token` in `state`; -1 if the grammar does not allow it."""
        return int(self.next_sc[state, self.class_v[token]]) if state >= 0 else -1

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
            state = self.advance(state, int(allowed[0]))
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
    counts = np.fromiter(map(len, transitions.values()), np.int64, len(transitions))
    n = int(counts.sum())
    froms = np.repeat(np.fromiter(transitions, np.int64, len(transitions)), counts)
    tokens = np.fromiter(itertools.chain.from_iterable(transitions.values()), np.int64, n)
    tos = np.fromiter(
        itertools.chain.from_iterable(row.values() for row in transitions.values()), np.int64, n
    )
    # states renumbered densely, the initial one first, the others in their ids' order
    ids = np.unique(np.concatenate([froms, tos, [initial]]))
    S = len(ids)
    rank0 = int(np.searchsorted(ids, initial))
    dense_of_rank = np.arange(S) + (np.arange(S) < rank0)
    dense_of_rank[rank0] = 0
    froms, tos = (dense_of_rank[np.searchsorted(ids, x)] for x in (froms, tos))
    eos = np.asarray([e for e in eos_ids if 0 <= e < vocab_size], np.int64)
    # (a tokenizer entry past the model's logits is never chosen; EOS is set below)
    keep = (tokens < vocab_size) & ~np.isin(tokens, eos)

    def check(classes: int) -> None:  # (EOS's class beside them)
        nbytes = S * (classes + 1) * 4 + vocab_size * 4
        if nbytes > MAX_TABLE_BYTES:
            raise UserInputError(
                f"{what} makes {S} automaton states: its table ({S} x {classes + 1} token "
                f"classes x 4 bytes, and {vocab_size} tokens' classes = {nbytes / 2**20:.0f} "
                f"MiB) is over the bound of {MAX_TABLE_BYTES / 2**20:.0f} MiB "
                "(lookahead_jax.grammar.MAX_TABLE_BYTES); bound its strings and arrays "
                "(maxLength, maxItems) or split it"
            )

    class_v, next_sc = token_classes(froms[keep], tokens[keep], tos[keep], S, vocab_size, check)
    final_s = np.zeros((S,), bool)
    finals = np.asarray(list(finals), np.int64)
    final_s[dense_of_rank[np.searchsorted(ids, finals[np.isin(finals, ids)])]] = True
    if len(eos):  # EOS: a class of its own, allowed in the final states, leading back
        class_v[eos] = next_sc.shape[1]
        next_sc = np.concatenate(
            [next_sc, np.where(final_s, np.arange(S, dtype=np.int32), -1)[:, None]], axis=1
        )
    for a in (next_sc, class_v, final_s):
        a.flags.writeable = False
    return TokenAutomaton(next_sc=next_sc, class_v=class_v, final_s=final_s, initial=0, what=what)


def token_classes(
    froms, tokens, tos, S: int, V: int, check=lambda classes: None
) -> tuple[np.ndarray, np.ndarray]:
    """(class_v [V], next_sc [S, C]) of the moves (froms[i], tokens[i]) -> tos[i]: tokens
    with the same moves in every state share a class; class 0 holds those with none.
    `check(C)` runs before a table of C classes is made (to refuse one too large).

    Each token's moves are summed as 64-bit hashes of (state, next state) (numpy, no
    Python loop over ~3 million moves: each 32-bit half summed exactly); two different
    columns summing alike would write two next states into one cell or leave a token with
    fewer moves than its class, which the check below finds, and then the classes are
    made exactly by the moves' bytes."""
    class_v = _classes_by_hash(froms, tokens, tos, V)
    check(int(class_v.max(initial=0)) + 1)
    next_sc = _table(froms, tokens, tos, S, class_v)
    if not _consistent(froms, tokens, tos, class_v, next_sc):
        class_v = _classes_exact(froms, tokens, tos, V)
        check(int(class_v.max(initial=0)) + 1)
        next_sc = _table(froms, tokens, tos, S, class_v)
    return class_v, next_sc


def _mix(x):
    """splitmix64 of uint64 x (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _classes_by_hash(froms, tokens, tos, V: int) -> np.ndarray:
    move = _mix((froms.astype(np.uint64) << np.uint64(32)) | tos.astype(np.uint64))
    # each half summed in float64: exact below 2**21 states (a wrong sum beyond is a
    # collision like any other: the check in token_classes finds it)
    low = np.bincount(tokens, (move & np.uint64(0xFFFFFFFF)).astype(np.float64), V)
    high = np.bincount(tokens, (move >> np.uint64(32)).astype(np.float64), V)
    present = np.flatnonzero(np.bincount(tokens, minlength=V))
    keys = list(zip(low[present].tolist(), high[present].tolist(), strict=True))
    return _numbered(present, keys, V)


def _classes_exact(froms, tokens, tos, V: int) -> np.ndarray:
    order = np.lexsort((froms, tokens))
    tok = tokens[order]
    starts = np.flatnonzero(np.r_[True, tok[1:] != tok[:-1]])
    moves = np.stack([froms[order], tos[order]], axis=1)
    keys = [moves[a:b].tobytes() for a, b in zip(starts, [*starts[1:], len(tok)], strict=True)]
    return _numbered(tok[starts], keys, V)


def _numbered(token_ids, keys, V: int) -> np.ndarray:
    """class_v: each key's class, numbered from 1 in first-seen order; 0 elsewhere."""
    number: dict = {}
    class_v = np.zeros((V,), np.int32)
    class_v[token_ids] = [number.setdefault(k, len(number) + 1) for k in keys]
    return class_v


def _table(froms, tokens, tos, S: int, class_v) -> np.ndarray:
    next_sc = np.full((S, int(class_v.max(initial=0)) + 1), -1, np.int32)
    next_sc[froms, class_v[tokens]] = tos
    return next_sc


def _consistent(froms, tokens, tos, class_v, next_sc) -> bool:
    """Every move is in its class's column, and no token has fewer moves than its class."""
    if not np.array_equal(next_sc[froms, class_v[tokens]], tos):
        return False
    moves_v = np.bincount(tokens, minlength=len(class_v))
    return bool(np.array_equal(moves_v, (next_sc >= 0).sum(axis=0)[class_v] * (class_v > 0)))
