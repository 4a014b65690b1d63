"""The on-disk checkpoint: orbax params + config + tokenizer + a manifest that detects damage.

    CKPT/
      config.json      Hugging Face style Llama config (lookahead_jax.models.config)
      manifest.json    format tag, config fingerprint, every tensor's shape, dtype
                       and byte count, every params/ file's size and CRC-32
      params/          orbax (OCDBT) checkpoint of the params as a flat dict
                       {'embed', 'layers/wq', ...} (model.flat_names)
      tokenizer.json / tokenizer.model, tokenizer_config.json, chat_template.jinja

A checkpoint is written into a staging directory beside the target and renamed
into place only when complete (`staging_dir`), so an interrupted or failed
write leaves nothing at the target. `read_params` checks the manifest before
touching orbax and turns any failure inside orbax into a CheckpointError.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import zlib
from pathlib import Path

import numpy as np

from lookahead_jax.errors import CheckpointError, MissingFileError, UserInputError
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.llama_params import flat_names, from_flat, param_specs

FORMAT = "lookahead_jax.checkpoint/1"  # a data format id: never renamed with the module
PARAMS_DIR = "params"
MANIFEST = "manifest.json"
CONFIG = "config.json"


def _orbax():
    import orbax.checkpoint as ocp  # imported lazily: it is slow to import

    return ocp


def check_out(out, force: bool = False) -> Path:
    """The output path of a conversion, or a clear error: an existing file is refused,
    an existing directory unless `force`, and so is a parent that does not exist."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out} exists and is a file; give a directory path")
    if out.exists() and not force:
        raise UserInputError(f"--out {out} already exists; pass --force to replace it")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise MissingFileError(
            f"parent directory of --out does not exist: {parent}; create it first"
        )
    return out


@contextlib.contextmanager
def staging_dir(out: Path, force: bool = False):
    """Yield a temporary directory beside `out`; rename it to `out` on success.

    Refuses an existing `out` unless `force` (then it is replaced only at the
    very end). On any exception, KeyboardInterrupt and SIGTERM included, the
    staging directory is removed and `out` is left as it was.
    """
    out = check_out(out, force)
    parent = out.parent if str(out.parent) else Path(".")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=parent))

    def on_term(signum, frame):
        raise KeyboardInterrupt

    previous = None
    with contextlib.suppress(ValueError):  # not in the main thread
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def write_params(directory: Path, cfg: LlamaConfig, flat: dict[str, np.ndarray], source: dict):
    """Write config.json, params/ (orbax) and manifest.json into `directory`."""
    directory = Path(directory)
    specs = flat_names(param_specs(cfg))
    if set(flat) != set(specs):
        raise ValueError(f"params {sorted(flat)} do not match the spec {sorted(specs)}")
    for path, spec in specs.items():
        if tuple(flat[path].shape) != spec.shape:
            raise ValueError(f"{path}: shape {flat[path].shape} != {spec.shape}")
    (directory / CONFIG).write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    ocp = _orbax()
    ckptr = ocp.StandardCheckpointer()
    ckptr.save((directory / PARAMS_DIR).absolute(), dict(flat))
    ckptr.wait_until_finished()
    ckptr.close()
    manifest = {
        "format": FORMAT,
        "config_fingerprint": cfg.fingerprint(),
        "tensors": {
            path: {"shape": list(a.shape), "dtype": str(a.dtype), "bytes": int(a.nbytes)}
            for path, a in sorted(flat.items())
        },
        "files": _file_records(directory / PARAMS_DIR),
        "source": source,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _file_sizes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()
    }


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def _file_records(root: Path) -> dict[str, dict]:
    """{relative path: {"bytes": size, "crc32": checksum}} for every file under root."""
    return {
        name: {"bytes": size, "crc32": _crc32(root / name)}
        for name, size in _file_sizes(root).items()
    }


