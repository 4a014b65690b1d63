"""Shared CLI error handling: bad input -> one line on stderr, exit 2, no traceback.

* `UserInputError` (and the OSErrors that name a user's path: not found, permission
  denied, is/is not a directory) -> `error: <message>` on one line, exit 2;
* argparse's own errors (unknown flag, a non-integer where an integer is needed, a
  value outside `choices`) -> the same one-line form, exit 2 (`OneLineArgumentParser`);
* Ctrl-C (KeyboardInterrupt; SIGTERM where the work maps it to one) -> exit 130;
* a closed stdout (`... | head -1`) -> quiet exit 0;
* anything else is a bug: one line naming the exception, exit 1.

`--debug` adds the traceback in every case.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from lookahead_jax.errors import MissingFileError, UserInputError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

# OSErrors about a path the user gave; other OSErrors (disk full, ...) stay internal errors
_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def one_line(text: str) -> str:
    """`text` with its line breaks folded into spaces (a message must stay one line)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (`error: ... (see --help)`), exit 2."""

    def error(self, message: str):
        print(f"error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def read_user_file(path, flag: str, kind: str) -> str:
    """The UTF-8 text of the file a user named with `flag`; each way reading it can fail
    is one line naming the flag, the path and what to give instead (`kind`, e.g. 'a text
    file')."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise MissingFileError(f"{flag} not found: {path}; give {kind}") from None
    except IsADirectoryError:
        raise UserInputError(f"{flag} {path} is a directory; give {kind}") from None
    except UnicodeDecodeError as e:
        raise UserInputError(
            f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start}); give {kind}"
        ) from None
    except OSError as e:
        raise UserInputError(f"cannot read {flag} {path}: {e.strerror or e}") from None


def run_cli(work, debug: bool = False) -> int:
    """Run `work()`; map user errors to exit 2 and Ctrl-C to 130."""
    try:
        return work()
    except UserInputError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except _PATH_ERRORS as e:
        if debug:
            traceback.print_exc()
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {one_line(e.strerror or e)}{where}", file=sys.stderr)
        return EXIT_BAD_INPUT
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
