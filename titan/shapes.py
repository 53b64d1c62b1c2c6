"""Model shapes: the Llama-style shape of a decoder (:class:`ModelConfig`), the published presets,
and the ``--model`` text of a shape (a preset name or ``d_model=...,n_layers=...``), shared by
``titan train`` and ``titan plan``.

This module imports neither JAX nor Textual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from titan.errors import TitanError
from titan.parsing import parse_assignments


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (Hugging Face ``rope_type: llama3``; Meta,
    ``llama_models/llama3/reference_impl/model.py`` ``apply_scaling``): RoPE wavelengths longer
    than ``original_max_position_embeddings / low_freq_factor`` are stretched by ``factor``,
    those shorter than ``original_max_position_embeddings / high_freq_factor`` kept, and those in
    between interpolated (:func:`titan.ops.native.rope_inv_freq` computes it).

    Attributes:
        factor: the stretch of the low frequencies (8 in Llama 3.1, 32 in Llama 3.2).
        low_freq_factor, high_freq_factor: the band edges (1 and 4 in Llama 3.1).
        original_max_position_embeddings: the context the model was pre-trained at (8192).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    @classmethod
    def of(cls, value: RopeScaling | Mapping | None) -> RopeScaling | None:
        """A scaling from itself, a mapping of its fields (``config.json``), or None."""
        if value is None or isinstance(value, RopeScaling):
            return value
        try:
            return cls(**{f.name: value[f.name] for f in fields(cls)})
        except (KeyError, TypeError) as err:
            raise TitanError(f"rope_scaling: missing or bad field {err}") from None


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder (untied input embedding and output head).

    Attributes:
        name: preset name, or ``custom``.
        vocab_size: rows of the embedding and columns of the output head. ``0`` means "take the
            tokenizer's vocabulary size" (used by ``tiny``, whose tokenizer is trained per corpus).
        d_model: hidden size.
        n_layers: decoder blocks.
        n_heads: query heads; ``d_model`` must be a multiple of it (head_dim = d_model / n_heads).
        n_kv_heads: key/value heads (grouped-query attention, Ainslie et al. 2023);
            ``n_heads`` must be a multiple of it.
        ffn_dim: hidden size of the SwiGLU MLP (Shazeer 2020).
        rope_theta: RoPE base (Su et al. 2021); Llama 3 uses 500000.
        norm_eps: RMSNorm epsilon (Zhang & Sennrich 2019).
        rope_scaling: Llama 3.1's RoPE frequency scaling, or None (plain RoPE).
    """

    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rope_scaling", RopeScaling.of(self.rope_scaling))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def param_count(self) -> int:
        """Number of parameters (untied embedding and head), from the shapes alone."""
        kv_dim = self.n_kv_heads * self.head_dim
        attention = 2 * self.d_model * self.d_model + 2 * self.d_model * kv_dim
        mlp = 3 * self.d_model * self.ffn_dim
        norms = 2 * self.d_model
        per_layer = attention + mlp + norms
        return self.n_layers * per_layer + 2 * self.vocab_size * self.d_model + self.d_model


# Published shapes. Llama 3 / 3.1: Meta, "The Llama 3 Herd of Models" (2024), Table 3
# (8B: 32 layers, d 4096, ffn 14336, 32 heads, 8 KV heads; 70B: 80, 8192, 28672, 64, 8;
# 405B: 126, 16384, 53248, 128, 8; vocab 128256, RoPE theta 500000).
# llama3-1b is the Llama 3.2 1B shape (16 layers, d 2048, ffn 8192, 32 heads, 8 KV heads); the
# published 1.24e9 count ties embedding and head, ours are untied (1.50e9).
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", 0, 256, 4, 8, 4, 688, rope_theta=10_000.0),
    "llama3-1b": ModelConfig("llama3-1b", 128_256, 2048, 16, 32, 8, 8192),
    "llama3-8b": ModelConfig("llama3-8b", 128_256, 4096, 32, 32, 8, 14_336),
    "llama3-70b": ModelConfig("llama3-70b", 128_256, 8192, 80, 64, 8, 28_672),
    "llama3-405b": ModelConfig("llama3-405b", 128_256, 16_384, 126, 128, 8, 53_248),
}


SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
DEFAULT_VOCAB_SIZE = 4096


def parse_model(text: str, flag: str = "--model") -> ModelConfig:
    """A preset name (``llama3-70b``, any case) or a custom shape
    (``d_model=4096,n_layers=32,n_heads=32,n_kv_heads=8,ffn_dim=14336,vocab_size=128256``).
    Presets are returned as registered (``tiny`` keeps ``vocab_size`` 0: the tokenizer's).

    Raises:
        TitanError: unknown preset, missing or unknown field, or an inconsistent shape.
    """
    name = text.strip().lower()
    if name in PRESETS:
        return PRESETS[name]
    if "=" not in name:
        raise TitanError(
            f"{flag} {text!r} is not a preset ({', '.join(PRESETS)}) nor a shape like "
            "d_model=4096,n_layers=32,n_heads=32,n_kv_heads=8,ffn_dim=14336,vocab_size=128256"
        )
    values: dict[str, int] = {}
    for key, value in parse_assignments(name, flag, shape="field=value").items():
        if key not in SHAPE_FIELDS:
            raise TitanError(f"{flag}: unknown field {key!r}; fields: {', '.join(SHAPE_FIELDS)}")
        try:
            values[key] = int(float(value))
        except (ValueError, OverflowError):  # OverflowError: inf
            raise TitanError(f"{flag}: {key} must be a number, got {value!r}") from None
    missing = [key for key in SHAPE_FIELDS if key not in values]
    if missing:
        raise TitanError(f"{flag}: missing {', '.join(missing)}")
    shape = ModelConfig("custom", **values)
    check_shape(shape, flag)
    return shape


def check_shape(m: ModelConfig, flag: str = "--model") -> None:
    """Raises TitanError naming the first inconsistent field of a custom shape."""
    for key in SHAPE_FIELDS:
        if getattr(m, key) < 1:
            raise TitanError(f"{flag}: {key} must be >= 1, got {getattr(m, key)}")
    if m.d_model % m.n_heads:
        raise TitanError(f"{flag}: d_model {m.d_model} is not a multiple of n_heads {m.n_heads}")
    if m.n_heads % m.n_kv_heads:
        raise TitanError(
            f"{flag}: n_heads {m.n_heads} is not a multiple of n_kv_heads {m.n_kv_heads}"
        )


def model_text(m: ModelConfig) -> str:
    """The ``--model`` text of a shape: its preset name, or ``d_model=...,...`` when custom."""
    if PRESETS.get(m.name) == m:
        return m.name
    return ",".join(f"{key}={getattr(m, key)}" for key in SHAPE_FIELDS)
