"""Conversion round trips (safetensors, sharded, .bin, bf16, GGUF) and atomic, checked output."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import lookahead_jax as lj
from lookahead_jax.checkpoints.convert.convert import convert
from lookahead_jax.models.llama_params import flat_names as flatten
from tests import tiny
from tests.test_model_parity import full_forward


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.as_tensor(ids)).logits.numpy()


IDS = np.random.default_rng(0).integers(0, tiny.VOCAB, (1, 40))


def test_safetensors_params_are_exact(tiny_ckpts):
    hf_dir, ckpt = tiny_ckpts["gqa"]
    hf = tiny.load_hf(hf_dir)
    params = flatten(lj.load(ckpt, cpu_kernel=False).params)  # unpacked: checkpoint names
    sd = hf.state_dict()
    cfg = hf.config
    wq = sd["model.layers.1.self_attn.q_proj.weight"].numpy()
    np.testing.assert_array_equal(
        np.asarray(params["layers/wq"][1]), wq.T.reshape(cfg.hidden_size, 4, -1)
    )
    np.testing.assert_array_equal(np.asarray(params["embed"]), sd["model.embed_tokens.weight"])
    np.testing.assert_array_equal(np.asarray(params["lm_head"]), sd["lm_head.weight"].numpy().T)


def test_split_layers_cuts_cpu_arrays_without_a_program(caplog):
    """lj.load cuts the stacked weights into layers as host views: indexing the jax arrays
    ran a program per weight shape (0.70 s of SmolLM2-135M's load in a fresh process)."""
    import dataclasses
    import logging

    import jax

    from lookahead_jax.models.llama_params import LayerParams, LlamaParams, split_layers

    rng = np.random.default_rng(0)
    array = lambda *shape: jax.numpy.asarray(rng.normal(size=shape), jax.numpy.float32)  # noqa: E731
    required = [f.name for f in dataclasses.fields(LayerParams) if f.default is not None]
    # (shapes no other test indexes: a program run for them would compile here)
    layers = LayerParams(**{name: array(3, 7, 13) for name in required})
    stacked = LlamaParams(embed=array(13, 7), layers=layers, final_norm=array(7))
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        per_layer = split_layers(stacked).layers
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
    assert len(per_layer) == 3
    for i, layer in enumerate(per_layer):
        for name in required:
            np.testing.assert_array_equal(
                getattr(layer, name), np.asarray(getattr(layers, name))[i]
            )
    # on a mesh (one device here) the layers keep their mesh's sharding, cut by indexing
    mesh = lj.make_mesh(data=1, model=1)
    on_mesh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, None, "model"))
    cut = split_layers(dataclasses.replace(stacked, layers=jax.device_put(layers, on_mesh))).layers
    np.testing.assert_array_equal(cut[2].wq, np.asarray(layers.wq)[2])
    assert isinstance(cut[2].wq.sharding, jax.sharding.NamedSharding)


@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin", "sharded_bin", "bf16"])
def test_round_trip(tmp_path, layout):
    hf = tiny.hf_model("gqa", seed=3)
    src = tmp_path / "hf"
    if layout == "sharded_safetensors":
        hf.save_pretrained(src, max_shard_size="20KB")
        assert (src / "model.safetensors.index.json").is_file()
    elif layout == "bin":
        tiny.save_bin(hf, src)
    elif layout == "sharded_bin":
        tiny.save_bin(hf, src, shards=3)
    else:
        hf.to(torch.bfloat16).save_pretrained(src)
        hf = tiny.load_hf(src)  # bf16-valued weights, computed in float32
    convert(src, tmp_path / "ckpt", progress=False)
    model = lj.load(tmp_path / "ckpt")
    np.testing.assert_allclose(full_forward(model, IDS), hf_logits(hf, IDS), atol=1e-4)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.bias": "ffn_down.bias",
}


