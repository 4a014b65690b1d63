"""Structured output on the device: each row's state in its grammar, and the tables of
the grammars' automata it reads (lookahead_jax/grammar/: a TokenAutomaton each, placed at
an offset of one set of tables by the engine's GrammarBank).

Every token a constrained row chooses comes from logits masked by its state — the
prefill's first token, a plain step's, and in a lookahead step the input's row and every
draft node's row, each node in the state its path reaches — and the state then follows the
emitted tokens (decode_state.emit). A guess the grammar forbids can never match the
token chosen before it, so it is never accepted: constrained lookahead emits exactly the
tokens of constrained plain decoding, greedy and sampled alike.

    state_b   [B] int32        row b's state: a row of the tables; FREE (0) for a row with
                               no grammar (its class map puts every token in class 0,
                               which leads from FREE back to FREE)
    next_gc   [Gs, Gc] int32   the state after a token of class c in state g; -1: not
                               allowed
    kind_g    [Gs] int32       the class map m that state g reads (its grammar's; FREE's 0)
    class_mv  [Gm, V] int32    token v's class under class map m (grammar/automaton.py)
    chains_gl [Gs, Gl] int32   the tokens of the text the grammar fixes ahead of state g,
                               as the tokenizer writes it (-1 after): a lookahead step's
                               guesses (grammar/fixed_text.py, guesses/grammar_source.py)

Worked example: a row in state g = 5 of a grammar placed with class map m = 2 (kind_g[5]
= 2) may choose token v where next_gc[5, class_mv[2, v]] >= 0, and moves there.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

FREE = 0  # the state of a row without a grammar: table row 0 allows everything


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GrammarTables:
    """The grammars' tables (module docstring): not per row, so the slot edits
    (engine/slot_state.py) keep them whole."""

    next_gc: Int[Array, "Gs Gc"]
    kind_g: Int[Array, " Gs"]
    class_mv: Int[Array, "Gm V"]
    chains_gl: Int[Array, "Gs Gl"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GrammarRows:
    """The rows' grammar states and the tables (module docstring)."""

    state_b: Int[Array, " B"]
    tables: GrammarTables | None


def next_states(tables: GrammarTables, state_x, token_x):
    """The state after token_x in state_x (same shapes); -1 where the token is not allowed
    or the state already was -1."""
    g = jnp.maximum(state_x, 0)
    nxt = tables.next_gc[g, tables.class_mv[tables.kind_g[g], token_x]]
    return jnp.where(state_x >= 0, nxt, -1)


def mask(logits_brv, state_br, tables: GrammarTables):
    """The logits with the tokens each row's state forbids at the lowest value (a state of
    -1, a draft node whose own token was forbidden, masks as FREE: its row never decides
    an emitted token)."""
    g_br = jnp.maximum(state_br, FREE)
    class_brv = tables.class_mv[tables.kind_g[g_br]]
    allowed_brv = jnp.take_along_axis(tables.next_gc[g_br], class_brv, axis=-1) >= 0
    return jnp.where(allowed_brv, logits_brv, jnp.finfo(logits_brv.dtype).min)


def mask_if_any(logits_brv, state_br, tables: GrammarTables):
    """`mask`, run only in a step where some row follows a grammar (a batch of FREE rows
    keeps its logits without reading the tables)."""
    return jax.lax.cond(
        jnp.any(state_br != FREE),
        lambda: mask(logits_brv, state_br, tables),
        lambda: logits_brv,
    )


def advance(rows: GrammarRows, new_be, count_b) -> GrammarRows:
    """The rows after emitting their first count_b [B] of the tokens new_be [B, E]."""
    state_b = rows.state_b
    for e in range(new_be.shape[1]):
        state_b = jnp.where(e < count_b, next_states(rows.tables, state_b, new_be[:, e]), state_b)
    return dataclasses.replace(rows, state_b=state_b)


def chains(rows: GrammarRows):
    """[B, Gl]: each row's guess, the tokens of the text its grammar fixes next (-1 after)."""
    return rows.tables.chains_gl[jnp.maximum(rows.state_b, FREE)]


def node_states(rows: GrammarRows, tokens_bz, parent_bz, depth: int):
    """[B, Z]: the state each draft node's path reaches (its parent's state, the row's for
    a child of the input (parent < 0), followed by its token), -1 once a token on the path
    is forbidden. Parents come before children, so `depth` rounds settle every node."""
    root_b = rows.state_b[:, None]
    states_bz = jnp.full(tokens_bz.shape, -1, jnp.int32)
    for _ in range(depth):
        parent_state = jnp.take_along_axis(states_bz, jnp.maximum(parent_bz, 0), axis=1)
        parent_state = jnp.where(parent_bz < 0, root_b, parent_state)
        states_bz = next_states(rows.tables, parent_state, tokens_bz)
    return states_bz
