"""What the engine says about itself: how it decodes, in a line (`decoding`: the server's
start line and /health), and where a slow serving round's seconds went (`log_if_slow`: a
warning on the `lookahead_jax.engine` logger, a stall a client sees as a late token)."""

from __future__ import annotations

import logging

log = logging.getLogger("lookahead_jax.engine")
SLOW_ROUND_S = 5.0  # a serving round longer than this is logged, with where its time went


def decoding(lookahead, auto_choice, temperature: float) -> str:
    """How an engine with this `lookahead` setting decodes: plain, a fixed layout every
    round, or auto's layout (auto_choice: an autotune.Choice for one row at
    `temperature`, None before warm_up) run in the rounds whose rows measure it faster."""
    if lookahead is None:
        return "plain decoding"
    if lookahead != "auto":
        return f"lookahead {lookahead.name} every round"
    if auto_choice is None:
        return "auto (its layout chosen at the first round)"
    t = temperature
    if auto_choice.config is None:
        return f"auto: plain (no lookahead layout pays for one row at temperature {t:g})"
    return (
        f"auto: lookahead {auto_choice.config.name} or plain steps, each round whichever its "
        f"rows measure faster (for one row at temperature {t:g}: a step "
        f"{auto_choice.cost_ratio:.2f}x a plain one for ~{auto_choice.expected_compression:.2f} "
        "tokens)"
    )


def round_figures(stats) -> tuple[float, ...]:
    """(compile_s, prefill_s, decode_s, prefill calls, loop rounds) of `stats` so far."""
    return stats.compile_s, stats.prefill_s, stats.decode_s, stats.prefill_calls, stats.rounds


def log_if_slow(seconds: float, before: tuple, after: tuple, rows: int) -> None:
    """Log a round slower than SLOW_ROUND_S with where its seconds went, from the
    `round_figures` before and after it (a program compiled while serving shows as
    compile seconds; seconds no part claims are host work around the device calls)."""
    if seconds < SLOW_ROUND_S:
        return
    compile_s, prefill_s, decode_s, prefills, rounds = (
        a - b for a, b in zip(after, before, strict=True)
    )
    other = seconds - compile_s - prefill_s - decode_s
    log.warning(
        "a round took %.1f s: %.1f s compiling, %.1f s in %d prefills, %.1f s in %d "
        "decode calls at %d rows, %.1f s other",
        seconds, compile_s, prefill_s, prefills, decode_s, rounds, rows, other,
    )  # fmt: skip
