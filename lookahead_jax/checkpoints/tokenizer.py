"""Tokenizers from a checkpoint directory, without importing transformers at run time.

Two backends:
* `tokenizer.json` (Hugging Face fast tokenizers) through the `tokenizers` library;
* `tokenizer.model` alone (Llama-2 style sentencepiece) through `sentencepiece`
  directly — transformers could not build a working tokenizer from such a
  directory here (it encoded everything to []).

Special tokens, BOS handling and the chat template come from
`tokenizer_config.json` and `chat_template.jinja` as Hugging Face writes them;
the template is rendered with jinja2 the way transformers does.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from lookahead_jax.errors import CheckpointError, UserInputError


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older configs
        return value.get("content")
    return value


class Tokenizer:
    """encode / decode / chat template for one checkpoint."""

    def __init__(self, directory: Path):
        directory = Path(directory)
        config_file = directory / "tokenizer_config.json"
        self.config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        template_file = directory / "chat_template.jinja"
        template = self.config.get("chat_template")
        if template_file.is_file():
            template = template_file.read_text()
        self.chat_template: str | None = template if isinstance(template, str) else None
        self.bos_token = _token_str(self.config.get("bos_token"))
        self.eos_token = _token_str(self.config.get("eos_token"))

        if (directory / "tokenizer.json").is_file():
            from tokenizers import Tokenizer as FastTokenizer

            self._fast = FastTokenizer.from_file(str(directory / "tokenizer.json"))
            self._sp = None
            self.vocab_size = self._fast.get_vocab_size(with_added_tokens=True)
            self._special_ids = {
                i for i, t in self._fast.get_added_tokens_decoder().items() if t.special
            }
        elif (directory / "tokenizer.model").is_file():
            import sentencepiece

            self._fast = None
            self._sp = sentencepiece.SentencePieceProcessor(
                model_file=str(directory / "tokenizer.model")
            )
            self.vocab_size = self._sp.get_piece_size()
            self._special_ids = {
                i
                for i in range(self.vocab_size)
                if self._sp.is_control(i) or self._sp.is_unknown(i)
            }
            self.bos_token = self.bos_token or self._piece(self._sp.bos_id())
            self.eos_token = self.eos_token or self._piece(self._sp.eos_id())
        else:
            raise CheckpointError(
                f"no tokenizer in {directory} (need tokenizer.json or tokenizer.model)"
            )
        self.bos_id = self.token_to_id(self.bos_token)
        self.eos_id = self.token_to_id(self.eos_token)

    def _piece(self, i: int) -> str | None:
        return self._sp.id_to_piece(i) if i >= 0 else None

    def token_to_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        if self._fast is not None:
            return self._fast.token_to_id(token)
        i = self._sp.piece_to_id(token)
        return None if i == self._sp.unk_id() and token != self._piece(i) else i

    # ------------------------------------------------------------ encode/decode

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; with add_special_tokens, BOS etc. as the tokenizer defines them."""
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=add_special_tokens).ids
        ids: list[int] = []
        # sentencepiece does not know special-token strings such as "<s>" inside text
        # (chat templates write them): split them out and map them to their ids.
        specials = {self._piece(i): i for i in self._special_ids if self._piece(i)}
        pattern = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
        parts = re.split(f"({pattern})", text) if pattern else [text]
        for part in parts:
            if part in specials:
                ids.append(specials[part])
            elif part:
                ids.extend(self._sp.encode(part))
        if add_special_tokens:
            if self.config.get("add_bos_token", True) and self.bos_id is not None:
                ids = [self.bos_id, *ids]
            if self.config.get("add_eos_token", False) and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def decode(self, ids) -> str:
        """Text of `ids`, special tokens skipped."""
        ids = [int(i) for i in ids if int(i) not in self._special_ids]
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=True)
        return self._sp.decode(ids)

    def token_bytes(self) -> list[bytes | None]:
        """Each token id's bytes as decoding adds them to the text (None: a special token,
        which a grammar never allows; grammar/ builds its automata over these). Byte-level
        BPE (a tokenizer.json whose decoder is ByteLevel): GPT-2's byte alphabet mapped
        back; otherwise sentencepiece pieces: "<0xNN>" one byte, "▁" a space. Kept once
        made."""
        if getattr(self, "_token_bytes", None) is None:
            if self._fast is not None:
                pieces = [self._fast.id_to_token(i) for i in range(self.vocab_size)]
                byte_level = type(self._fast.decoder).__name__ == "ByteLevel"
            else:
                pieces = [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
                byte_level = False
            to_bytes = _byte_level_bytes if byte_level else _piece_bytes
            self._token_bytes = [
                None if p is None or i in self._special_ids else to_bytes(p)
                for i, p in enumerate(pieces)
            ]
        return self._token_bytes

    # ---------------------------------------------------------------- chat

    def apply_chat_template(self, messages: list[dict] | str) -> str:
        """The prompt text for a conversation (a str is one user message), ready to encode
        with add_special_tokens=False."""
        if self.chat_template is None:
            raise UserInputError("this checkpoint's tokenizer has no chat template; drop --chat")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        special = {k: _token_str(v) for k, v in self.config.items() if k.endswith("_token")}
        special.update(bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, **special
            )
        except jinja2.exceptions.TemplateError as e:
            raise UserInputError(f"chat template failed: {e}") from e

    def wants_chat(self, flag: bool | None) -> bool:
        """Whether text prompts go through the chat template: `flag` (--chat / --no-chat),
        else (None) where this tokenizer has one — an instruct model given a bare prompt
        often answers nothing (its first token is its end of turn), and llama-cli and
        vLLM's LLM.chat apply the template too."""
        return self.chat_template is not None if flag is None else flag

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        if chat:
            return self.encode(self.apply_chat_template(text), add_special_tokens=False)
        return self.encode(text)


def _gpt2_byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (byte-level BPE), inverted: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1)]
    printable += range(ord("\u00ae"), ord("\u00ff") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _gpt2_byte_alphabet()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_bytes(piece: str) -> bytes | None:
    try:
        return bytes(_BYTE_OF[c] for c in piece)
    except KeyError:  # an added token that is not in the byte alphabet
        return piece.encode()


def _piece_bytes(piece: str) -> bytes:
    byte = _BYTE_PIECE.fullmatch(piece)
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    return piece.replace("\u2581", " ").encode()
