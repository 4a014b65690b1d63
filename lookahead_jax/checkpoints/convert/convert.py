"""Convert a Hugging Face Llama directory or a GGUF file into a lookahead_jax checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from lookahead_jax.checkpoints import checkpoint
from lookahead_jax.checkpoints.convert import gguf as gguf_src
from lookahead_jax.checkpoints.convert import hf as hf_src
from lookahead_jax.checkpoints.convert.layout import to_params
from lookahead_jax.errors import MissingFileError, UserInputError

DTYPES = ("float32", "bfloat16", "float16")


def _np_dtype(name: str):
    if name not in DTYPES:
        raise UserInputError(f"unknown --dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def convert(src, out, dtype: str = "float32", force: bool = False, progress: bool = True) -> Path:
    """Write the checkpoint for `src` (HF directory or .gguf file) to `out`, atomically."""
    from tqdm import tqdm

    src, out = Path(src).expanduser(), Path(out).expanduser()
    np_dtype = _np_dtype(dtype)
    if not src.exists():
        raise MissingFileError(
            f"--src does not exist: {src}; give a Hugging Face Llama directory or a .gguf file"
        )
    checkpoint.check_out(out, force)  # before any reading: a bad --out fails fast
    is_gguf = src.is_file()
    if is_gguf:
        with open(src, "rb") as f:
            if f.read(4) != b"GGUF":
                raise UserInputError(
                    f"--src {src} is a file but not a GGUF model; give a .gguf file or a "
                    "Hugging Face model directory"
                )
        reader = gguf_src.open_reader(src)
        cfg = gguf_src.read_config(reader, src)
        gguf_src.check_quant_types(reader, src)
        total, tensors = gguf_src.read_tensors(reader, cfg)
    else:
        cfg = hf_src.read_config(src)
        total, tensors = hf_src.read_tensors(src)
    start = time.time()
    with checkpoint.staging_dir(out, force=force) as tmp:
        bar = tqdm(
            total=total or None,
            desc=f"converting {src.name}",
            unit="tensor",
            disable=not progress,
            leave=False,
        )
        with bar:
            try:
                flat = to_params(cfg, tensors, np_dtype, progress=bar)
            except UserInputError as e:  # missing/unexpected/misshapen tensors: say where
                raise type(e)(f"{src}: {e}") from e
        if is_gguf:
            if "tokenizer.ggml.model" in reader.fields:
                gguf_src.save_tokenizer(reader, src, tmp)
        else:
            hf_src.copy_tokenizer(src, tmp)
        source = {
            "path": str(src.absolute()),
            "kind": "gguf" if is_gguf else "huggingface",
            "dtype": dtype,
            "seconds": round(time.time() - start, 2),
        }
        checkpoint.write_params(tmp, cfg, flat, source)
    return out
