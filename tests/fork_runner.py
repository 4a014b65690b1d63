"""Command-line runs at a fork's cost: a process that has imported lookahead_jax once and
forks a child for each `python -m MODULE ARGS` run.

A fresh `python -m lookahead_jax.generate` spends 2-3 s importing JAX, transformers and
the package before it reads its first flag, and test_bad_input.py runs the commands
about 70 times. Each child here is a real process of its own (its exit status, stdout and
stderr are the command's; JAX's backend starts in the child, with the child's
XLA_FLAGS), run the way `python -m` runs a module (runpy, as __main__); only the imports
are shared. The runner itself never starts JAX's backend, so no runtime threads are
forked.

Protocol (JSON lines): the test sends {"module", "args", "env"} on stdin and reads back
{"returncode", "stdout", "stderr"}.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

# imported here, in the runner, so that every child starts with them loaded
PRELOAD = (
    "lookahead_jax",
    "lookahead_jax.cli.generate",
    "lookahead_jax.cli.convert",
    "lookahead_jax.training",
)


def _child(module: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: run `module` as __main__ with `args`; never returns."""
    import runpy
    import traceback

    code = 1
    try:
        os.environ.update(env)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except BaseException:  # as the interpreter would: the traceback, exit 1
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken stream
                stream.flush()
        os._exit(code)


def serve() -> None:
    """The runner's loop: one request a line on stdin, one reply a line on stdout."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints of the runner cannot corrupt the replies
    with tempfile.TemporaryDirectory(prefix="fork-runner-") as tmp:
        out, err = str(Path(tmp) / "out"), str(Path(tmp) / "err")
        for line in sys.stdin:
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(req["module"], req["args"], req.get("env", {}), out, err)
            _, status = os.waitpid(pid, 0)
            reply = {
                "returncode": os.waitstatus_to_exitcode(status),
                "stdout": Path(out).read_text(errors="replace"),
                "stderr": Path(err).read_text(errors="replace"),
            }
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


class ForkRunner:
    """The test side: start the runner once (with the environment every run shares), then
    `run(module, args, env)` -> subprocess.CompletedProcess."""

    def __init__(self, env: dict[str, str]):
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fork_runner"],
            cwd=root,
            env={**env, "PYTHONPATH": str(root)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, module: str, args: list[str], env: dict[str, str] | None = None, timeout=180):
        request = {"module": module, "args": args, "env": env or {}}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        # one reply a request, read whole: nothing is left buffered between runs
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.proc.kill()  # its child goes with it: its stdin, the runner's pipe, closes
            raise subprocess.TimeoutExpired([module, *args], timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork runner died (exit {self.proc.wait()})")
        r = json.loads(line)
        return subprocess.CompletedProcess(
            [module, *args], r["returncode"], r["stdout"], r["stderr"]
        )

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


_RUNNER: list[ForkRunner] = []


def run_module(module: str, args: list[str], env: dict | None = None, timeout: float = 180):
    """`python -m module args` with `env` on top of one device and offline hubs, forked
    from this test process's runner, which has the imports done (a fresh interpreter per
    run would spend seconds importing JAX before it reads a flag)."""
    if not _RUNNER:
        base = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
        )
        _RUNNER.append(ForkRunner(base))
        atexit.register(_RUNNER[0].close)
    return _RUNNER[0].run(module, args, env, timeout=timeout)


if __name__ == "__main__":
    serve()
