"""`lookahead-jax COMMAND ...` (the console script, [project.scripts] in pyproject.toml;
also `python -m lookahead_jax`): one front door to the commands.

    lookahead-jax generate ...   text from a prompt or a file of prompts   cli/generate.py
    lookahead-jax serve ...      the OpenAI-compatible HTTP server          cli/serve.py
    lookahead-jax convert ...    HF directory or GGUF -> checkpoint         cli/convert.py
    lookahead-jax train ...      Jacobi-consistency fine-tuning            training/__main__.py

Everything after the command goes to that command's `main`, so `lookahead-jax generate
--help` is generate's help. Each command also runs under its older `python -m` name
(`ALIASES`), which scripts and the design card use.
"""

from __future__ import annotations

import sys

COMMANDS = {
    "generate": "generate text from a prompt, or from a JSONL file of prompts",
    "serve": "serve a model over an OpenAI-compatible HTTP API",
    "convert": "convert a Hugging Face directory or a GGUF file into a checkpoint",
    "train": "fine-tune a checkpoint so that lookahead's guesses land more often",
}
ALIASES = {
    "generate": "python -m lookahead_jax.generate",
    "serve": "python -m lookahead_jax.serve",
    "convert": "python -m checkpoints_convert",
    "train": "python -m lookahead_jax.training",
}
PROG = "lookahead-jax"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: {PROG} COMMAND [ARGS ...]",
        "",
        "Exact lookahead decoding for Llama-family models in JAX.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()),
        "",
        f"`{PROG} COMMAND --help` shows a command's options. The same commands run as",
        *(f"  {ALIASES[name]}" for name in COMMANDS),
    ]
    return "\n".join(lines)


def command_main(name: str):
    """The `main(argv, prog)` of command `name` (imported only when it runs)."""
    if name == "generate":
        from lookahead_jax.cli.generate import main
    elif name == "serve":
        from lookahead_jax.cli.serve import main
    elif name == "convert":
        from lookahead_jax.cli.convert import main
    else:
        from lookahead_jax.training.__main__ import main
    return main


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(
            f"error: {what}; give one of {', '.join(COMMANDS)} (see {PROG} --help)",
            file=sys.stderr,
        )
        return 2
    name = argv[0]
    return command_main(name)(argv[1:], prog=f"{PROG} {name}")


if __name__ == "__main__":
    sys.exit(main())
