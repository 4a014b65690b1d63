"""Tokenizers: sentencepiece-only checkpoints (Llama-2 style) and chat templates."""

import json

import pytest
import sentencepiece as spm

import lookahead_jax as lj
from lookahead_jax.checkpoints.convert.convert import convert
from lookahead_jax.checkpoints.tokenizer import Tokenizer
from tests import tiny

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "lookahead decoding guesses several tokens and verifies them in one pass",
    "jax compiles pure functions over fixed shapes for accelerators",
    "a sentencepiece model can be trained in a test in well under a second",
] * 20

LLAMA2_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    """A tiny HF Llama whose directory has only a sentencepiece tokenizer.model."""
    root = tmp_path_factory.mktemp("sp")
    (root / "corpus.txt").write_text("\n".join(CORPUS))
    spm.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"),
        model_prefix=str(root / "sp"),
        vocab_size=tiny.VOCAB,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    hf_dir = root / "hf"
    tiny.hf_model("gqa").save_pretrained(hf_dir)
    (root / "sp.model").rename(hf_dir / "tokenizer.model")
    (hf_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "add_bos_token": True,
                "chat_template": LLAMA2_TEMPLATE,
            }
        )
    )
    convert(hf_dir, root / "ckpt", progress=False)
    return hf_dir, root / "ckpt"


def test_sentencepiece_only_checkpoint(sp_dir):
    hf_dir, ckpt = sp_dir
    sp = spm.SentencePieceProcessor(model_file=str(hf_dir / "tokenizer.model"))
    tok = Tokenizer(ckpt)
    text = "the lazy fox verifies tokens"
    ids = tok.encode(text)
    assert ids == [1, *sp.encode(text)] and len(ids) > 3
    assert tok.decode(ids) == text
    assert tok.eos_id == 2 and tok.bos_id == 1


def test_sentencepiece_chat_template_maps_special_strings(sp_dir):
    tok = Tokenizer(sp_dir[1])
    text = tok.apply_chat_template("the quick fox")
    assert text == "<s>[INST] the quick fox [/INST]"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(1) == 1  # "<s>" became the BOS id, not text pieces


def test_generate_from_text_with_sentencepiece(sp_dir):
    model = lj.load(sp_dir[1])
    out = lj.generate(model, ["the quick brown fox"], max_new_tokens=8, chat=True, lookahead=None)
    assert len(out.token_ids[0]) <= 8 and isinstance(out.texts[0], str)


@pytest.mark.smollm
def test_smollm2_tokenizer_matches_transformers(smollm2, smollm2_hf_tokenizer):
    hf_tok = smollm2_hf_tokenizer
    tok = smollm2.tokenizer
    for text in ["Hello world", "def f(x):\n    return x ** 2  # é, ü, 漢字", "  spaces  "]:
        assert tok.encode(text) == hf_tok(text).input_ids
        assert tok.decode(tok.encode(text)) == hf_tok.decode(
            hf_tok(text).input_ids, skip_special_tokens=True
        )
    messages = [{"role": "user", "content": "What is 2+2?"}]
    want = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(messages) == want
    assert (
        tok.encode_prompt("What is 2+2?", chat=True)
        == hf_tok(want, add_special_tokens=False).input_ids
    )


def test_no_chat_template_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(tmp_path / "tokenizer"),
        vocab_size=60,
        model_type="bpe",
        minloglevel=2,
    )
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(tmp_path).apply_chat_template("hi")