def check_dir(path) -> Path:
    """The checkpoint directory, or a clear error if it is not one."""
    path = Path(path).expanduser()
    what = "a directory written by python -m checkpoints_convert, or smollm2-135m"
    if not path.exists():
        raise MissingFileError(f"checkpoint not found: {path}; give {what}")
    if not path.is_dir():
        raise UserInputError(f"checkpoint must be a directory, got a file: {path}; give {what}")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UserInputError(
            f"checkpoint directory is not readable: {path} (permission denied); "
            "give a directory you can read"
        )
    return path


def _damaged(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is damaged: {what}; convert it again (python -m checkpoints_convert)"
    )


def read_config(path: Path, verify: bool = True) -> tuple[LlamaConfig, dict]:
    """Config and manifest of a checkpoint, after checking that it is complete: every
    params file present with its recorded size, and (verify) its recorded CRC-32."""
    path = check_dir(path)
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        hint = "; give a directory written by python -m checkpoints_convert"
        if (path / "config.json").is_file() or any(path.glob("*.safetensors")):
            hint = f"; convert it first: python -m checkpoints_convert --src {path} --out CKPT"
        raise CheckpointError(f"{path} is not a lookahead_jax checkpoint (no {MANIFEST}){hint}")
    try:
        manifest = json.loads(manifest_file.read_text())
        cfg = LlamaConfig.from_hf_dict(json.loads((path / CONFIG).read_text()))
        if not isinstance(manifest, dict):
            raise TypeError(f"{MANIFEST} holds a {type(manifest).__name__}, not an object")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _damaged(path, f"cannot read its metadata ({e})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {manifest.get('format')!r}; this version reads {FORMAT}"
        )
    check_files(path, cfg, manifest, verify)
    return cfg, manifest


def check_files(path: Path, cfg: LlamaConfig, manifest: dict, verify: bool = True) -> None:
    """Every params file the manifest lists is present with its size and (verify) its
    CRC-32; the tensor list matches the config."""
    try:
        _check_manifest(path, cfg, manifest, verify)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise _damaged(path, f"{MANIFEST} is malformed ({type(e).__name__}: {e})") from None


def _check_manifest(path: Path, cfg: LlamaConfig, manifest: dict, verify: bool) -> None:
    if manifest.get("config_fingerprint") != cfg.fingerprint():
        raise _damaged(path, f"{CONFIG} does not match the manifest's config fingerprint")
    expected = {p: s.shape for p, s in flat_names(param_specs(cfg)).items()}
    stored = {p: tuple(t["shape"]) for p, t in manifest.get("tensors", {}).items()}
    if stored != expected:
        raise _damaged(path, "the manifest's tensor list does not match the config")
    actual = _file_sizes(path / PARAMS_DIR) if (path / PARAMS_DIR).is_dir() else {}
    files = manifest.get("files") or {}
    if not files:
        raise _damaged(path, "the manifest lists no params files")
    for name, record in files.items():
        where = f"{PARAMS_DIR}/{name}"
        if name not in actual:
            raise _damaged(path, f"missing {where}")
        if actual[name] != record["bytes"]:
            raise _damaged(
                path, f"{where} has {actual[name]} bytes, expected {record['bytes']} (truncated?)"
            )
        if verify and _crc32(path / PARAMS_DIR / name) != record["crc32"]:
            raise _damaged(path, f"{where} fails its CRC-32 checksum (corrupted)")


def read_params(path: Path, cfg: LlamaConfig, dtype, shardings):
    """Restore params (model.LlamaParams) as `dtype`, each array placed with its sharding
    from `shardings` (a params-shaped tree)."""
    import jax

    ocp = _orbax()
    specs = flat_names(param_specs(cfg))
    where = flat_names(shardings)
    target = {
        p: jax.ShapeDtypeStruct(spec.shape, dtype, sharding=where[p]) for p, spec in specs.items()
    }
    try:
        ckptr = ocp.StandardCheckpointer()
        flat = ckptr.restore((Path(path) / PARAMS_DIR).absolute(), target)
        ckptr.close()
    except Exception as e:  # orbax/tensorstore raise many types on damaged data
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _damaged(path, f"orbax cannot restore its params ({first[:300]})") from e
    return from_flat(cfg, flat)
