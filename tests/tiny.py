"""Random tiny Hugging Face Llama models, saved with save_pretrained and converted.

Weights are drawn with a larger std than HF's init so the next-token
distributions are peaked: greedy decoding then has clear winners and a
divergence means a bug, not a coin flip between near-equal logits.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 128


def llama_config():
    """A LlamaConfig small enough to trace and compile in a blink (no checkpoint, no HF):
    for tests of the forward's and the step's own properties."""
    from lookahead_jax.models.config import LlamaConfig

    return LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        max_position_embeddings=256,
    )


VARIANTS = {
    # name: LlamaConfig overrides
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "mqa": dict(num_attention_heads=4, num_key_value_heads=1),
    "tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "llama3": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "linear": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
    "eight_heads": dict(num_attention_heads=8, num_key_value_heads=8, hidden_size=64),
    # the rest of the family (config.ARCHITECTURES); windows of 6 positions, shorter than
    # the tests' prompt + output, so the sliding window really cuts
    "llama_bias": dict(
        num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True
    ),
    "mistral": dict(arch="mistral", num_attention_heads=4, num_key_value_heads=2, sliding_window=6),
    "mistral_mqa": dict(
        arch="mistral",
        num_attention_heads=4,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        sliding_window=None,
    ),
    "qwen2": dict(  # q/k/v biases; the second of two layers slides
        arch="qwen2",
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=1,
    ),
    "qwen2_mqa": dict(
        arch="qwen2", num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True
    ),
    "qwen3": dict(  # q/k norms; head_dim 24, not hidden / heads = 16
        arch="qwen3", num_attention_heads=4, num_key_value_heads=1, head_dim=24
    ),
    "qwen3_bias": dict(
        arch="qwen3",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        attention_bias=True,
        tie_word_embeddings=True,
    ),
}
# Hugging Face config and model classes per architecture
CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def hf_config(name: str, **extra):
    import transformers

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    kw.update(VARIANTS[name])
    kw.update(extra)
    config_class = getattr(transformers, CLASSES[kw.pop("arch", "llama")][0])
    return config_class(**kw)


def hf_model(name: str, seed: int = 0, std: float = 0.15, **extra):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = hf_config(name, **extra)
    model_class = getattr(transformers, CLASSES[config.model_type][1])
    model = model_class(config).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    return model


def save_bin(model, directory: Path, shards: int = 1) -> None:
    """Write PyTorch .bin weights (transformers 5 only writes safetensors)."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return
    names = list(state)
    weight_map = {}
    for i in range(shards):
        part = {k: state[k] for k in names[i::shards]}
        fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save(part, directory / fname)
        weight_map.update({k: fname for k in part})
    (directory / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def build(root: Path, name: str) -> tuple[Path, Path]:
    """Save variant `name` as safetensors and convert it; return (hf_dir, ckpt_dir)."""
    from lookahead_jax.checkpoints.convert.convert import convert

    hf_dir, ckpt = root / f"{name}-hf", root / f"{name}-ckpt"
    hf_model(name).save_pretrained(hf_dir)
    convert(hf_dir, ckpt, progress=False)
    return hf_dir, ckpt


def load_hf(hf_dir: Path, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype or torch.float32).eval()


CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def add_tokenizer(directory: Path) -> None:
    """A character-level tokenizer that fits VOCAB (printable ASCII and newline; ids 0, 1,
    2 are <pad>, <s>, </s>) with a chat template, written into `directory`: text prompts,
    chat messages and stop strings for a tiny model."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for c in [*string.printable[:95], "\n"]:
        vocab.setdefault(c, len(vocab))
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
