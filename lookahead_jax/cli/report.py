"""What the generate command prints: the stats line (stderr), the --json record, the note
on an empty answer, and whether to colour (cli/generate.py)."""

from __future__ import annotations

import os
import sys


def wants_color(mode: str, stdout=None) -> bool:
    """Whether --color `mode` colours this run's output: "always", or "auto" where stdout
    is a terminal and NO_COLOR (no-color.org) is unset — escape codes in a file or a
    pipe are noise."""
    stdout = sys.stdout if stdout is None else stdout
    if mode == "auto":
        return stdout.isatty() and not os.environ.get("NO_COLOR")
    return mode == "always"


def mode_words(s) -> str:
    """How a run decoded, from its stats: plain, a layout, or auto's choice and why."""
    from lookahead_jax.decoding import autotune

    config = s.config
    mode = "plain" if config.lookahead is None else f"lookahead {config.lookahead.name}"
    if config.auto is not None:
        mode = f"auto: {mode}; {autotune.why(config.auto.describe())}"
        if config.switched_to_plain_after_steps is not None:
            mode += f"; plain after step {config.switched_to_plain_after_steps}"
    return mode


def stats_line(out, total_s: float) -> str:
    s = out.stats
    mode = mode_words(s)
    return (
        f"[{mode}] {s.new_tokens} tokens in {s.decode_s + s.prefill_s:.2f} s "
        f"({s.tokens_per_s:.1f} tokens/s), {s.row_steps} steps, compression "
        f"{s.compression:.2f}, prefill {s.prefill_s:.2f} s, compile {s.compile_s:.2f} s, "
        + (f"grammar {s.grammar_compile_s:.2f} s, " if s.grammar_requests else "")
        + f"total {total_s:.1f} s"
        + (" (interrupted)" if s.interrupted else "")
    )


def json_record(out, load_s: float, total_s: float) -> dict:
    """The --json line: the prompt's text and tokens, its stats, the CLI's load time."""
    s = out.stats.as_dict()
    return {
        "text": out.texts[0] if out.texts else None,
        "token_ids": out.token_ids[0],
        "new_tokens": s["new_tokens"],
        "steps": s["row_steps"],  # one prompt: its forward passes
        "compression": s["compression"],
        "decode_s": s["decode_s"],
        "tokens_per_s": s["tokens_per_s"],
        "prefill_s": s["prefill_s"],
        "compile_s": s["compile_s"],
        "grammar_compile_s": s["grammar_compile_s"],
        "load_s": load_s,
        "total_s": total_s,
        "accepted_hist": s["accepted_hist"],
        "sources": s["sources"] or None,
        "interrupted": s["interrupted"],
        "config": s["config"],
    }


def empty_answer_note(out, chat: bool) -> str | None:
    """Why a prompt's answer is empty, for stderr (None: it is not): the model's first
    token ended it."""
    if out.token_ids[0] or out.stats.interrupted:
        return None
    how = (
        "in the chat template (--no-chat sends it as it is)"
        if chat
        else "as it is, without a chat template (--chat wraps it in one, where the tokenizer "
        "has one)"
    )
    return (
        "the answer is empty: the model's first token was its end of sequence; the prompt "
        f"was sent {how}"
    )
