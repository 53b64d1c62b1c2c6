"""Model shapes: the Llama-style shape of a decoder or of a DiT (:class:`ModelConfig`), the
published presets,
and the ``--model`` text of a shape (a preset name or ``d_model=...,n_layers=...``), shared by
``titan train`` and ``titan plan``.

This module imports neither JAX nor Textual.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

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
        """A scaling from itself, a mapping of its fields (``config.json``), or None.

        Raises:
            TitanError: a field is missing or no number, or the values break the rules Hugging
                Face's ``_validate_llama3_parameters`` (``transformers/modeling_rope_utils.py``)
                checks them against (:meth:`problem`).
        """
        if value is None or isinstance(value, RopeScaling):
            return value
        names = [f.name for f in fields(cls)]
        if not isinstance(value, Mapping):
            raise TitanError(f"rope_scaling must be a table of {', '.join(names)}, got {value!r}")
        missing = [name for name in names if name not in value]
        if missing:
            raise TitanError(f"rope_scaling: missing {', '.join(missing)}")
        for name in names:
            if isinstance(value[name], bool) or not isinstance(value[name], int | float):
                raise TitanError(f"rope_scaling: {name} must be a number, got {value[name]!r}")
        scaling = cls(**{name: value[name] for name in names})
        if problem := scaling.problem():
            raise TitanError(f"rope_scaling: {problem}")
        return scaling

    def problem(self) -> str | None:
        """Why these values scale no frequency band, or None: ``factor`` a finite number >= 1
        (a stretch), ``0 < low_freq_factor < high_freq_factor`` finite (the band's edges;
        equal edges divide by zero in the interpolation), ``original_max_position_embeddings``
        an integer >= 1."""
        if not 1 <= self.factor < math.inf:
            return f"factor must be a finite number >= 1, got {self.factor}"
        if not 0 < self.low_freq_factor < self.high_freq_factor < math.inf:
            return (
                "low_freq_factor and high_freq_factor must be finite with 0 < low < high, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        original = self.original_max_position_embeddings
        if not (original >= 1 and float(original).is_integer()):
            return f"original_max_position_embeddings must be an integer >= 1, got {original}"
        return None


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
        family: ``llama`` (a decoder) or ``dit`` (a diffusion transformer, Peebles & Xie 2023,
            :mod:`titan.models.dit`: ``vocab_size`` is then the class-label table, the classes
            plus the null label of classifier-free guidance, and ``n_kv_heads == n_heads``).
        patch_size, image_size, channels: the DiT's patch side, image side and channels
            (0 for a decoder); the image is ``image_size`` x ``image_size`` x ``channels``.
        max_positions: the context a published model declares (Hugging Face's
            ``max_position_embeddings``, kept from ``titan import hf`` to ``titan export hf``);
            0 when none was declared (a model trained from scratch).
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
    family: str = "llama"
    patch_size: int = 0
    image_size: int = 0
    channels: int = 0
    max_positions: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rope_scaling", RopeScaling.of(self.rope_scaling))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def patches(self) -> int:
        """Tokens of a DiT's image: (image_size / patch_size)^2 (0 for a decoder)."""
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0

    def record(self) -> dict:
        """The shape as run records hold it (``config.json``, ``run_start``): every field, less
        the DiT's (``family`` and the image fields) for a decoder, so that a decoder's record
        and performance key read as they always have (``max_positions`` only when declared)."""
        fields = dataclasses.asdict(self)
        if self.family == "llama":
            for name in ("family", "patch_size", "image_size", "channels"):
                del fields[name]
        if not self.max_positions:
            del fields["max_positions"]
        return fields

    def param_count(self) -> int:
        """Number of parameters (untied embedding and head), from the shapes alone."""
        if self.family == "dit":
            return dit_param_count(self)
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
# published 1.24e9 count ties embedding and head, ours are untied (1.50e9). llama3-3b is the
# Llama 3.2 3B shape (Meta's model card and config.json: 28 layers, d 3072, ffn 8192, 24 heads,
# 8 KV heads; 3.21e9 tied, 3.61e9 untied).
# DiT (Peebles & Xie 2023, Table 1): S 12 layers, d 384, 6 heads; B 12, 768, 12; L 24, 1024, 16;
# XL 28, 1152, 16; patch 2 on the 32 x 32 x 4 latent of a 256 x 256 image, 1000 ImageNet classes
# plus the null label. Titan's DiT uses SwiGLU, whose ffn_dim = 8 d / 3 (rounded up to a multiple
# of 64) keeps the MLP's parameters those of the paper's 4 d GELU MLP. dit-tiny is the digits
# shape (8 x 8 x 1, classes from the data) that trains on a CPU in minutes.
def _dit(name: str, labels: int, d: int, layers: int, heads: int, ffn: int, image: int, c: int):
    return ModelConfig(
        name, labels, d, layers, heads, heads, ffn, 10_000.0, 1e-6,
        family="dit", patch_size=2, image_size=image, channels=c,
    )  # fmt: skip


