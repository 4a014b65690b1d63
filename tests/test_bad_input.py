"""Bad input and faults, end to end: both CLIs as real subprocesses, and the Python API.

Every row of CASES is one bad input. The CLI must exit 2 with exactly one non-empty
line on stderr (no traceback) that names the bad value, and leave nothing behind: no
`--out`, no `.NAME.partial-*` staging directory, an existing `--out` untouched. Where
the Python API has the same check, the row also calls it and expects a ValueError /
FileNotFoundError whose message is the CLI's line without its `error: ` prefix.

Generate rows whose check needs no weights use a checkpoint with a *corrupted* params
file (sizes intact, CRC-32 wrong): a check that ran only after loading the weights
would report the damage instead, so these rows also prove the fail-fast order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest

import lookahead_jax as lj
from tests import tiny
from tests.fork_runner import run_module

GEN, CONV = "lookahead_jax.generate", "checkpoints_convert"
LONG_PROMPT_TOKENS = 1000  # the tiny models' context is 1024


# ------------------------------------------------------------------ the bad inputs


def write_word_tokenizer(directory: Path, vocab: int = tiny.VOCAB) -> None:
    """A whitespace word-level tokenizer over the tiny models' vocabulary: "w5 w9" -> [5, 9]."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"w{i}": i for i in range(4, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
    )


