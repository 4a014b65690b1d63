"""Shared CLI error handling: bad input -> one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import sys
import traceback

from lookahead_jax.errors import UserInputError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def run_cli(work, debug: bool = False) -> int:
    """Run `work()`; map user errors to exit 2 and Ctrl-C to 130."""
    try:
        return work()
    except UserInputError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except Exception as e:  # a bug, not bad input: say so, keep it to one line unless --debug
        if debug:
            traceback.print_exc()
        else:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(
                f"internal error: {type(e).__name__}: {msg} (rerun with --debug for the traceback)",
                file=sys.stderr,
            )
        return 1


def _silence_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so the interpreter's final flush
    does not raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