DIT_PRESETS: dict[str, ModelConfig] = {
    "dit-tiny": _dit("dit-tiny", 0, 128, 4, 4, 384, 8, 1),
    "dit-s-2": _dit("dit-s-2", 1001, 384, 12, 6, 1024, 32, 4),
    "dit-b-2": _dit("dit-b-2", 1001, 768, 12, 12, 2048, 32, 4),
    "dit-l-2": _dit("dit-l-2", 1001, 1024, 24, 16, 2752, 32, 4),
    "dit-xl-2": _dit("dit-xl-2", 1001, 1152, 28, 16, 3072, 32, 4),
}

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", 0, 256, 4, 8, 4, 688, rope_theta=10_000.0),
    "llama3-1b": ModelConfig("llama3-1b", 128_256, 2048, 16, 32, 8, 8192),
    "llama3-3b": ModelConfig("llama3-3b", 128_256, 3072, 28, 24, 8, 8192),
    "llama3-8b": ModelConfig("llama3-8b", 128_256, 4096, 32, 32, 8, 14_336),
    "llama3-70b": ModelConfig("llama3-70b", 128_256, 8192, 80, 64, 8, 28_672),
    "llama3-405b": ModelConfig("llama3-405b", 128_256, 16_384, 126, 128, 8, 53_248),
    **DIT_PRESETS,
}
TIMESTEP_FREQUENCIES = 256  # sinusoidal timestep features of the DiT (Peebles & Xie 2023, code)


def dit_param_count(m: ModelConfig) -> int:
    """Parameters of Titan's DiT (:mod:`titan.models.dit`): the patch embedding (P^2 C E + E),
    the timestep MLP (256 E + E + E^2 + E), the label table (V E); per block attention (4 E^2),
    SwiGLU (3 E F), two RMSNorm scales (2 E) and the adaLN-Zero modulation (6 E^2 + 6 E); the
    final norm (E), modulation (2 E^2 + 2 E) and linear layer (E P^2 C + P^2 C)."""
    e, patch_out = m.d_model, m.patch_size**2 * m.channels
    embed = patch_out * e + e + TIMESTEP_FREQUENCIES * e + e + e * e + e + m.vocab_size * e
    block = 4 * e * e + 3 * e * m.ffn_dim + 2 * e + 6 * e * e + 6 * e
    final = e + 2 * e * e + 2 * e + e * patch_out + patch_out
    return embed + m.n_layers * block + final


SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
# The largest value of a shape field: 2^24, far above any model's (Llama 3.1 405B: d_model 16,384,
# ffn_dim 53,248, 126 layers, 128,256 pieces), so that arithmetic on shapes stays exact in floats.
MAX_SHAPE_FIELD = 2**24
OPTIONAL_SHAPE_FIELDS = ("rope_theta",)  # floats, ModelConfig's default when left out
DEFAULT_VOCAB_SIZE = 4096
MIN_TRAINED_VOCAB = 259
"""The fewest pieces of a tokenizer Titan trains: its 3 special tokens (unknown, BOS, EOS) and
256 byte pieces, so that every text encodes (sentencepiece's byte fallback)."""


