"""Accelerator providers of the semantic operators, registered on import of :mod:`titan.ops`.

Provider (priority): what it serves.

- ``attention``/``pallas`` (20): FlashAttention-2 in Pallas, Triton on CUDA/ROCm and interpreted
  on CPU; fp32/bf16/fp16, GQA, causal, segment ids, sliding window; head dim and blocks powers of
  two. Chosen automatically only where measured faster than cuDNN: Hopper, bf16/fp16, with segment
  ids (:func:`titan.ops.providers.flash_attention.preferred`); otherwise opt-in.
- ``attention``/``splash`` (15): JAX's Pallas splash attention kernels (Mosaic) on TPUs, interpreted
  on CPU; bf16 on TPUs (fp32 too on CPU), GQA, causal, segment ids, sliding window; sequence and
  head dim multiples of 128. Chosen automatically on a TPU where one device runs the model
  (:mod:`titan.ops.providers.splash_attention`); forced elsewhere (``attention=splash``).
- ``attention``/``cudnn`` (10): CUDA GPUs, bf16/fp16, head dim a multiple of 8 (<= 256 from
  Hopper), causal, GQA, segment ids (on Hopper as packed documents, else as a dense mask),
  causal sliding window. Chosen
  automatically wherever it can serve the call and ``pallas`` is not preferred
  (:mod:`titan.ops.providers.cudnn`).
- ``rms_norm``/``pallas`` (-10): fused forward and backward kernels, model dim a power of two.
  Opt-in (:mod:`titan.ops.providers.rms_norm`).
- ``swiglu``/``pallas`` (5): the gating's backward pass (both gradients) in one Pallas kernel;
  F a multiple of 128. Chosen by default on CUDA GPUs, opt-in elsewhere
  (:mod:`titan.ops.providers.swiglu`).
- ``cross_entropy``/``fused`` (5): head and loss with a hand-written backward pass that writes
  the logits' gradient in one pass, in the compute dtype; every backend, chosen by default
  (:mod:`titan.ops.providers.fused_loss`).
- ``rope``/``fused`` (5): RoPE with a hand-written backward pass (the rotation by the negated
  angles); every backend, chosen by default (:mod:`titan.ops.providers.fused_rope`).
- ``cross_entropy``/``chunked`` (-10): head and loss over sequence chunks, so (B, S, V) logits
  never exist at once; every backend. Opt-in (:mod:`titan.ops.providers.chunked`).

Measurements of each provider: ``docs/benchmarks.md``.

``native`` (priority 0) serves everything else, and on CPU everything but the loss and RoPE by
default; a provider below 0, or one whose ``prefer`` declines the call, serves only when forced
(``TITAN_OPS=attention=pallas`` or the config's overrides).
AMD GPUs: JAX offers no cuDNN-like fused attention on ROCm, so ``native`` serves there by default;
the Pallas kernels are the ROCm path (``attention=pallas``), lowered through the Triton that
JAX's ROCm build ships. They are tested here only in interpret mode (no AMD machine).

Each provider module is imported when one of its functions is first called (see
:mod:`titan.ops.registry`), so registering them imports no JAX.
"""

from __future__ import annotations

from titan.ops.providers.platform import PALLAS_BACKENDS, TPU
from titan.ops.registry import register

OPT_IN = -10
CUDNN = "titan.ops.providers.cudnn"
FLASH = "titan.ops.providers.flash_attention"
SPLASH = "titan.ops.providers.splash_attention"
RMS_NORM = "titan.ops.providers.rms_norm"
FUSED_LOSS = "titan.ops.providers.fused_loss"
SWIGLU = "titan.ops.providers.swiglu"

register(
    "attention",
    "pallas",
    f"{FLASH}:attention",
    priority=20,
    supports=f"{FLASH}:supports",
    backends=PALLAS_BACKENDS,
    prefer=f"{FLASH}:preferred",
)
register(
    "attention",
    "splash",
    f"{SPLASH}:attention",
    priority=15,
    supports=f"{SPLASH}:supports",
    backends=("cpu", TPU),
    prefer=f"{SPLASH}:preferred",
)
register(
    "attention",
    "cudnn",
    f"{CUDNN}:attention",
    priority=10,
    supports=f"{CUDNN}:supports",
    backends=("gpu", "cuda"),
)
register(
    "rms_norm",
    "pallas",
    f"{RMS_NORM}:rms_norm",
    priority=OPT_IN,
    supports=f"{RMS_NORM}:supports",
    backends=PALLAS_BACKENDS,
)
register(
    "swiglu",
    "pallas",
    f"{SWIGLU}:swiglu",
    priority=5,
    supports=f"{SWIGLU}:supports",
    backends=PALLAS_BACKENDS,
    prefer=f"{SWIGLU}:preferred",
)
register("cross_entropy", "chunked", "titan.ops.providers.chunked:cross_entropy", priority=OPT_IN)
register("cross_entropy", "fused", f"{FUSED_LOSS}:cross_entropy", priority=5)
register("rope", "fused", "titan.ops.providers.fused_rope:rope", priority=5)
