"""Dataset mode of the command line: a JSONL file of prompts in, one JSONL line per prompt
out, through the engine (engine/continuous.py).

Input: a prompt file (prompts_jsonl.py has its keys), one JSON object a line:

    {"id": "q1", "prompt": "Write a haiku", "max_new_tokens": 64, "temperature": 0.7}
    {"messages": [{"role": "user", "content": "Hi"}]}

`messages` go through the tokenizer's chat template; a line's `max_new_tokens`,
`temperature`, `top_k` and `top_p` replace the command line's. Every line is checked
before any decoding starts; a bad one stops the job with `FILE line N: what is wrong`
(exit 2) and the output file untouched.

Output: one object a line, {"id", "text", "token_ids", "new_tokens", "finish", "steps",
"prompt_tokens", "time_s"}, in finish order, each written whole and flushed, so Ctrl-C or
a crash leaves only whole lines (a torn last line, from a kill mid-write, is cut off when
the job is run again). Running the same command again skips the ids already in the
output and decodes the rest. `run` is the command's dataset mode (cli/generate.py hands
it the checked flags).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from lookahead_jax import prompts_jsonl
from lookahead_jax.cli.exits import EXIT_INTERRUPTED, read_user_file
from lookahead_jax.engine import inputs
from lookahead_jax.errors import UserInputError

STDIO = "-"


@dataclasses.dataclass(frozen=True)
class Line:
    """One checked input line: its id, token ids and settings (None = default)."""

    id: int | str
    token_ids: list[int]
    max_new_tokens: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    json_schema: dict | None = None
    regex: str | None = None


def read_prompts(
    path: str, tokenizer, vocab: int, max_context: int, max_new_tokens: int, chat: bool
) -> list[Line]:
    """Every line of `path` ('-': stdin) parsed (prompts_jsonl), tokenized
    (inputs.encode_prompt) and checked; the first bad line raises
    UserInputError('FILE line N: ...')."""
    name = "stdin" if path == STDIO else path
    text = sys.stdin.read() if path == STDIO else read_user_file(path, "--prompts", "a JSONL file")
    out: list[Line] = []
    for r in prompts_jsonl.parse(text, name):
        try:
            ids = inputs.encode_prompt(tokenizer, vocab, r.prompt, chat, "the prompt")
            inputs.check_context(max_context, len(ids), r.max_new_tokens or max_new_tokens)
        except UserInputError as e:
            raise prompts_jsonl.line_error(name, r.number, str(e)) from None
        settings = (r.max_new_tokens, r.temperature, r.top_k, r.top_p, r.json_schema, r.regex)
        out.append(Line(r.id, ids, *settings))
    return out


def done_ids(path: str) -> set:
    """The ids already in an output file (read only: nothing is changed here). A torn
    last line (no newline: a kill mid-write) does not count; any other line that is not
    a JSON object with an id means the file is not this command's output."""
    if path == STDIO or not os.path.exists(path):
        return set()
    with open(path, "rb") as f:
        data = f.read()
    ids = set()
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            ids.add(obj["id"])
        except (ValueError, KeyError, TypeError):
            raise UserInputError(
                f"{path} line {number}: not a result line of this command; give another "
                "--output (a rerun appends to it and skips the ids already there)"
            ) from None
    return ids


def check_writable(path: str) -> None:
    """Refuse an --output that cannot be written, before anything loads (the file itself
    is opened at the first result: ResultWriter)."""
    if path == STDIO:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserInputError(f"--output {path}: its folder {folder} does not exist")
    target = path if os.path.exists(path) else folder
    if os.path.isdir(path) or not os.access(target, os.W_OK):
        raise UserInputError(f"--output {path} cannot be written: give a file you may write")


class ResultWriter:
    """Appends one whole, flushed line per result to a file ('-': stdout), opened at the
    first result (a run stopped before one, compiling, leaves no empty file behind)."""

    def __init__(self, path: str):
        self.path = path
        self._file = sys.stdout.buffer if path == STDIO else None

    def write(self, record: dict) -> None:
        if self._file is None:
            _cut_torn_line(self.path)
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        self._file.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._file.flush()

    def close(self) -> None:
        if self.path != STDIO and self._file is not None:
            self._file.close()


