"""Read a Hugging Face Llama directory: config, tensors (safetensors or PyTorch .bin,
single or sharded with an index file) and tokenizer files.

safetensors files are parsed directly (a JSON header + raw little-endian data,
memory-mapped), so bfloat16 checkpoints need neither torch nor a numpy
extension beyond ml_dtypes (a jax dependency).
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lookahead_jax.errors import CheckpointError, MissingFileError, UserInputError
from lookahead_jax.models.config import LlamaConfig

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def read_config(src: Path) -> LlamaConfig:
    config_file = src / "config.json"
    if not config_file.is_file():
        raise UserInputError(
            f"{src} is not a Hugging Face model directory (no config.json); give a Hugging "
            "Face Llama directory or a .gguf file"
        )
    try:
        d = json.loads(config_file.read_text())
    except ValueError as e:
        raise UserInputError(f"{config_file} is not valid JSON: {e}") from e
    if not isinstance(d, dict):
        raise UserInputError(f"{config_file} must hold a JSON object, not {type(d).__name__}")
    gen = src / "generation_config.json"
    if gen.is_file():  # generation_config's EOS list is what generate() stops on
        try:
            g_eos = json.loads(gen.read_text()).get("eos_token_id")
        except (ValueError, AttributeError) as e:
            raise UserInputError(f"{gen} is not a valid generation config: {e}") from e
        if g_eos is not None:
            eos = d.get("eos_token_id")
            ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
            ids |= set(g_eos if isinstance(g_eos, list) else [g_eos])
            d["eos_token_id"] = sorted(ids)
    try:
        return LlamaConfig.from_hf_dict(d)
    except KeyError as e:
        raise UserInputError(f"{config_file} lacks the field {e.args[0]!r}") from e
    except UserInputError as e:  # unsupported architecture or variant: say where
        raise UserInputError(f"{config_file}: {e}") from e
    except (TypeError, ValueError) as e:
        raise UserInputError(f"{config_file} has a field of the wrong type: {e}") from e


def weight_files(src: Path) -> list[Path]:
    """The tensor files of a HF directory, in index order when sharded."""
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        index = src / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                weight_map.values()
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{index} is not a valid index file ({e})") from e
            files = [src / f for f in dict.fromkeys(weight_map.values())]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise MissingFileError(f"{index_name} names missing shard(s): {missing}")
            return files
        if (src / single).is_file():
            return [src / single]
    found = sorted(p.name for p in src.glob("*.safetensors")) or sorted(
        p.name for p in src.glob("*.bin")
    )
    if found:
        return [src / f for f in found]
    raise UserInputError(f"no weights in {src} (need *.safetensors or pytorch_model*.bin)")


_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _np_dtype(name: str):
    if name == "BF16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    if name not in _SAFETENSORS_DTYPES:
        raise UserInputError(f"unsupported safetensors dtype {name}")
    return _SAFETENSORS_DTYPES[name]


def _safetensors_header(path: Path) -> tuple[int, dict]:
    """(header length, header dict) of a safetensors file, or a CheckpointError."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path} is truncated (no safetensors header)")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise CheckpointError(
                f"{path} is truncated or not a safetensors file (header of {header_len} bytes, "
                f"file of {size})"
            )
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise CheckpointError(f"{path} has a corrupt safetensors header") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header")
    return header_len, header


def read_safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    header_len, header = _safetensors_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            dtype = _np_dtype(info["dtype"])
            if end > len(data):
                raise CheckpointError(f"{path} is truncated (tensor {name} runs past the end)")
            yield name, np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"])
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, UserInputError):
                raise
            raise CheckpointError(f"{path}: tensor {name} is damaged ({e})") from e


def read_torch_bin(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    try:
        import torch
    except ImportError as e:
        raise UserInputError(
            f"{path.name} is a PyTorch file; reading it needs torch (pip install torch==2.13.0)"
        ) from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    for name, t in state.items():
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            yield name, t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            yield name, t.numpy()


def read_tensors(src: Path) -> tuple[int, Iterator[tuple[str, np.ndarray]]]:
    """(number of tensors, iterator of (name, array)) over all weight files."""
    files = weight_files(src)

    def count(f: Path) -> int:
        """Tensors in `f`; for safetensors, also checks now (before any output is
        started) that the file holds every byte its header promises."""
        if f.suffix != ".safetensors":
            return 0
        header_len, header = _safetensors_header(f)
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        try:
            end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CheckpointError(f"{f} has a corrupt safetensors header ({e})") from e
        size = f.stat().st_size
        if 8 + header_len + end > size:
            raise CheckpointError(
                f"{f} is truncated: its header promises {8 + header_len + end} bytes, "
                f"the file has {size}"
            )
        return len(tensors)

    total = sum(count(f) for f in files)

    def gen():
        for f in files:
            yield from (read_safetensors(f) if f.suffix == ".safetensors" else read_torch_bin(f))

    return total, gen()


def copy_tokenizer(src: Path, out: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
            copied.append(name)
    return copied
