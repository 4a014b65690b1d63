"""Model configuration: a frozen, hashable description of a Llama-family decoder.

It is a static argument of every jitted function, so it must be hashable: all
fields are scalars or tuples. `from_hf_dict` reads a Hugging Face `config.json` of
one of ARCHITECTURES (both the transformers 4.x layout with `rope_theta`/`rope_scaling`
and the 5.x layout with `rope_parameters`) and rejects what this implementation does
not compute, naming the field. The families differ from Llama only in:

    llama    attention_bias (q/k/v/o biases), mlp_bias (gate/up/down biases)
    mistral  sliding_window: a token sees only the keys of the last `sliding_window`
             positions (its attention window)
    qwen2    q/k/v biases; sliding window on the layers from max_window_layers on,
             if use_sliding_window (or as `layer_types` says)
    qwen3    per-head RMSNorm of q and k before RoPE; attention_bias; head_dim free;
             sliding window as qwen2
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

import numpy as np

from lookahead_jax.errors import UserInputError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# model_type -> the Hugging Face class
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `rope_type` is one of SUPPORTED_ROPE_TYPES."""

    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    architecture: str = "llama"  # a key of ARCHITECTURES
    qkv_bias: bool = False  # biases on the q, k and v projections
    o_bias: bool = False  # a bias on the attention output projection
    mlp_bias: bool = False  # biases on gate, up and down
    qk_norm: bool = False  # RMSNorm of each head's q and k (over Dh) before RoPE
    # per layer: the sliding attention window, in positions (a token at p sees keys at
    # p - window < key <= p), 0 for full attention; () when no layer slides. Not the
    # Jacobi window of lookahead decoding, whose columns the shape legend calls W.
    attention_windows: tuple[int, ...] = ()

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise UserInputError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.rope_scaling.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UserInputError(
                f"unsupported rope_scaling type {self.rope_scaling.rope_type!r}; "
                f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if self.architecture not in ARCHITECTURES:
            raise UserInputError(_unsupported(self.architecture, []))
        if self.attention_windows and len(self.attention_windows) != self.num_layers:
            raise UserInputError(
                f"{len(self.attention_windows)} sliding windows for {self.num_layers} layers"
            )
        if any(w < 0 for w in self.attention_windows):
            raise UserInputError(f"sliding_window must be positive, got {self.attention_windows}")

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one K/V head (1 = MHA, num_heads = MQA)."""
        return self.num_heads // self.num_kv_heads

    # ---------------------------------------------------------------- RoPE

    def rope_inv_freq(self) -> np.ndarray:
        """Inverse frequencies [Dh/2], float32, exactly as transformers computes them."""
        dim = self.head_dim
        inv_freq = 1.0 / (
            self.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)
        )
        inv_freq = inv_freq.astype(np.float32)
        rs = self.rope_scaling
        if rs.rope_type == "linear":
            inv_freq = inv_freq / np.float32(rs.factor)
        elif rs.rope_type == "llama3":
            low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
            high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
            wavelen = 2 * math.pi / inv_freq
            scaled = np.where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq)
            smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
                rs.high_freq_factor - rs.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
            is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
            inv_freq = np.where(is_medium, smoothed, scaled).astype(np.float32)
        return inv_freq

    # ------------------------------------------------------- serialisation

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """Build from a Hugging Face `config.json` dict (one of ARCHITECTURES)."""
        arch = d.get("model_type") or "llama"
        archs = d.get("architectures") or []
        if arch not in ARCHITECTURES or any(a != ARCHITECTURES[arch] for a in archs):
            raise UserInputError(_unsupported(arch, archs))
        if d.get("hidden_act", "silu") != "silu":
            raise UserInputError(f"unsupported: hidden_act={d['hidden_act']!r} (need 'silu')")
        # as transformers reads them: mlp_bias is Llama's alone, attention_bias Llama's and
        # Qwen3's (Qwen2's q/k/v always have biases, its o_proj never)
        attention_bias = arch in ("llama", "qwen3") and bool(d.get("attention_bias", False))
        mlp_bias = arch == "llama" and bool(d.get("mlp_bias", False))
        num_heads = d["num_attention_heads"]
        hidden = d["hidden_size"]
        head_dim = d.get("head_dim") or hidden // num_heads
        rope_theta, scaling = _rope_from_hf(d)
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=d.get("pad_token_id"),
            architecture=arch,
            qkv_bias=arch == "qwen2" or attention_bias,
            o_bias=attention_bias,
            mlp_bias=mlp_bias,
            qk_norm=arch == "qwen3",
            attention_windows=_windows_from_hf(arch, d),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face style `config.json` (readable by transformers' config class of
        this architecture)."""
        rs = self.rope_scaling
        scaling = None
        if rs.rope_type == "linear":
            scaling = {"rope_type": "linear", "factor": rs.factor}
        elif rs.rope_type == "llama3":
            scaling = {
                "rope_type": "llama3",
                "factor": rs.factor,
                "low_freq_factor": rs.low_freq_factor,
                "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position_embeddings,
            }
        eos = list(self.eos_token_ids)
        d = {
            "architectures": [ARCHITECTURES[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": self.pad_token_id,
            "hidden_act": "silu",
            "attention_bias": self.o_bias,
            "mlp_bias": self.mlp_bias,
        }
        window = max(self.attention_windows, default=0)
        if self.architecture == "mistral":
            d["sliding_window"] = window or None
        elif self.architecture in ("qwen2", "qwen3"):
            d["use_sliding_window"] = bool(window)
            d["sliding_window"] = window or None
            d["layer_types"] = [
                "sliding_attention" if w else "full_attention"
                for w in (self.attention_windows or (0,) * self.num_layers)
            ]
        return d

    def fingerprint(self) -> str:
        """A short stable hash of the architecture (stored in checkpoint manifests)."""
        blob = json.dumps(self.to_hf_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _rope_from_hf(d: dict[str, Any]) -> tuple[float, RopeScaling]:
    params = d.get("rope_parameters")  # transformers >= 5
    if params is None:
        params = dict(d.get("rope_scaling") or {})
        params.setdefault("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UserInputError(
            f"unsupported rope_scaling type {rope_type!r}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserInputError("unsupported: partial_rotary_factor != 1")
    defaults = RopeScaling()
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            params.get(
                "original_max_position_embeddings", defaults.original_max_position_embeddings
            )
        ),
    )
    return theta, scaling


def _unsupported(arch, archs) -> str:
    known = ", ".join(f"{v} ({k})" for k, v in ARCHITECTURES.items())
    return (
        f"unsupported architecture: model_type={arch!r}, architectures={archs}; supported: {known}"
    )


def _windows_from_hf(arch: str, d: dict[str, Any]) -> tuple[int, ...]:
    """Per-layer sliding windows (0: full attention) as transformers applies them."""
    layers = d["num_hidden_layers"]
    window = d.get("sliding_window")
    if arch == "llama" or window is None:
        return ()
    if arch in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
        return ()  # transformers drops the window unless use_sliding_window
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise UserInputError(f"sliding_window must be a positive integer, got {window!r}")
    types = d.get("layer_types")
    if types is None:
        if arch == "mistral":
            types = ["sliding_attention"] * layers
        else:  # qwen2/qwen3: the layers from max_window_layers on slide
            first = d.get("max_window_layers", layers)
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise UserInputError(
            f"unsupported layer_types {types!r}: need {layers} of 'full_attention' / "
            "'sliding_attention'"
        )
    windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    return windows if any(windows) else ()