def write_tiny_gguf(hf, path: Path, quant: str = "F32", metadata=None) -> None:
    """What llama.cpp's convert_hf_to_gguf.py writes for a Llama, Mistral (as llama),
    Qwen2 or Qwen3 model: names, metadata, and for llama the permuted q/k rows.
    `metadata(writer)` may add more (a tokenizer)."""
    import gguf

    cfg = hf.config
    arch = {"mistral": "llama"}.get(cfg.model_type, cfg.model_type)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_eos_token_id(2)
    if cfg.model_type == "mistral" and cfg.sliding_window:
        writer.add_sliding_window(cfg.sliding_window)
    if metadata is not None:
        metadata(writer)
    names = {"embed_tokens": "token_embd", "norm": "output_norm"}
    qtype = getattr(gguf.GGMLQuantizationType, quant)
    for name, t in hf.state_dict().items():
        w = t.numpy().astype(np.float32)
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # the state dict holds the tied head; llama.cpp writes none
        if name == "lm_head.weight":
            gname = "output.weight"
        elif name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            rest = GGUF_LAYER_NAMES[rest]
            gname = f"blk.{i}.{rest}"
            if arch == "llama" and rest.startswith("attn_q."):
                w = llama_cpp_permute(w, cfg.num_attention_heads)
            if arch == "llama" and rest.startswith("attn_k."):
                w = llama_cpp_permute(w, cfg.num_key_value_heads)
        else:
            gname = names[name.split(".")[1]] + ".weight"
        if w.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gname, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gname, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_round_trip_undoes_the_qk_permutation(tmp_path):
    hf = tiny.hf_model("gqa", seed=4)
    write_tiny_gguf(hf, tmp_path / "tiny.gguf")
    convert(tmp_path / "tiny.gguf", tmp_path / "ckpt", progress=False)
    model = lj.load(tmp_path / "ckpt")
    np.testing.assert_allclose(full_forward(model, IDS), hf_logits(hf, IDS), atol=1e-4)
    assert model.cfg.eos_token_ids == (2,) and not model.cfg.tie_word_embeddings


@pytest.mark.parametrize("variant", ["llama_bias", "mistral", "qwen2_mqa", "qwen3_bias"])
def test_gguf_round_trip_per_architecture(tmp_path, variant):
    """Biases (permuted like their rows for llama), q/k norms, Qwen3's head_dim, Mistral's
    sliding window, tied embeddings: the GGUF model equals the Hugging Face one."""
    hf = tiny.hf_model(variant, seed=5)
    write_tiny_gguf(hf, tmp_path / "tiny.gguf")
    convert(tmp_path / "tiny.gguf", tmp_path / "ckpt", progress=False)
    model = lj.load(tmp_path / "ckpt")
    np.testing.assert_allclose(full_forward(model, IDS), hf_logits(hf, IDS), atol=1e-4)
    want = lj.LlamaConfig.from_hf_dict(hf.config.to_dict())
    fields = ("architecture", "qkv_bias", "o_bias", "mlp_bias", "qk_norm", "attention_windows")
    fields += ("head_dim", "num_kv_heads", "tie_word_embeddings")
    assert [getattr(model.cfg, f) for f in fields] == [getattr(want, f) for f in fields]