def write_gguf(
    path: Path, arch: str = "llama", quant: bool = False, window: int | None = None
) -> None:
    """A small GGUF with llama-style metadata; `quant` stores a tensor as Q8_1, a type the
    gguf package cannot dequantize; `window` writes a sliding window."""
    import gguf

    assert gguf.GGMLQuantizationType.Q8_1 not in gguf.quants._type_traits
    w = gguf.GGUFWriter(str(path), arch)
    if window is not None:
        w.add_sliding_window(window)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_vocab_size(tiny.VOCAB)
    if quant:  # Q8_1: blocks of 32 values in 40 bytes -> 32 columns = 40 bytes a row
        raw = np.zeros((tiny.VOCAB, 40), np.uint8)
        w.add_tensor("token_embd.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    else:
        w.add_tensor("token_embd.weight", np.ones((tiny.VOCAB, 32), np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def biggest_params_file(ckpt: Path) -> Path:
    return max(
        (p for p in (ckpt / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )


@pytest.fixture(scope="module")
def paths(tiny_ckpts, tmp_path_factory):
    """{name: path} of every prepared bad (and good) input; used to format CASES."""
    root = tmp_path_factory.mktemp("bad_input")
    hf_dir, plain_ckpt = tiny_ckpts["gqa"]
    p = {"root": root, "hf": hf_dir, "notok": plain_ckpt, "missing": root / "no-such-dir"}

    def copy_ckpt(name: str) -> Path:
        dst = root / name
        shutil.copytree(p["tok"], dst)
        return dst

    p["tok"] = root / "tok"  # the tiny checkpoint plus a tokenizer
    shutil.copytree(plain_ckpt, p["tok"])
    write_word_tokenizer(p["tok"])

    p["truncated"] = copy_ckpt("truncated")
    f = biggest_params_file(p["truncated"])
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    p["corrupt"] = copy_ckpt("corrupt")  # same sizes, different bytes: only the CRC sees it
    f = biggest_params_file(p["corrupt"])
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 16] = bytes(255 - b for b in data[mid : mid + 16])
    f.write_bytes(bytes(data))
    p["lost_file"] = copy_ckpt("lost_file")
    biggest_params_file(p["lost_file"]).unlink()
    p["bad_manifest"] = copy_ckpt("bad_manifest")
    (p["bad_manifest"] / "manifest.json").write_text('{"format": "lookahead_jax.checkp')
    p["unreadable"] = copy_ckpt("unreadable")
    p["unreadable"].chmod(0)

    p["afile"] = root / "afile.txt"
    p["afile"].write_text("just text\n")
    p["empty_prompt"] = root / "empty_prompt.txt"
    p["empty_prompt"].write_text(" \n\t\n")
    p["binary_prompt"] = root / "binary_prompt.txt"
    p["binary_prompt"].write_bytes(b"w5 \xff\xfe w6")
    p["long_prompt"] = root / "long_prompt.txt"
    p["long_prompt"].write_text(" ".join(f"w{4 + i % 100}" for i in range(LONG_PROMPT_TOKENS)))

    cfg = json.loads((hf_dir / "config.json").read_text())

    def hf_variant(name: str, config: dict | str | None, weights: bool = True) -> Path:
        d = root / name
        d.mkdir()
        if config is not None:
            text = config if isinstance(config, str) else json.dumps(config)
            (d / "config.json").write_text(text)
        if weights:
            os.symlink(hf_dir / "model.safetensors", d / "model.safetensors")
        return d

    p["gemma"] = hf_variant(
        "gemma", {**cfg, "model_type": "gemma", "architectures": ["GemmaForCausalLM"]}
    )
    p["mixed_archs"] = hf_variant(
        "mixed_archs", {**cfg, "model_type": "llama", "architectures": ["Qwen2ForCausalLM"]}
    )
    p["gelu"] = hf_variant("gelu", {**cfg, "hidden_act": "gelu"})
    qwen2 = {**cfg, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    qwen2.update(use_sliding_window=True, sliding_window=8)
    p["chunked"] = hf_variant(
        "chunked", {**qwen2, "layer_types": ["chunked_attention", "full_attention"]}
    )
    p["bad_window"] = hf_variant("bad_window", {**qwen2, "sliding_window": -4})
    p["gpt2"] = hf_variant("gpt2", {**cfg, "architectures": ["GPT2LMHeadModel"]})
    p["no_weights"] = hf_variant("no_weights", cfg, weights=False)
    p["bad_json"] = hf_variant("bad_json", '{"model_type": "llama", ')
    p["trunc_st"] = hf_variant("trunc_st", cfg, weights=False)
    st = (hf_dir / "model.safetensors").read_bytes()
    (p["trunc_st"] / "model.safetensors").write_bytes(st[: len(st) // 2])

    p["q8_1"] = root / "q8_1.gguf"
    write_gguf(p["q8_1"], quant=True)
    p["gguf_gpt2"] = root / "gpt2.gguf"
    write_gguf(p["gguf_gpt2"], arch="gpt2")
    p["gguf_qwen2_window"] = root / "qwen2_window.gguf"
    write_gguf(p["gguf_qwen2_window"], arch="qwen2", window=8)
    p["gguf_incomplete"] = root / "incomplete.gguf"  # llama metadata, 2 of 11 tensors
    write_gguf(p["gguf_incomplete"])
    p["gguf_truncated"] = root / "truncated.gguf"
    whole = p["gguf_incomplete"].read_bytes()
    p["gguf_truncated"].write_bytes(whole[: len(whole) // 2])
    yield p
    p["unreadable"].chmod(0o755)


# ------------------------------------------------------------------ the Python API side


_MODELS: dict = {}


def model(paths, name: str = "tok", **kw):
    """A loaded tiny model (cached per checkpoint and options)."""
    key = (name, tuple(sorted(kw.items())))
    if key not in _MODELS:
        _MODELS[key] = lj.load(paths[name], **kw)
    return _MODELS[key]


def gen(paths, prompt="w5 w6 w7", **kw):
    """lj.generate on the tiny model with a tokenizer; kw as lj.generate's."""
    return lj.generate(model(paths), [prompt], **{"lookahead": None, **kw})


def mesh2_model(paths):
    if "mesh2" not in _MODELS:
        _MODELS["mesh2"] = lj.load(
            paths["tok"], mesh=lj.make_mesh(data=2, model=1, devices=jax.devices()[:2])
        )
    return _MODELS["mesh2"]


def api_convert(args: list[str]):
    """checkpoints.convert.convert.convert with the row's --src/--out/--dtype/--force."""
    from lookahead_jax.checkpoints.convert.convert import convert

    opts = dict(zip(args[::2], args[1::2], strict=False))
    return convert(
        opts["--src"],
        opts["--out"],
        opts.get("--dtype", "float32"),
        force="--force" in args,
        progress=False,
    )


# ------------------------------------------------------------------ the table


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    module: str
    args: tuple[str, ...]  # formatted with paths (and {out}: a fresh path per test)
    needles: tuple[str, ...]  # each must be in the one stderr line (formatted too)
    # the Python API's equivalent (called with paths and the formatted args) and the
    # builtin it must raise; same=True: its message equals the CLI's line
    api: Callable | None = None
    raises: type = ValueError
    same: bool = True
    env: tuple[tuple[str, str], ...] = ()
    marks: tuple = ()


NOT_ROOT = pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root: a mode-000 directory is still readable, nothing to test",
)
G = ("--prompt", "w5 w6 w7")  # a good prompt for the tiny tokenizer
CORRUPT = ("--ckpt", "{corrupt}")  # flag checks must fail before the weights are read


def load_api(**kw):
    return lambda p, a: lj.load(dict(zip(a[::2], a[1::2], strict=False))["--ckpt"], **kw)


CASES = [
    # ---------------- generate: the checkpoint
    Case(
        "ckpt-missing",
        GEN,
        ("--ckpt", "{missing}", *G),
        ("{missing}", "not found", "checkpoints_convert"),
        load_api(),
        FileNotFoundError,
    ),
    Case(
        "ckpt-unreadable",
        GEN,
        ("--ckpt", "{unreadable}", *G),
        ("{unreadable}", "not readable"),
        load_api(),
        marks=(NOT_ROOT,),
    ),
    Case(
        "ckpt-is-a-file",
        GEN,
        ("--ckpt", "{afile}", *G),
        ("{afile}", "must be a directory"),
        load_api(),
    ),
    Case(
        "ckpt-not-converted",
        GEN,
        ("--ckpt", "{hf}", *G),
        ("{hf}", "no manifest.json", "python -m checkpoints_convert --src"),
        load_api(),
    ),
    Case(
        "ckpt-truncated",
        GEN,
        ("--ckpt", "{truncated}", *G),
        ("{truncated}", "damaged", "bytes, expected"),
        load_api(),
    ),
    Case(
        "ckpt-corrupted",
        GEN,
        (*CORRUPT, *G),
        ("{corrupt}", "damaged", "checksum"),
        load_api(),
    ),
    Case(
        "ckpt-params-file-lost",
        GEN,
        ("--ckpt", "{lost_file}", *G),
        ("{lost_file}", "damaged", "missing params/"),
        load_api(),
    ),
    Case(
        "ckpt-manifest-garbled",
        GEN,
        ("--ckpt", "{bad_manifest}", *G),
        ("{bad_manifest}", "damaged", "metadata"),
        load_api(),
    ),
    Case(
        "ckpt-without-tokenizer",
        GEN,
        ("--ckpt", "{notok}", *G),
        ("{notok}", "no tokenizer", "tokenizer.json"),
        lambda p, a: lj.generate(model(p, "notok"), ["w5"], lookahead=None),
        same=False,
    ),
    # ---------------- generate: --lookahead
    Case(
        "lookahead-not-numeric", GEN, (*CORRUPT, *G, "--lookahead", "5,x,7"), ("'5,x,7'", "N,W,G")
    ),
    Case("lookahead-two-numbers", GEN, (*CORRUPT, *G, "--lookahead", "4,5"), ("'4,5'", "N,W,G")),
    Case(
        "lookahead-empty",
        GEN,
        (*CORRUPT, *G, "--lookahead", ""),
        ("''", "N,W,G", "auto"),
    ),
    Case(
        "lookahead-n-below-2",
        GEN,
        (*CORRUPT, *G, "--lookahead", "1,5,3"),
        ("lookahead N", ">= 2", "got 1"),
        lambda p, a: lj.LookaheadConfig(1, 5, 3),
    ),
    Case(
        "lookahead-w-negative",
        GEN,
        (*CORRUPT, *G, "--lookahead", "4,-1,3"),
        ("lookahead W", ">= 0", "got -1"),
        lambda p, a: lj.LookaheadConfig(4, -1, 3),
    ),
    Case(
        "lookahead-tokens-below-2",
        GEN,
        (*CORRUPT, *G, "--lookahead", "tokens=1"),
        ("tokens per step", ">= 2", "got 1"),
        lambda p, a: lj.LookaheadConfig.for_tokens(1),
    ),
    Case(
        "lookahead-tokens-not-an-integer",
        GEN,
        (*CORRUPT, *G, "--lookahead", "tokens=lots"),
        ("--lookahead tokens=T", "integer", "tokens=lots"),
        None,
    ),
    Case(
        "lookahead-unknown-key",
        GEN,
        (*CORRUPT, *G, "--lookahead", "width=3"),
        ("--lookahead must be tokens=T", "width=3"),
        None,
    ),
    Case(
        "lookahead-g-negative",
        GEN,
        (*CORRUPT, *G, "--lookahead", "4,5,-1"),
        ("lookahead G", ">= 0", "got -1"),
        lambda p, a: lj.LookaheadConfig(4, 5, -1),
    ),
    Case(
        "lookahead-tree-bigger-than-its-sources",
        GEN,
        (*CORRUPT, *G, "--lookahead", "n=2,w=0,g=0,recycle=4,tree=9"),
        ("tree=9", "more nodes than the guess sources propose", "4 nodes"),
        lambda p, a: lj.LookaheadConfig(2, 0, 0, recycle=4, tree=9),
    ),
    Case(
        "lookahead-absurd",
        GEN,
        (*CORRUPT, *G, "--lookahead", "400,400,400"),
        ("400,400,400", "319201 tokens per step", "at most 256"),
        lambda p, a: gen(p, lookahead=lj.LookaheadConfig(400, 400, 400)),
    ),
    Case(
        "lookahead-too-big-for-context",
        GEN,
        (*CORRUPT, *G, "--lookahead", "10,20,20"),
        ("10,20,20", "361 tokens per step", "at most 256", "1024-token context"),
        lambda p, a: gen(p, lookahead=lj.LookaheadConfig(10, 20, 20)),
    ),
    # ---------------- generate: --max-new-tokens
    Case(
        "max-new-tokens-zero",
        GEN,
        (*CORRUPT, *G, "--max-new-tokens", "0"),
        ("--max-new-tokens", "> 0", "got 0"),
        lambda p, a: gen(p, max_new_tokens=0),
    ),
    Case(
        "max-new-tokens-negative",
        GEN,
        (*CORRUPT, *G, "--max-new-tokens", "-5"),
        ("--max-new-tokens", "> 0", "got -5"),
        lambda p, a: gen(p, max_new_tokens=-5),
    ),
    Case(
        "max-new-tokens-not-a-number",
        GEN,
        (*CORRUPT, *G, "--max-new-tokens", "lots"),
        ("--max-new-tokens", "'lots'", "int"),
        lambda p, a: gen(p, max_new_tokens="lots"),
        same=False,
    ),
    Case(
        "max-new-tokens-beyond-context",
        GEN,
        (*CORRUPT, *G, "--max-new-tokens", "100000"),
        ("100000", "context of 1024", "at most 1023"),
        lambda p, a: gen(p, max_new_tokens=100000),
        same=False,  # the API knows the prompt's length: "at most 1021 for this prompt"
    ),
    Case(
        "prompt-plus-max-new-tokens-beyond-context",
        GEN,
        (*CORRUPT, "--prompt-file", "{long_prompt}", "--max-new-tokens", "100"),
        (f"prompt ({LONG_PROMPT_TOKENS} tokens)", "--max-new-tokens) = 100", "at most 24"),
        lambda p, a: gen(p, p["long_prompt"].read_text(), max_new_tokens=100),
    ),
    # ---------------- generate: sampling
    Case(
        "temperature-negative",
        GEN,
        (*CORRUPT, *G, "--temperature", "-0.5"),
        ("temperature", ">= 0", "-0.5"),
        lambda p, a: gen(p, temperature=-0.5),
    ),
    Case(
        "temperature-nan",
        GEN,
        (*CORRUPT, *G, "--temperature", "nan"),
        ("temperature", ">= 0", "nan"),
        lambda p, a: gen(p, temperature=float("nan")),
    ),
    Case(
        "top-p-zero",
        GEN,
        (*CORRUPT, *G, "--top-p", "0"),
        ("top-p", "(0, 1]", "got 0.0"),
        lambda p, a: gen(p, top_p=0.0),
    ),
    Case(
        "top-p-above-one",
        GEN,
        (*CORRUPT, *G, "--top-p", "1.5"),
        ("top-p", "(0, 1]", "got 1.5"),
        lambda p, a: gen(p, top_p=1.5),
    ),
    Case(
        "top-k-negative",
        GEN,
        (*CORRUPT, *G, "--top-k", "-1"),
        ("top-k", ">= 0", "got -1"),
        lambda p, a: gen(p, top_k=-1),
    ),
    # ---------------- generate: the prompt
    Case(
        "prompt-file-missing",
        GEN,
        (*CORRUPT, "--prompt-file", "{missing}"),
        ("--prompt-file", "{missing}", "not found"),
    ),
    Case(
        "prompt-file-is-a-directory",
        GEN,
        (*CORRUPT, "--prompt-file", "{root}"),
        ("--prompt-file", "{root}", "directory"),
    ),
    Case(
        "prompt-file-empty",
        GEN,
        (*CORRUPT, "--prompt-file", "{empty_prompt}"),
        ("{empty_prompt}", "empty"),
    ),
    Case(
        "prompt-file-not-utf8",
        GEN,
        (*CORRUPT, "--prompt-file", "{binary_prompt}"),
        ("{binary_prompt}", "UTF-8"),
    ),
    Case(
        "prompt-empty",
        GEN,
        (*CORRUPT, "--prompt", "   "),
        ("--prompt", "empty", "'   '"),
        lambda p, a: gen(p, "   "),
        same=False,  # the API numbers the prompts of its batch: "prompt 0 is empty"
    ),
    Case("prompt-none", GEN, CORRUPT, ("no prompt", "--prompt", "--prompt-file")),
    Case(
        "prompt-and-prompt-file",
        GEN,
        (*CORRUPT, *G, "--prompt-file", "{afile}"),
        ("--prompt-file", "not allowed with", "--prompt"),
    ),
    Case(
        "chat-without-template",
        GEN,
        (*CORRUPT, *G, "--chat"),
        ("no chat template", "--chat"),
        lambda p, a: gen(p, chat=True),
    ),
    # ---------------- generate: dtype, mesh, other flags
    Case(
        "dtype-unknown",
        GEN,
        (*CORRUPT, *G, "--dtype", "float8"),
        ("'float8'", "float32, bfloat16"),
        lambda p, a: lj.load(p["tok"], dtype="float8"),
    ),
    Case(
        "weights-unknown",
        GEN,
        (*CORRUPT, *G, "--weights", "int4"),
        ("'int4'", "float, int8"),
        lambda p, a: lj.load(p["tok"], weights="int4"),
    ),
    Case(
        "dtype-float64-without-x64",
        GEN,
        (*CORRUPT, *G, "--dtype", "float64"),
        ("float64", "JAX_ENABLE_X64=1"),
        lambda p, a: lj.load(p["tok"], dtype="float64"),
    ),
    Case(
        "mesh-more-devices-than-available",
        GEN,
        (*CORRUPT, *G, "--mesh", "data=64"),
        ("data=64", "64 devices", "only 1"),
        lambda p, a: lj.make_mesh(data=64, devices=jax.devices()[:1]),
    ),
    Case(
        "mesh-size-zero",
        GEN,
        (*CORRUPT, *G, "--mesh", "model=0"),
        ("model", "positive integer", "got 0"),
        lambda p, a: lj.make_mesh(model=0),
    ),
    Case("mesh-malformed", GEN, (*CORRUPT, *G, "--mesh", "rows=2"), ("'rows=2'", "data=2,model=4")),
    Case(
        "mesh-data-does-not-divide-batch",
        GEN,
        (*CORRUPT, *G, "--mesh", "data=2"),
        ("batch of 1", "data axis of size 2"),
        lambda p, a: lj.generate(mesh2_model(p), ["w5 w6"], max_new_tokens=4, lookahead=None),
        env=(("XLA_FLAGS", "--xla_force_host_platform_device_count=2"),),
    ),
    Case(
        "stream-and-json",
        GEN,
        (*CORRUPT, *G, "--stream", "--json"),
        ("--stream", "--json", "cannot be combined"),
    ),
    Case("unknown-flag", GEN, (*CORRUPT, *G, "--fast"), ("--fast", "unrecognized")),
    # ---------------- convert: --src
    Case(
        "src-missing",
        CONV,
        ("--src", "{missing}", "--out", "{out}"),
        ("{missing}", "does not exist", ".gguf"),
        lambda p, a: api_convert(a),
        FileNotFoundError,
    ),
    Case(
        "src-text-file",
        CONV,
        ("--src", "{afile}", "--out", "{out}"),
        ("{afile}", "not a GGUF", "Hugging Face"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-directory-not-a-model",
        CONV,
        ("--src", "{root}", "--out", "{out}"),
        ("{root}", "no config.json"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-gemma",
        CONV,
        ("--src", "{gemma}", "--out", "{out}"),
        ("unsupported architecture", "'gemma'", "GemmaForCausalLM", "MistralForCausalLM"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-model-type-and-class-disagree",
        CONV,
        ("--src", "{mixed_archs}", "--out", "{out}"),
        ("unsupported architecture", "'llama'", "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-hidden-act-gelu",
        CONV,
        ("--src", "{gelu}", "--out", "{out}"),
        ("config.json", "hidden_act='gelu'", "silu"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-qwen2-chunked-attention-layers",
        CONV,
        ("--src", "{chunked}", "--out", "{out}"),
        ("config.json", "unsupported layer_types", "chunked_attention"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-negative-sliding-window",
        CONV,
        ("--src", "{bad_window}", "--out", "{out}"),
        ("config.json", "sliding_window must be a positive integer", "-4"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-gpt2-architectures",
        CONV,
        ("--src", "{gpt2}", "--out", "{out}"),
        ("unsupported architecture", "GPT2LMHeadModel"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-config-not-json",
        CONV,
        ("--src", "{bad_json}", "--out", "{out}"),
        ("config.json", "not valid JSON"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-without-weights",
        CONV,
        ("--src", "{no_weights}", "--out", "{out}"),
        ("{no_weights}", "no weights", "safetensors"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "src-safetensors-truncated",
        CONV,
        ("--src", "{trunc_st}", "--out", "{out}"),
        ("model.safetensors", "truncated"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "gguf-unsupported-quantization",
        CONV,
        ("--src", "{q8_1}", "--out", "{out}"),
        ("{q8_1}", "unsupported quantization", "Q8_1", "Q8_0"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "gguf-unsupported-architecture",
        CONV,
        ("--src", "{gguf_gpt2}", "--out", "{out}"),
        ("unsupported architecture", "'gpt2'", "'llama'", "qwen3"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "gguf-qwen2-sliding-window",
        CONV,
        ("--src", "{gguf_qwen2_window}", "--out", "{out}"),
        ("{gguf_qwen2_window}", "sliding window in a qwen2 GGUF", "Hugging Face checkpoint"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "gguf-truncated",
        CONV,
        ("--src", "{gguf_truncated}", "--out", "{out}"),
        ("{gguf_truncated}", "not a readable GGUF"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "gguf-missing-tensors",
        CONV,
        ("--src", "{gguf_incomplete}", "--out", "{out}"),
        ("missing 9 tensor(s)", "model.layers.0"),
        lambda p, a: api_convert(a),
    ),
    # ---------------- convert: --out, --dtype
    Case(
        "out-exists",
        CONV,
        ("--src", "{hf}", "--out", "{existing}"),
        ("{existing}", "already exists", "--force"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "out-is-a-file",
        CONV,
        ("--src", "{hf}", "--out", "{outfile}", "--force"),
        ("{outfile}", "is a file", "directory"),
        lambda p, a: api_convert(a),
    ),
    Case(
        "out-parent-missing",
        CONV,
        ("--src", "{hf}", "--out", "{missing}/ckpt"),
        ("{missing}", "does not exist"),
        lambda p, a: api_convert(a),
        FileNotFoundError,
    ),
    Case(
        "convert-dtype-unknown",
        CONV,
        ("--src", "{hf}", "--out", "{out}", "--dtype", "float8"),
        ("--dtype", "'float8'", "float32"),
        lambda p, a: api_convert(a),
        same=False,  # argparse's choices vs convert()'s own check
    ),
    Case(
        "convert-out-flag-missing",
        CONV,
        ("--src", "{hf}"),
        ("required", "--out"),
    ),
]


def leftovers(directory: Path) -> list[str]:
    """Staging or backup directories (".NAME.partial-*", ".NAME.old-*") in `directory`."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(directory)): f.read_bytes()
        for f in sorted(directory.rglob("*"))
        if f.is_file()
    }


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=list(c.marks)) for c in CASES])
def test_bad_input(case: Case, paths, tmp_path):
    # per-test output targets: a fresh path, an existing directory, an existing file
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "keep.txt").write_text("keep me")
    (tmp_path / "outfile").write_text("a file")
    names = {
        **{k: str(v) for k, v in paths.items()},
        "out": str(tmp_path / "out"),
        "existing": str(tmp_path / "existing"),
        "outfile": str(tmp_path / "outfile"),
    }
    before = {
        "existing": snapshot(tmp_path / "existing"),
        "root": sorted(p.name for p in paths["root"].iterdir()),
    }
    args = [a.format(**names) for a in case.args]

    r = run_module(case.module, args, env=dict(case.env))

    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for needle in case.needles:
        assert needle.format(**names) in line, (needle, line)
    assert r.stdout == "", r.stdout
    if os.environ.get("LOOKAHEAD_JAX_BAD_INPUT_LOG"):  # for the docs: what each row prints
        with open(os.environ["LOOKAHEAD_JAX_BAD_INPUT_LOG"], "a") as f:
            f.write(json.dumps({"id": case.id, "line": line.replace(str(tmp_path), "TMP")}) + "\n")

    def nothing_left_behind():
        assert not (tmp_path / "out").exists()
        assert leftovers(tmp_path) == [], leftovers(tmp_path)
        assert snapshot(tmp_path / "existing") == before["existing"]
        assert (tmp_path / "outfile").read_text() == "a file"
        assert sorted(p.name for p in paths["root"].iterdir()) == before["root"]

    nothing_left_behind()

    if case.api is None:
        return
    with pytest.raises(case.raises) as info:
        case.api(paths, args)
    assert isinstance(info.value, lj.UserInputError), repr(info.value)
    message = str(info.value)
    if case.same:
        assert line == f"error: {message}", (line, message)
    else:
        assert any(n.format(**names) in message for n in case.needles), (case.needles, message)
    nothing_left_behind()


def test_debug_shows_the_traceback_and_still_exits_2(paths):
    r = run_module(GEN, ["--ckpt", str(paths["corrupt"]), *G, "--lookahead", "1,5,3", "--debug"])
    assert r.returncode == 2
    assert "Traceback" in r.stderr and "lookahead N must be an integer >= 2" in r.stderr


def test_every_issue_input_has_a_row():
    """The inputs the issue lists, by row id (a guard against dropping one)."""
    ids = {c.id for c in CASES}
    required = {
        "ckpt-missing",
        "ckpt-unreadable",
        "ckpt-is-a-file",
        "ckpt-truncated",
        "ckpt-corrupted",
        "lookahead-not-numeric",
        "lookahead-n-below-2",
        "lookahead-w-negative",
        "lookahead-tokens-below-2",
        "lookahead-tokens-not-an-integer",
        "lookahead-unknown-key",
        "lookahead-g-negative",
        "lookahead-too-big-for-context",
        "max-new-tokens-zero",
        "max-new-tokens-beyond-context",
        "prompt-plus-max-new-tokens-beyond-context",
        "temperature-negative",
        "top-p-zero",
        "top-p-above-one",
        "top-k-negative",
        "prompt-file-missing",
        "prompt-empty",
        "dtype-unknown",
        "mesh-more-devices-than-available",
        "mesh-data-does-not-divide-batch",
        "src-missing",
        "src-text-file",
        "src-directory-not-a-model",
        "src-gemma",
        "src-qwen2-chunked-attention-layers",
        "gguf-qwen2-sliding-window",
        "src-gpt2-architectures",
        "out-exists",
        "out-is-a-file",
        "gguf-unsupported-quantization",
    }
    assert required <= ids, required - ids


# ------------------------------------------------------------------ signals and pipes


@pytest.fixture
def ctrl_c_reaches_children():
    """SIGINT at its default in the children started here. A suite started in the
    background by a non-interactive shell (`cmd &`) has SIGINT ignored; children inherit
    that, and Python then keeps ignoring Ctrl-C, as Unix programs should: the tests below
    would see a CLI that never stops. (A handler set here is reset to the default on exec.)"""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.mark.smollm
@pytest.mark.usefixtures("ctrl_c_reaches_children")
def test_ctrl_c_during_stream_prints_the_text_so_far_and_the_stats(smollm2_ckpt):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            GEN,
            "--ckpt",
            str(smollm2_ckpt),
            # the command of test_stream_into_head_exits_quietly below, so that the two
            # share their compiled programs (through the run's compilation cache)
            "--prompt",
            "Monday\nTuesday\nWednesday\n",
            # no chat template: the week's days go on for 400 tokens (several seconds), where
            # the chat answer ends after 13 and a Ctrl-C 0.5 s in came after the end
            "--no-chat",
            "--max-new-tokens",
            "400",
            "--stream",
            # fixed, not auto: auto may pick plain decoding on a busy machine
            "--lookahead",
            "4,1,2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        first = os.read(proc.stdout.fileno(), 1)  # blocks until generation has begun
        assert first, proc.stderr.read().decode()
        time.sleep(0.5)
        assert proc.poll() is None, "generation of 400 tokens ended before Ctrl-C"
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = (first + rest).decode(), err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len(out.strip()) > 0 and out.endswith("\n")
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("[lookahead 4,1,2]"), err
    assert "(interrupted)" in lines[0], err
    # the stats count what was printed, far less than the budget
    new_tokens = int(lines[0].split("] ")[1].split(" tokens in")[0])
    assert 1 <= new_tokens < 400


@pytest.mark.smollm
def test_stream_into_head_exits_quietly(smollm2_ckpt, tmp_path):
    rc_file = tmp_path / "rc"
    q = shlex.quote
    cmd = (
        f"{q(sys.executable)} -m {GEN} --ckpt {q(str(smollm2_ckpt))} "
        "--prompt $'Monday\\nTuesday\\nWednesday\\n' --no-chat --max-new-tokens 400 --stream "
        # a fixed layout: auto would first measure this machine's cost curve
        "--lookahead 4,1,2 | head -1; "
        f'echo "${{PIPESTATUS[0]}}" > {q(str(rc_file))}'
    )
    r = subprocess.run(
        ["bash", "-c", f"set +o pipefail; {cmd}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert len(r.stdout.splitlines()) == 1 and r.stdout.strip(), r.stdout
    assert rc_file.read_text().strip() == "0", r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    # quiet: not even the stats line, as the write that failed came long before the end
    assert r.stderr.strip() == "", r.stderr


@pytest.mark.smollm
@pytest.mark.usefixtures("ctrl_c_reaches_children")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_conversion_leaves_no_output(sig, tmp_path):
    """Ctrl-C (or SIGTERM) while converting the SmolLM2 GGUF: exit 130, no --out, no
    staging directory."""
    from lookahead_jax.checkpoints import default_model

    try:
        src = default_model.gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", CONV, "--src", str(src), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    try:
        deadline = time.time() + 120
        while not leftovers(tmp_path) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert leftovers(tmp_path), "the staging directory never appeared"
        time.sleep(0.5)  # well inside the conversion (it takes several seconds)
        assert proc.poll() is None, "the conversion ended before the signal"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "interrupted", err
    assert not out.exists() and leftovers(tmp_path) == []