def parse_model(text: str, flag: str = "--model") -> ModelConfig:
    """A preset name (``llama3-70b``, any case) or a custom shape
    (``d_model=4096,n_layers=32,n_heads=32,n_kv_heads=8,ffn_dim=14336,vocab_size=128256``,
    optionally ``rope_theta=10000``). Presets are returned as registered (``tiny`` keeps
    ``vocab_size`` 0: the tokenizer's).

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
    values: dict[str, Any] = {}  # ModelConfig's fields: ints, and the optional floats
    for key, value in parse_assignments(name, flag, shape="field=value").items():
        if key not in SHAPE_FIELDS + OPTIONAL_SHAPE_FIELDS:
            fields = ", ".join(SHAPE_FIELDS + OPTIONAL_SHAPE_FIELDS)
            raise TitanError(f"{flag}: unknown field {key!r}; fields: {fields}")
        try:
            number = float(value)
            values[key] = number if key in OPTIONAL_SHAPE_FIELDS else int(number)
        except (ValueError, OverflowError):  # OverflowError: inf
            raise TitanError(f"{flag}: {key} must be a number, got {value!r}") from None
        if key not in OPTIONAL_SHAPE_FIELDS and not number.is_integer():
            raise TitanError(f"{flag}: {key} must be a whole number, got {value!r}")
    missing = [key for key in SHAPE_FIELDS if key not in values]
    if missing:
        raise TitanError(f"{flag}: missing {', '.join(missing)}")
    shape = ModelConfig("custom", **values)
    check_shape(shape, flag)
    return shape


ROPE_THETA_RULE = "a finite number > 1"
NORM_EPS_RULE = "a number in (0, 1)"


def rope_theta_ok(value: float) -> bool:
    """Whether ``value`` is a RoPE base: every wavelength ``theta^(2i/d)`` grows with ``i``
    (Su et al. 2021, RoFormer, Sec. 3.2.2), so it must exceed 1, and be finite."""
    return 1 < value < math.inf


def norm_eps_ok(value: float) -> bool:
    """Whether ``value`` is an RMSNorm epsilon (Zhang & Sennrich 2019): positive, and below the
    unit mean square it guards."""
    return 0 < value < 1


def check_shape(m: ModelConfig, flag: str = "--model") -> None:
    """Raises TitanError naming the first inconsistent field of a custom shape."""
    for key in SHAPE_FIELDS:
        if not 1 <= getattr(m, key) <= MAX_SHAPE_FIELD:
            raise TitanError(
                f"{flag}: {key} must be in [1, {MAX_SHAPE_FIELD:,}], got {getattr(m, key):.6g}"
            )
    if not rope_theta_ok(m.rope_theta):
        raise TitanError(f"{flag}: rope_theta must be {ROPE_THETA_RULE}, got {m.rope_theta}")
    if not norm_eps_ok(m.norm_eps):
        raise TitanError(f"{flag}: norm_eps must be {NORM_EPS_RULE}, got {m.norm_eps}")
    if m.d_model % m.n_heads:
        raise TitanError(f"{flag}: d_model {m.d_model} is not a multiple of n_heads {m.n_heads}")
    if m.n_heads % m.n_kv_heads:
        raise TitanError(
            f"{flag}: n_heads {m.n_heads} is not a multiple of n_kv_heads {m.n_kv_heads}"
        )
    dit_fields = [key for key in ("patch_size", "image_size", "channels") if getattr(m, key)]
    if m.family == "llama" and dit_fields:
        raise TitanError(f"{flag}: {', '.join(dit_fields)} belong to a dit shape, not a llama's")
    if m.family == "llama" and m.head_dim % 2:
        raise TitanError(
            f"{flag}: the head dim d_model / n_heads = {m.head_dim} must be even (rotary "
            "embeddings turn pairs of its features; Su et al. 2021, RoFormer, Sec. 3.4)"
        )


def model_text(m: ModelConfig) -> str:
    """The ``--model`` text of a shape: its preset name, or ``d_model=...,...`` when custom."""
    if PRESETS.get(m.name) == m:
        return m.name
    fields = [f"{key}={getattr(m, key)}" for key in SHAPE_FIELDS]
    defaults = ModelConfig("default", 0, 0, 0, 0, 0, 0)
    fields += [
        f"{k}={getattr(m, k):g}"
        for k in OPTIONAL_SHAPE_FIELDS
        if getattr(m, k) != getattr(defaults, k)
    ]
    return ",".join(fields)


DIGITS_LABELS = 11  # the digits' 10 classes and classifier-free guidance's null label


def resolve_model(text: str) -> ModelConfig:
    """A preset name (``llama3-70b``) or a custom shape (``d_model=...,n_layers=...,...``), as
    ``titan train --model`` takes it (:func:`parse_model`).

    The ``tiny`` preset takes its vocabulary from a tokenizer trained per corpus; here it gets the
    default ``--vocab-size`` of ``titan train`` (4096); ``dit-tiny``, whose label table has a row
    per class of the data plus the null label, gets the digits' 11.

    Raises:
        TitanError: unknown preset, missing or unknown field, or an inconsistent shape.
    """
    shape = parse_model(text)
    if shape.vocab_size == 0:
        vocab = DIGITS_LABELS if shape.family == "dit" else DEFAULT_VOCAB_SIZE
        return dataclasses.replace(shape, vocab_size=vocab)
    return shape