def test_qwen2_gguf_tokenizer_splits_as_qwen_and_keeps_the_chat_template(tmp_path):
    """A byte-level BPE GGUF with `tokenizer.ggml.pre = qwen2`: the converted tokenizer
    pre-tokenizes with Qwen2's split (single digits), as a tokenizer built directly with
    Qwen2's pattern does, not GPT-2's default (which would merge "12")."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokens = [*bytes_to_unicode().values(), "12", "ab", "Ġab", "<|im_end|>"]
    merges = ["1 2", "a b", "Ġ ab"]
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"

    def tokenizer_metadata(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types([1] * (len(tokens) - 1) + [3])
        writer.add_token_merges(merges)
        writer.add_chat_template(template)

    hf = tiny.hf_model("qwen2_mqa", seed=6, vocab_size=len(tokens))
    write_tiny_gguf(hf, tmp_path / "qwen.gguf", metadata=tokenizer_metadata)
    convert(tmp_path / "qwen.gguf", tmp_path / "ckpt", progress=False)
    tok = lj.load(tmp_path / "ckpt").tokenizer

    def reference(split: bool) -> list[int]:
        vocab = {t: i for i, t in enumerate(tokens)}
        ref = Tokenizer(models.BPE(vocab, [tuple(m.split()) for m in merges]))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not split)
        qwen_split = pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated")
        ref.pre_tokenizer = (
            pre_tokenizers.Sequence([qwen_split, byte_level]) if split else byte_level
        )
        return ref.encode(text).ids

    text = "12 ab 345 ab"
    got = tok.encode(text, add_special_tokens=False)
    assert got == reference(split=True) and got != reference(split=False)
    assert tok.decode(got) == text
    assert (tmp_path / "ckpt" / "chat_template.jinja").read_text() == template


def test_gguf_quantized_round_trip(tmp_path):
    import gguf

    hf = tiny.hf_model("gqa", seed=5, hidden_size=64, intermediate_size=128)
    write_tiny_gguf(hf, tmp_path / "q8.gguf", quant="Q8_0")
    convert(tmp_path / "q8.gguf", tmp_path / "ckpt", progress=False)
    params = flatten(lj.load(tmp_path / "ckpt", cpu_kernel=False).params)
    w = hf.state_dict()["model.layers.0.mlp.up_proj.weight"].numpy()
    q = gguf.quants.dequantize(
        gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    )
    np.testing.assert_array_equal(np.asarray(params["layers/w_up"][0]), q.T)
    assert np.abs(q - w).max() > 0  # really quantized


@pytest.mark.smollm
def test_smollm2_gguf_checkpoint(smollm2_ckpt):
    manifest = json.loads((smollm2_ckpt / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "gguf"
    assert len(manifest["tensors"]) == 11  # tied embeddings: no lm_head
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (smollm2_ckpt / name).is_file()


# ---------------------------------------------------------------- atomic, checked output


def leftovers(parent: Path, name: str) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]


def test_failed_conversion_leaves_nothing(tmp_path, tiny_ckpts):
    hf_dir, _ = tiny_ckpts["gqa"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((hf_dir / "config.json").read_text())
    # a config that asks for more layers than the weights have
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (broken / "config.json").write_text(json.dumps(cfg))
    os.symlink(hf_dir / "model.safetensors", broken / "model.safetensors")
    with pytest.raises(ValueError, match="missing"):
        convert(broken, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


def test_interrupted_conversion_leaves_nothing(tmp_path, tiny_ckpts, monkeypatch):
    from lookahead_jax.checkpoints import checkpoint

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "write_params", interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_ckpts["gqa"][0], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


def test_existing_out_needs_force(tmp_path, tiny_ckpts):
    hf_dir, _ = tiny_ckpts["mha"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="already exists"):
        convert(hf_dir, out, progress=False)
    assert (out / "keep.txt").is_file()
    convert(hf_dir, out, force=True, progress=False)
    assert not (out / "keep.txt").exists() and (out / "manifest.json").is_file()
    assert leftovers(tmp_path, "out") == []


def test_damaged_checkpoints_are_detected(tmp_path, tiny_ckpts):
    import shutil

    src = tiny_ckpts["gqa"][1]

    def copy(name):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst

    biggest = max(
        (p for p in (src / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    ).relative_to(src)
    truncated = copy("truncated")
    f = truncated / biggest
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    corrupted = copy("corrupted")
    f = corrupted / biggest
    data = bytearray(f.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = os.urandom(64)
    f.write_bytes(bytes(data))
    missing = copy("missing")
    (missing / biggest).unlink()
    no_manifest = copy("no_manifest")
    (no_manifest / "manifest.json").unlink()
    bad_config = copy("bad_config")
    cfg = json.loads((bad_config / "config.json").read_text())
    cfg["hidden_size"] = 96
    (bad_config / "config.json").write_text(json.dumps(cfg))
    for d, match in [
        (truncated, "damaged"),
        (corrupted, "damaged"),
        (missing, "damaged"),
        (no_manifest, "not a lookahead_jax checkpoint"),
        (bad_config, "damaged"),
    ]:
        with pytest.raises(lj.CheckpointError, match=match):
            model = lj.load(d)
            # data corrupted without changing sizes may only show when read
            full_forward(model, IDS)
