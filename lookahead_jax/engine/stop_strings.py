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
    if not any(s in decode(window) for s in stops):
        return None
    # the shortest window prefix that holds one; it ends after `checked`
    for end in range(max(1, checked - start), len(window) + 1):
        if any(s in decode(window[:end]) for s in stops):
            return start + end
    return None  # unreachable: the whole window holds one
