"""docs/library.md's research loop runs as written (on the tiny text model instead of
CKPT), with nothing imported from outside `lj.decoding`, and its lookahead accepts
guesses (its own last line checks the tokens against plain decoding)."""

import re
from pathlib import Path

import numpy as np

import lookahead_jax as lj

DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"
INTRO = "A research loop that drives the steps itself"


def research_loop_code() -> str:
    text = DOC.read_text()
    assert INTRO in text, f"{DOC} lost its research loop"
    match = re.search(r"```python\n(.*?)```", text[text.index(INTRO) :], re.S)
    assert match, f"no python block after {INTRO!r}"
    return match.group(1)


def test_lj_decoding_exports_what_a_research_loop_takes():
    for name in ("DecodeSpec", "DecodeState", "LookaheadConfig", "RowSampling", "row_keys"):
        assert name in lj.decoding.__all__ and hasattr(lj.decoding, name), name
    imports = [line for line in research_loop_code().splitlines() if "import" in line]
    assert imports == [
        "import numpy as np",
        "import lookahead_jax as lj",
        "from lookahead_jax import decoding",
    ]


def test_the_research_loop_runs_as_written(tiny_text_ckpt):
    code = research_loop_code()
    assert code.count('"CKPT"') == 1
    scope: dict = {}
    exec(compile(code.replace('"CKPT"', repr(str(tiny_text_ckpt))), str(DOC), "exec"), scope)
    emitted = np.stack(scope["emitted"])  # [steps, B]: tokens each step emitted
    assert emitted.max() > 1  # some step accepted a guess
    # start emitted each row's first token, the steps the rest
    assert (1 + emitted.sum(0) == [len(row) for row in scope["new"]]).all()


SOURCE_INTRO = "## A guess source of your own"


def test_a_guess_source_written_outside_the_package_runs_exact(tiny_text_ckpt):
    """docs/library.md's Remembered source, plugged in with no edit to the package:
    lookahead with it equals plain decoding, and it is credited most of the guesses
    accepted (the built-in sources cannot see the earlier answer it remembers)."""
    text = DOC.read_text()
    assert SOURCE_INTRO in text, f"{DOC} lost its guess-source example"
    match = re.search(r"```python\n(.*?)```", text[text.index(SOURCE_INTRO) :], re.S)
    code = match.group(1)
    assert code.count('"CKPT"') == 1 and "lookahead_jax." not in code.replace("import", "")
    scope: dict = {}
    exec(compile(code.replace('"CKPT"', repr(str(tiny_text_ckpt))), str(DOC), "exec"), scope)
    assert scope["config"].source_names == (
        "pool", "suffix", "recycle", "remembered", "window"
    )  # fmt: skip
    stats = scope["out"].stats
    mine = stats.sources["remembered"]
    assert mine.proposed >= mine.paths > 0
    assert mine.tokens > stats.accepted_tokens / 2  # it earns its keep
    assert sum(scope["accepted"].values()) > 0
