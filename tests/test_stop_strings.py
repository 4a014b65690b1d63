"""Stop strings found round by round in a window (engine/stop_strings.py) equal the search
over the whole answer's text, for a character tokenizer and a byte-level one."""

import numpy as np
import pytest

from lookahead_jax.engine.stop_strings import before_stop, find_stop, held_back, window_start


def whole_answer(decode, tokens, stops):
    """The reference: the shortest prefix whose whole text holds a stop string."""
    for end in range(1, len(tokens) + 1):
        if any(s in decode(tokens[:end]) for s in stops):
            return end
    return None


def by_rounds(decode, tokens, stops, rounds):
    checked = 0
    for n in rounds:  # the answer as it grows: n tokens after each round
        end = find_stop(decode, tokens[:n], checked, stops)
        if end is not None:
            return end
        checked = n
    return None


ALPHABET = "ab c\né€"


def chars(ids):  # one token a character
    return "".join(ALPHABET[i] for i in ids)


UTF8 = "ab c\né€".encode()


def byte_level(ids):  # one token a byte; a character cut at the window's start is U+FFFD
    return bytes(UTF8[i] for i in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize(
    "decode,vocab", [(chars, len(ALPHABET)), (byte_level, len(UTF8))], ids=["chars", "bytes"]
)
def test_a_window_per_round_finds_what_the_whole_text_holds(decode, vocab):
    rng = np.random.default_rng(0)
    stops_sets = [["c\n"], ["é€"], ["€", "ab"], ["b c é"], ["\n\n"], ["ab c\né€a"]]
    found = 0
    for trial in range(300):
        stops = stops_sets[trial % len(stops_sets)]
        tokens = rng.integers(0, vocab, rng.integers(1, 80)).tolist()
        if decode is byte_level:  # whole characters, as a tokenizer emits them in the end
            tokens = [t for c in chars(rng.integers(0, 7, 40).tolist()) for t in
                      [UTF8.index(b) for b in c.encode()]]  # fmt: skip
        cuts = sorted(set(rng.integers(1, len(tokens) + 1, 5).tolist()) | {len(tokens)})
        want = whole_answer(decode, tokens, stops)
        assert by_rounds(decode, tokens, stops, cuts) == want, (tokens, stops, cuts)
        found += want is not None
    assert found > 50  # the stop strings were really met


def test_a_window_cut_inside_a_character_is_no_stop_string():
    """A window starting inside a character decodes U+FFFD there, which the answer's text
    does not hold: a stop string the window alone shows ends nothing (the scheduler took
    it for one, then found no stop string in the result's text and failed every request
    in flight on the engine thread)."""
    e_acute = [UTF8.index(b) for b in "é".encode()]  # two byte tokens
    a = UTF8.index(ord("a"))
    tokens = [a] * 3 + e_acute + [a] * 9
    stops = ["\ufffd"]
    assert "\ufffd" not in byte_level(tokens)
    for checked in range(len(tokens)):
        start = window_start(checked, stops)
        if tokens[start : start + 1] == e_acute[1:]:  # 8 tokens back from checked
            break
    else:
        raise AssertionError("no round's window starts inside the character")
    assert "\ufffd" in byte_level(tokens[start:])  # the window starts at its second byte
    assert find_stop(byte_level, tokens, checked, stops) is None


def test_the_text_before_a_stop_and_what_a_stream_holds_back():
    assert before_stop("one. two. three", [". t", "hr"]) == "one"
    assert before_stop("no stop here", ["\ufffd"]) == "no stop here"
    assert held_back("it ends with <|im", ["<|im_end|>", "x"]) == len("<|im")
    assert held_back("nothing", ["<|im_end|>"]) == 0
