"""Typed configuration: model shapes (presets) and training options, with their validation.

One frozen dataclass per concern. :class:`TrainConfig` holds every option of ``titan train``; its
fields carry the CLI flag and help text as metadata, so that the CLI (``titan.cli``) and the
console (``tui``) are both derived from this one place and share :func:`validate_train_config`.
The config is saved verbatim in each run's ``config.json``.

This module imports neither JAX nor Textual, so the console and the planner can import it cheaply.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from titan.errors import TitanError


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

DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "dots", "dots-attention", "full")
ATTENTION_MASKS = ("document", "causal")
LAYOUTS = ("spmd", "mpmd")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")


def _opt(flag: str, help: str, **extra: Any) -> dict[str, Any]:
    return {"flag": flag, "help": help, **extra}


@dataclass(frozen=True)
class TrainConfig:
    """Every option of ``titan train``. Field metadata holds the CLI flag and its help text."""

    preset: str = field(
        default="tiny",
        metadata=_opt("--preset", "model shape", choices=tuple(PRESETS)),
    )
    steps: int = field(
        default=200,
        metadata=_opt("--steps", "total optimizer steps of the run (a resumed run stops here)"),
    )
    batch_size: int = field(
        default=16, metadata=_opt("--batch-size", "global batch in sequences per step")
    )
    seq_len: int = field(default=128, metadata=_opt("--seq-len", "tokens per sequence"))
    lr: float = field(default=3e-3, metadata=_opt("--lr", "peak learning rate (AdamW)"))
    min_lr_ratio: float = field(
        default=0.1, metadata=_opt("--min-lr-ratio", "final learning rate as a fraction of --lr")
    )
    warmup_steps: int = field(
        default=30, metadata=_opt("--warmup-steps", "linear warmup steps before cosine decay")
    )
    weight_decay: float = field(
        default=0.1, metadata=_opt("--weight-decay", "AdamW decoupled weight decay")
    )
    grad_clip: float = field(
        default=1.0, metadata=_opt("--grad-clip", "global gradient-norm clip (0 disables)")
    )
    seed: int = field(default=0, metadata=_opt("--seed", "seed for initialisation and shuffling"))
    data: str = field(
        default="stdlib",
        metadata=_opt(
            "--data",
            "corpus: 'stdlib' (this Python's standard library sources), or a text file, a "
            "directory, a .jsonl file with a 'text' field, or a .parquet file with a 'text' column",
        ),
    )
    tokenizer: str = field(
        default="",
        metadata=_opt(
            "--tokenizer",
            "sentencepiece .model to use; empty trains one on the corpus (cached)",
        ),
    )
    vocab_size: int = field(
        default=4096,
        metadata=_opt("--vocab-size", "vocabulary of the tokenizer trained when none is given"),
    )
    runs_root: str = field(
        default="",
        metadata=_opt("--runs-root", "folder holding run dirs (default: $TITAN_RUNS or ./runs)"),
    )
    run_id: str = field(
        default="", metadata=_opt("--run-id", "name of the run dir (default: generated)")
    )
    checkpoint_every: int = field(
        default=100, metadata=_opt("--checkpoint-every", "save a checkpoint every N steps")
    )
    layout: str = field(
        default="spmd", metadata=_opt("--layout", "training layout", choices=LAYOUTS)
    )
    dp: int = field(
        default=0, metadata=_opt("--dp", "data-parallel size (0: all devices left by fsdp x tp)")
    )
    fsdp: int = field(default=1, metadata=_opt("--fsdp", "fully-sharded data-parallel size"))
    tp: int = field(default=1, metadata=_opt("--tp", "tensor-parallel size"))
    pp: int = field(
        default=1, metadata=_opt("--pp", "pipeline stages (device groups), --layout mpmd")
    )
    microbatches: int = field(
        default=1, metadata=_opt("--microbatches", "microbatches per step (--layout mpmd)")
    )
    schedule: str = field(
        default="1f1b",
        metadata=_opt("--schedule", "pipeline schedule (--layout mpmd)", choices=SCHEDULES),
    )
    virtual_stages: int = field(
        default=1,
        metadata=_opt(
            "--virtual-stages", "model chunks per device group (--schedule interleaved-1f1b)"
        ),
    )
    stage_layers: str = field(
        default="",
        metadata=_opt(
            "--stage-layers",
            "layers per model chunk in pipeline order, e.g. '3,5,5,3' (default: even split)",
        ),
    )
    timing_every: int = field(
        default=50,
        metadata=_opt(
            "--timing-every",
            "record a pipeline_timing event (per-action durations) every N steps (--layout mpmd)",
        ),
    )
    param_dtype: str = field(
        default="float32",
        metadata=_opt("--param-dtype", "master weights and optimizer state", choices=DTYPES),
    )
    compute_dtype: str = field(
        default="auto",
        metadata=_opt(
            "--compute-dtype",
            "matmul/activation dtype ('auto': bfloat16 on GPU/TPU, float32 on CPU)",
            choices=("auto", *DTYPES),
        ),
    )
    ops: str = field(
        default="",
        metadata=_opt(
            "--ops",
            "operator providers, e.g. 'attention=pallas,cross_entropy=chunked' (default: the "
            "registry's choice per backend; $TITAN_OPS applies under these)",
        ),
    )
    remat: str = field(
        default="none",
        metadata=_opt("--remat", "activation recomputation per layer", choices=REMAT_POLICIES),
    )
    attention_mask: str = field(
        default="document",
        metadata=_opt(
            "--attention-mask",
            "'document': causal within each packed document (segment ids; Llama 3's choice); "
            "'causal': causal over the whole packed sequence, documents see earlier ones "
            "(cheaper: fused kernels without a segment mask)",
            choices=ATTENTION_MASKS,
        ),
    )
    layer_unroll: int = field(
        default=0,
        metadata=_opt(
            "--layer-unroll",
            "decoder blocks per iteration of the layer scan; 0: all of them (the loop fully "
            "unrolled: a larger program that compiles slower and runs faster on GPUs), 1: a "
            "rolled loop (the smallest program)",
        ),
    )
    log_every: int = field(
        default=10, metadata=_opt("--log-every", "print a log line every N steps (no terminal)")
    )
    watchdog_floor: float = field(
        default=300.0,
        metadata=_opt(
            "--watchdog-floor",
            "seconds a step may always take before the watchdog reports a stall (the allowance "
            "is the larger of this and --watchdog-factor x the median step time)",
        ),
    )
    watchdog_factor: float = field(
        default=10.0,
        metadata=_opt("--watchdog-factor", "stall allowance of a step in median step times"),
    )
    watchdog_abort: int = field(
        default=0,
        metadata=_opt(
            "--watchdog-abort",
            "1: on a stall, record run_end failed (reason stall) and exit with code 3 so that a "
            "supervisor can restart the run; 0: only record the stall",
        ),
    )
    profile_steps: str = field(
        default="",
        metadata=_opt(
            "--profile-steps",
            "'A:B': capture a JAX profiler trace of steps A to B (1-based, inclusive) into "
            "<run dir>/profile/ (open with TensorBoard's or XProf's profile plugin, or Perfetto); "
            "empty: no trace",
        ),
    )
    debug_stall_at_step: int = field(
        default=0,
        metadata=_opt(
            "--debug-stall-at-step",
            "testing aid: hang the loop before step N to exercise the watchdog (0: never)",
        ),
    )


# Options that may change when a run is resumed; everything else must match the saved config.
RESUMABLE_OPTIONS = frozenset(
    {
        "steps",
        "checkpoint_every",
        "log_every",
        "timing_every",
        "layout",
        "dp",
        "fsdp",
        "tp",
        "pp",
        "microbatches",
        "schedule",
        "virtual_stages",
        "stage_layers",
        "ops",
        "remat",
        "layer_unroll",
        "watchdog_floor",
        "watchdog_factor",
        "watchdog_abort",
        "profile_steps",
        "debug_stall_at_step",
    }
)


def option_fields() -> tuple[dataclasses.Field, ...]:
    """The fields of :class:`TrainConfig`, in CLI order."""
    return dataclasses.fields(TrainConfig)


def flag_of(name: str) -> str:
    """The CLI flag of a :class:`TrainConfig` field name (``batch_size`` -> ``--batch-size``)."""
    return {f.name: f.metadata["flag"] for f in option_fields()}[name]


def _positive(cfg: TrainConfig, names: tuple[str, ...], minimum: int) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value < minimum:
            raise TitanError(f"{flag_of(name)} must be >= {minimum}, got {value}")


def parse_profile_steps(text: str, steps: int) -> tuple[int, int] | None:
    """The (first, last) steps of ``--profile-steps 'A:B'`` (1-based, inclusive), None when empty.

    Raises:
        TitanError: not two integers ``A:B`` with 1 <= A <= B <= ``steps``.
    """
    if not text:
        return None
    first, sep, last = text.partition(":")
    try:
        bounds = (int(first), int(last)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None:
        raise TitanError(f"--profile-steps must be 'A:B' (two step numbers), got {text!r}")
    if not 1 <= bounds[0] <= bounds[1] <= steps:
        raise TitanError(
            f"--profile-steps {text}: need 1 <= A <= B <= --steps ({steps}), got A={bounds[0]}, "
            f"B={bounds[1]}"
        )
    return bounds


def validate_train_config(cfg: TrainConfig) -> None:
    """Check option values on their own (no devices, no files).

    Raises:
        TitanError: one line naming the first bad option and what is allowed.
    """
    for f in option_fields():
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise TitanError(f"{f.metadata['flag']} must be a finite number, got {value}")
        choices = f.metadata.get("choices")
        if choices and getattr(cfg, f.name) not in choices:
            raise TitanError(
                f"{f.metadata['flag']} must be one of {', '.join(choices)}, "
                f"got {getattr(cfg, f.name)!r}"
            )
    _positive(cfg, ("steps", "batch_size", "seq_len", "checkpoint_every", "log_every"), 1)
    _positive(cfg, ("fsdp", "tp", "pp", "microbatches", "virtual_stages", "timing_every"), 1)
    _positive(cfg, ("dp", "warmup_steps", "debug_stall_at_step", "seed", "layer_unroll"), 0)
    if cfg.seed >= 2**32:
        raise TitanError(f"--seed must be < 2**32, got {cfg.seed}")
    if cfg.watchdog_abort not in (0, 1):
        raise TitanError(f"--watchdog-abort must be 0 or 1, got {cfg.watchdog_abort}")
    if not cfg.watchdog_floor > 0 or not cfg.watchdog_factor > 0:
        raise TitanError(
            f"--watchdog-floor and --watchdog-factor must be > 0, got {cfg.watchdog_floor} and "
            f"{cfg.watchdog_factor}"
        )
    if cfg.vocab_size < 259:
        raise TitanError(
            "--vocab-size must be >= 259 (3 special tokens + 256 byte pieces), "
            f"got {cfg.vocab_size}"
        )
    if not cfg.lr > 0:
        raise TitanError(f"--lr must be > 0, got {cfg.lr}")
    if not 0 <= cfg.min_lr_ratio <= 1:
        raise TitanError(f"--min-lr-ratio must be within [0, 1], got {cfg.min_lr_ratio}")
    for name in ("weight_decay", "grad_clip"):
        if getattr(cfg, name) < 0:
            raise TitanError(f"{flag_of(name)} must be >= 0, got {getattr(cfg, name)}")
    parse_profile_steps(cfg.profile_steps, cfg.steps)
    _validate_pipeline(cfg)
    from titan.ops.registry import parse_overrides

    parse_overrides(cfg.ops, source="--ops")
    if cfg.run_id and (cfg.run_id.startswith(".") or "/" in cfg.run_id or "\\" in cfg.run_id):
        raise TitanError(f"--run-id must be a plain folder name, got {cfg.run_id!r}")


def _validate_pipeline(cfg: TrainConfig) -> None:
    if cfg.layout == "spmd":
        defaults = TrainConfig()
        for name in ("pp", "microbatches", "virtual_stages", "schedule", "stage_layers"):
            if getattr(cfg, name) != getattr(defaults, name):
                raise TitanError(f"{flag_of(name)} needs --layout mpmd")
        return
    if cfg.batch_size % cfg.microbatches:
        raise TitanError(
            f"--batch-size {cfg.batch_size} is not a multiple of --microbatches {cfg.microbatches}"
        )
    from titan.mpmd.schedules import check_schedule_options

    check_schedule_options(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual_stages)


def config_from_dict(values: dict[str, Any]) -> TrainConfig:
    """Build a :class:`TrainConfig` from a mapping (a saved ``config.json``'s ``train`` part).

    Raises:
        TitanError: on an unknown option name.
    """
    known = {f.name for f in option_fields()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TitanError(f"unknown option {unknown[0]!r} in config")
    return TrainConfig(**values)


def model_config(cfg: TrainConfig, tokenizer_vocab: int) -> ModelConfig:
    """The model shape of a run: its preset, with the vocabulary taken from the tokenizer when
    the preset leaves it open (``vocab_size == 0``).

    Raises:
        TitanError: when the tokenizer has more pieces than the preset's embedding has rows.
    """
    preset = PRESETS[cfg.preset]
    if preset.vocab_size == 0:
        return dataclasses.replace(preset, vocab_size=tokenizer_vocab)
    if tokenizer_vocab > preset.vocab_size:
        raise TitanError(
            f"--tokenizer has {tokenizer_vocab} pieces but --preset {cfg.preset} embeds only "
            f"{preset.vocab_size}"
        )
    return preset
