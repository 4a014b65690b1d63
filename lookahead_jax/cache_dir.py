"""Where lookahead_jax keeps converted default models, compiled programs and tuning data.

`$LOOKAHEAD_JAX_CACHE` if set, else `$XDG_CACHE_HOME/lookahead_jax`, else
`~/.cache/lookahead_jax`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("LOOKAHEAD_JAX_CACHE"):
        return Path(os.environ["LOOKAHEAD_JAX_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lookahead_jax"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a uniquely named temporary file and a rename, so that
    readers never see half a file and concurrent writers never trip over each other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def exclusive(lock_path: Path):
    """A context manager that holds an exclusive lock on `lock_path` (created if missing)
    for its block, between processes and threads: e.g. two processes converting the
    default model at once wait for each other. (filelock: also what JAX's compilation
    cache locks its directory with.)"""
    import filelock

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(lock_path)


# Programs that compile faster than this are not stored: the decode loops (seconds each)
# are, and the state's helpers a server's warm-up runs at every row bucket (stores of
# blocks, gathers of rows: 0.2-0.8 s each, 8.7 s of warm-up, 3.3 s loaded; SmolLM2-135M,
# a 2-core Intel Xeon); the many tiny ones are not (writing thousands of entries costs
# more than it saves, and every write is a chance for two processes to meet on one file).
COMPILE_CACHE_MIN_SECONDS = 0.2
# A size cap turns on JAX's LRU eviction, and with it the file lock that serializes reads
# and writes of the cache between processes (without it an entry is written in place and
# a second process can read it half-written).
COMPILE_CACHE_MAX_BYTES = 4 << 30


def enable_compilation_cache() -> None:
    """Turn on JAX's persistent compilation cache under the cache root, or in
    $LOOKAHEAD_JAX_COMPILE_CACHE if set (the test suite gives each run its own, shared by
    its workers and the commands they start); not when the user already chose a directory
    or set LOOKAHEAD_JAX_NO_COMPILE_CACHE=1."""
    import jax

    if os.environ.get("LOOKAHEAD_JAX_NO_COMPILE_CACHE") == "1":
        return
    if jax.config.jax_compilation_cache_dir:
        return
    chosen = os.environ.get("LOOKAHEAD_JAX_COMPILE_CACHE")
    # (not "xla": entries stored there before the size cap have no access times, and JAX's
    # eviction fails on them)
    path = Path(chosen).expanduser() if chosen else cache_root() / "compiled"
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", COMPILE_CACHE_MIN_SECONDS)
    jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_MAX_BYTES)