def _cut_torn_line(path: str) -> None:
    """Drop a last line without its newline (left by a kill in the middle of a write)."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def record(result) -> dict:
    """The output line of one engine Result."""
    return {
        "id": result.id,
        "text": result.text,
        "token_ids": result.token_ids,
        "new_tokens": len(result.token_ids),
        "finish": result.finish,
        "steps": result.steps,
        "prompt_tokens": result.prompt_tokens,
        "time_s": round(result.time_s, 4),
    }


def run(args, config, info, mesh_sizes, t_start: float) -> int:
    """--prompts: check every line, skip what the output already holds, decode the rest
    through the engine, one flushed line per result. `info`: the checkpoint, checked
    (generate.inspect_checkpoint)."""
    from tqdm import tqdm

    import lookahead_jax as lj
    from lookahead_jax.cli.report import mode_words

    context = info.cfg.max_position_embeddings
    lines = read_prompts(
        args.prompts, info.tokenizer, info.cfg.vocab_size, context, args.max_new_tokens, args.chat
    )
    done = done_ids(args.output)
    todo = [line for line in lines if line.id not in done]
    where = "stdout" if args.output == STDIO else args.output
    if not todo:
        print(f"all {len(lines)} prompts are already in {where}", file=sys.stderr)
        return 0
    if len(todo) < len(lines):
        print(
            f"{len(lines) - len(todo)} of {len(lines)} prompts are already in {where}: "
            f"decoding the other {len(todo)}",
            file=sys.stderr,
        )
    mesh = lj.make_mesh(**mesh_sizes) if mesh_sizes is not None else "auto"
    model = lj.load(info, dtype=args.dtype, mesh=mesh, weights=args.weights)
    engine = lj.Engine(model, config)
    requests = [
        lj.Request(
            line.token_ids,
            line.id,
            line.max_new_tokens,
            line.temperature,
            line.top_k,
            line.top_p,
            json_schema=line.json_schema,
            regex=line.regex,
        )  # fmt: skip
        for line in todo
    ]
    results = engine.run(requests)  # checks every request before the output is touched
    writer = ResultWriter(args.output)
    written, tokens, empty = 0, 0, 0
    # the bar opens with the first result: what comes before it is compiling and the
    # first slots' decoding, which a rate per prompt from the start would read as seconds
    # a prompt (30 s/prompt, 0.0 tokens/s while nothing had come back)
    print(f"decoding {len(todo)} prompts ({engine.decoding()})", file=sys.stderr)
    bar = None
    try:
        for result in results:
            writer.write(record(result))
            written, tokens = written + 1, tokens + len(result.token_ids)
            empty += not result.token_ids and result.finish == "eos"
            if bar is None:
                bar = tqdm(total=len(todo), unit="prompt", file=sys.stderr, dynamic_ncols=True)
            bar.update(1)
            # (the bar's rate counts every second since it opened)
            bar.set_postfix({"tokens/s (wall)": f"{tokens / bar.format_dict['elapsed']:.1f}"})
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        writer.close()
        print(
            f"interrupted: {written} of {len(todo)} prompts written to {where}; run the same "
            "command again to finish the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if bar is not None:
        bar.close()
    writer.close()
    s = engine.stats
    mode = mode_words(s)
    busy = s.prefill_s + s.decode_s
    if empty:
        how = "in the chat template" if args.chat else "as they are (no chat template)"
        print(
            f"{empty} of {written} answers are empty: the model's first token was its end of "
            f"sequence; the prompts were sent {how}",
            file=sys.stderr,
        )
    print(
        f"[{mode}] {s.prompts} prompts, {s.new_tokens} tokens: {s.tokens_per_s:.1f} "
        f"tokens/s over {busy:.2f} s of prefill and decoding, {s.wall_s:.2f} s with "
        f"compiling ({s.compile_s:.2f} s) and the rest of the engine's run; compression "
        f"{s.compression:.2f}, batch {args.batch}, prompt buckets {sorted(s.prompt_buckets)}, "
        + (
            f"{s.prefix_hit_tokens} of {s.prompt_tokens} prompt tokens from the prefix cache, "
            if s.prefix_lookups
            else ""
        )
        + f"total {time.perf_counter() - t_start:.1f} s with loading",
        file=sys.stderr,
    )
    return 0
