"""Where every token of a consistency example sits: one forward pass holds the prompt, the
fixed point (the model's greedy output) and one Jacobi state of every n-token block.

A row has S = P + 2Y columns (P prompt columns, Y = m * n output columns):

    columns [0, P)        the prompt, left-padded: token i of a p-token prompt at
                          column P - p + i, position i
    columns [P, P + Y)    the fixed point y*: y*_t at column P + t, position p + t
    columns [P + Y, S)    the guesses: block k's token j (g_k[j]) at column
                          P + Y + k*n + j, position p + k*n + j, the position of y*_{k*n+j}

Attention: the prompt and y* are one causal sequence; guess block k sees the prompt,
y*[:k*n] (the true text before it) and its own tokens up to itself — so every block is a
Jacobi state conditioned on the true prefix, and all m blocks are computed at once.
Padding (prompt columns before the prompt, output columns at or past the row's output
length `out_len`) is seen by no one; each column always sees itself (no empty softmax).

Predictions for block k's token j (the distribution of the token at position
p + k*n + j) come from the column holding the token at the position before it:

    fixed point:  column P + k*n + j - 1        (k = j = 0: column P - 1, the prompt's last)
    guess:        column P + Y + k*n + j - 1    (j >= 1; j = 0 has no guessed context)

Requesting the 2Y rows R = [P - 1, P + 2Y - 1) gives both: fixed-point row of output
token t is R[t], guess row of (k, j >= 1) is R[Y + k*n + j].

Worked example: P = 3, n = 2, m = 2 (Y = 4), a 2-token prompt "a b", y* = "c d e f",
guesses g0 = "x d", g1 = "e y":

    column    0    1  2  3  4  5  6  7  8  9  10
    token     pad  a  b  c  d  e  f  x  d  e  y
    position  -    0  1  2  3  4  5  2  3  4  5

Column 9 (g1[0] = e, position 4) sees a b c d (columns 1-4) and itself; not e f, not g0.
The fixed point's distribution for y*_3 = f is row 5 (after e); block 1's guess for it
is row 9 (after g1[0]). R = [2, 10): rows 2 3 4 5 (predicting c d e f) then 6 7 8 9.
"""

from __future__ import annotations

import jax.numpy as jnp


def columns(max_prompt: int, block: int, blocks: int) -> int:
    """S = P + 2Y."""
    return max_prompt + 2 * block * blocks


def positions_and_mask(prompt_len_b, out_len_b, max_prompt: int, block: int, blocks: int):
    """positions [B, S] int32 and the attention mask [B, S, S] bool (row attends to
    column) for rows with these prompt and output lengths (out_len <= Y)."""
    P, n, Y = max_prompt, block, block * blocks
    S = P + 2 * Y
    s = jnp.arange(S)
    p = prompt_len_b[:, None]  # [B, 1]
    in_prompt, in_fixed, in_guess = s < P, (s >= P) & (s < P + Y), s >= P + Y
    t = jnp.where(in_fixed, s - P, jnp.where(in_guess, s - P - Y, 0))  # output index
    positions = jnp.where(in_prompt, s - (P - p), p + t).astype(jnp.int32)
    valid = jnp.where(in_prompt, s >= P - p, t < out_len_b[:, None])  # [B, S]

    row, col = s[:, None], s[None, :]
    true_seq = (row < P + Y) & (col < P + Y) & (col <= row)
    block_r, block_c = t[:, None] // n, t[None, :] // n
    guess_sees_prefix = in_guess[:, None] & (
        in_prompt[None, :] | (in_fixed[None, :] & (t[None, :] < block_r * n))
    )
    guess_sees_block = in_guess[:, None] & in_guess[None, :] & (block_c == block_r) & (col <= row)
    allowed = true_seq | guess_sees_prefix | guess_sees_block  # [S, S]
    mask = (allowed[None] & valid[:, None, :] & valid[:, :, None]) | (row == col)[None]
    return positions, mask


def logits_rows(max_prompt: int, block: int, blocks: int):
    """The 2Y columns whose logits the losses and the Jacobi update need, [2Y] int32."""
    Y = block * blocks
    return jnp.arange(max_prompt - 1, max_prompt + 2 * Y - 1, dtype=jnp.int32)


def tokens(prompt_bp, fixed_by, guess_by):
    """[B, S] token ids: the left-padded prompt, y*, then the guess blocks."""
    return jnp.concatenate([prompt_bp, fixed_by, guess_by], axis=1).astype(jnp.int32)


def logits(lm, params, prompt_bp, fixed_by, guess_by, prompt_len_b, out_len_b, block: int,
           fixed_only: bool = False):  # fmt: skip
    """[B, 2Y, V]: one forward pass of the layout, the logits of `logits_rows`: the first
    Y rows predict y* from the true text, the next Y each block's tokens from its guesses.
    fixed_only: [B, Y, V], the first Y rows alone (a teacher needs no more); they see
    only the prompt and y*, so the pass leaves the guess columns out (P + Y columns, not S)."""
    P, Y = prompt_bp.shape[1], fixed_by.shape[1]
    blocks = Y // block
    seq = tokens(prompt_bp, fixed_by, guess_by)
    positions, mask = positions_and_mask(prompt_len_b, out_len_b, P, block, blocks)
    if fixed_only:
        seq, positions, mask = seq[:, : P + Y], positions[:, : P + Y], mask[:, : P + Y, : P + Y]
    wanted = logits_rows(P, block, blocks)[: Y if fixed_only else 2 * Y]
    rows = jnp.broadcast_to(wanted, (seq.shape[0], wanted.shape[0]))
    return lm.apply(params, seq, positions, mask, None, rows)[0]
