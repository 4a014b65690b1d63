"""Stop strings in a growing answer, found without decoding the whole answer each round.

A round adds a few tokens to each row; the answer so far (`tokens[:checked]`) is known
to hold no stop string. A stop string that shows up now ends in the new tokens, and it
spans at most `MAX_TOKENS_PER_CHAR` tokens per character (byte-level tokenizers give one
token to each byte of a UTF-8 character). So only a window is decoded: the new tokens and
enough tokens before them to hold the longest stop string, plus a margin for a partial
character at the window's start (it decodes to a replacement character, which no stop
string holds). Per round the work is then the new tokens', not the whole answer's.

    tokens   [... checked ...][new]
    window          [ back  ][new]     back = MAX_TOKENS_PER_CHAR * longest stop + MARGIN

A stop string seen in the window is confirmed in the text of every token up to it (one
whole decode when a stop string ends the answer; more only after a false sighting): a
window that starts inside a character decodes to text the answer does not hold (U+FFFD),
so a window alone could end an answer at a stop string that is not there. Every reader
of stop strings goes through this module: the engine (`find_stop`, then `before_stop` for
the result's text) and the server's stream, which holds back what could start one
(`held_back`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_TOKENS_PER_CHAR = 4  # UTF-8: at most 4 bytes a character
MARGIN = 4  # tokens of a partial character (or a tokenizer's leading space) at the start


def window_start(checked: int, stops: Sequence[str]) -> int:
    """The first token a stop string that ends after `checked` can start at."""
    longest = max(len(s) for s in stops)
    return max(0, checked - MAX_TOKENS_PER_CHAR * longest - MARGIN)


def find_stop(
    decode: Callable[[list[int]], str], tokens: list[int], checked: int, stops: Sequence[str]
) -> int | None:
    """The length of the shortest prefix of `tokens` whose text holds a stop string, or
    None if none does. `tokens[:checked]` must hold none (checked by an earlier call)."""
    start = window_start(checked, stops)
    window = tokens[start:]
    if not holds(decode(window), stops):
        return None
    # the shortest window prefix that holds one; it ends after `checked`
    for end in range(max(1, checked - start), len(window) + 1):
        # confirmed in the whole text: a window's start inside a character can make one
        if holds(decode(window[:end]), stops) and holds(decode(tokens[: start + end]), stops):
            return start + end
    return None


def holds(text: str, stops: Sequence[str]) -> bool:
    return any(s in text for s in stops)


def before_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to the first stop string in it (the whole text when it holds none)."""
    at = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(at)] if at else text


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string (a
    stream holds them back until the next tokens tell)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
