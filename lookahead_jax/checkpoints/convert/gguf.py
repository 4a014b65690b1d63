"""Read a llama.cpp GGUF file: config from its metadata, dequantized tensors under their
Hugging Face names, and the tokenizer (built by transformers' GGUF tokenizer converter).

Architectures (`general.architecture`): `llama` (Llama, and Mistral: llama.cpp writes
Mistral as llama; a `llama.attention.sliding_window` makes it Mistral's sliding window),
`qwen2` and `qwen3`. For `llama` only, llama.cpp's converter stores the q/k projection
rows (weights and biases) permuted for its RoPE layout (pairs interleaved per head);
`unpermute` undoes that so that the weights match Hugging Face's "rotate half" RoPE, as
transformers' own GGUF loader does. Qwen's GGUFs keep Hugging Face's order (llama.cpp
runs them with NEOX-style RoPE).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lookahead_jax.errors import CheckpointError, UserInputError
from lookahead_jax.models.config import LlamaConfig

_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def open_reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError/struct.error/... on bad files
        raise UserInputError(f"{path} is not a readable GGUF file: {e}") from e


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _required(reader, key: str, path: Path, kind=int):
    value = _field(reader, key)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise CheckpointError(
            f"{path}: GGUF metadata {key} is {'missing' if value is None else repr(value)}; "
            f"this GGUF needs it as {kind.__name__}"
        ) from None


def read_config(reader, path: Path) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UserInputError(
            f"{path}: unsupported architecture {arch!r}; supported GGUF architectures: "
            f"{', '.join(GGUF_ARCHITECTURES)} (Mistral GGUFs are 'llama')"
        )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise UserInputError(
            f"{path}: per-dimension RoPE factors (rope_freqs, Llama 3.1 style) are not "
            "supported from GGUF; convert the Hugging Face checkpoint instead"
        )
    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise UserInputError(f"{path}: unsupported rope scaling type {scaling_type!r}")
    heads = _required(reader, f"{arch}.attention.head_count", path)
    hidden = _required(reader, f"{arch}.embedding_length", path)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens else 0))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = tuple(sorted({int(x) for x in (eos, eot) if x is not None}))
    window = _field(reader, f"{arch}.attention.sliding_window")
    if window is not None and arch != "llama":
        raise UserInputError(
            f"{path}: a sliding window in a {arch} GGUF is not supported (which layers slide "
            "is not recorded); convert the Hugging Face checkpoint instead"
        )
    model_type = "mistral" if window is not None else arch
    d = {
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": _required(reader, f"{arch}.feed_forward_length", path),
        "num_hidden_layers": _required(reader, f"{arch}.block_count", path),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": (
            {"rope_type": "linear", "factor": float(_field(reader, f"{arch}.rope.scaling.factor"))}
            if scaling_type == "linear"
            else None
        ),
        "tie_word_embeddings": "output.weight" not in names,
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 4096)),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(eos_ids),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        # Llama/Qwen3 biases, as the tensors say (Qwen2's q/k/v biases are implied)
        "attention_bias": "blk.0.attn_output.bias" in names
        or (arch == "qwen3" and "blk.0.attn_q.bias" in names),
        "mlp_bias": "blk.0.ffn_up.bias" in names,
        "sliding_window": None if window is None else int(window),
    }
    return LlamaConfig.from_hf_dict(d)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: per head, rows (2, Dh/2) -> (Dh/2, 2)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def check_quant_types(reader, path: Path) -> None:
    """Fail before any work if a tensor uses a type the gguf package cannot dequantize."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits

    supported = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    bad = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in supported})
    if bad:
        ok = ", ".join(sorted(q.name for q in supported))
        raise UserInputError(
            f"{path}: unsupported quantization type(s) {', '.join(bad)}; "
            f"the gguf package can dequantize {ok}"
        )


def read_tensors(reader, cfg: LlamaConfig) -> tuple[int, Iterator[tuple[str, np.ndarray]]]:
    """(count, iterator of (HF name, float32 array in HF [out, in] layout))."""
    permuted = cfg.architecture in ("llama", "mistral")  # llama.cpp's llama layout
    from gguf.quants import dequantize

    def hf_name(name: str) -> str:
        if name in _NAMES:
            return _NAMES[name]
        m = _BLOCK.match(name)
        if m and m.group(2) in _LAYER_NAMES:
            return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
        raise UserInputError(f"unexpected tensor {name!r} in a {cfg.architecture} GGUF")

    def gen():
        for t in reader.tensors:
            name = hf_name(t.name)
            try:
                w = dequantize(t.data, t.tensor_type).astype(np.float32)
            except (ValueError, IndexError) as e:
                raise CheckpointError(f"tensor {t.name} is damaged: {e}") from e
            # GGUF lists dims fastest-first; the data is already row-major [out, in].
            w = w.reshape([int(x) for x in reversed(t.shape)])
            if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
                w = unpermute(w, cfg.num_heads)
            elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
                w = unpermute(w, cfg.num_kv_heads)
            yield name, w

    return len(reader.tensors), gen()


def _quiet_transformers() -> None:
    """Before transformers is first imported: no advice about PyTorch (which only its
    tokenizer builders are used for here, and they need none) on the user's screen."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found"


def tokenizer_metadata(reader) -> tuple[str, dict, dict]:
    """(architecture, tokenizer fields, tokenizer_config) from GGUF metadata, named as
    transformers' GGUF tokenizer builder expects them."""
    _quiet_transformers()
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    def get(key):
        return _field(reader, f"tokenizer.{key}")

    groups = {
        group: {name: get(key) for key, name in renames.items() if get(key) is not None}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer, config = groups["tokenizer"], groups["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = get(f"ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return _field(reader, "general.architecture"), tokenizer, config


def save_tokenizer(reader, path: Path, out: Path) -> None:
    """Build the tokenizer described by the GGUF metadata (transformers' builders, which
    need no torch) and save it as tokenizer.json, tokenizer_config.json and
    chat_template.jinja."""
    import json

    _quiet_transformers()
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    try:
        arch, fields, config = tokenizer_metadata(reader)
        backend, _ = convert_gguf_tokenizer(arch, fields)
    except Exception as e:  # transformers raises many types for unknown tokenizer kinds
        raise UserInputError(f"{path}: cannot build its tokenizer: {e}") from e
    backend.save(str(out / "tokenizer.json"))
    template = config.pop("chat_template", None)
    if template:
        (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
