"""Which accelerator a backend name stands for, and the Pallas settings that follow from it.

``jax.default_backend()`` says ``gpu`` for both CUDA and ROCm; the PJRT client's
``platform_version`` tells them apart (it names ``cuda`` or ``rocm``). A TPU is ``tpu``, served by
Pallas's Mosaic kernels (:mod:`titan.ops.providers.splash_attention`), never by the Triton ones.
Nothing here imports JAX at module import time.
"""

from __future__ import annotations

import functools
from typing import Any

from titan.ops.registry import Unsupported

CUDA, ROCM, TPU = "cuda", "rocm", "tpu"
PALLAS_BACKENDS = ("cpu", "gpu", "cuda", "rocm")


@functools.cache
def _gpu_vendor() -> str:
    import jax

    version = jax.devices("gpu")[0].client.platform_version.lower()
    return ROCM if ROCM in version else CUDA


def accelerator(backend: str) -> str:
    """``cuda`` or ``rocm`` for a GPU backend name (``gpu``, ``cuda``, ``rocm``), else the name
    (``tpu``, ``cpu``)."""
    if backend == "gpu":
        return _gpu_vendor()
    return backend


@functools.cache
def cuda_capability() -> tuple[int, int]:
    """Compute capability (major, minor) of the first CUDA device, e.g. (9, 0) on H100/H200."""
    import jax

    major, minor = jax.devices("gpu")[0].compute_capability.split(".")
    return int(major), int(minor)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def pallas_runs_on(backend: str) -> bool | Unsupported:
    """True where the Pallas kernels run (interpreted on CPU, Triton on CUDA/ROCm), else an
    :class:`~titan.ops.registry.Unsupported` saying so (the shared first step of their
    capability checks)."""
    if backend not in PALLAS_BACKENDS or accelerator(backend) not in ("cpu", CUDA, ROCM):
        return Unsupported(f"runs on cpu (interpreted) or a CUDA/ROCm GPU, not {backend}")
    return True


def pallas_interpret(backend: str) -> bool:
    """Whether the Triton kernels run interpreted (``interpret=True``): on CPU only. Elsewhere
    they compile (a TPU, where they cannot, is refused by :func:`pallas_runs_on` first), so a
    check on an accelerator never times the interpreter."""
    return backend == "cpu"


def pallas_compiler_params(interpret: bool, num_warps: int, num_stages: int) -> Any:
    """Triton compiler parameters for a GPU launch; None when interpreting. The Triton module is
    imported only here, so CPU-only installations never touch it."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def fused_swiglu_by_default(accelerator_name: str) -> bool:
    """Whether the registry serves SwiGLU with the fused Pallas kernel unasked on
    ``accelerator_name`` (``cuda``, ``rocm`` or ``cpu``, as :func:`accelerator` names them): on
    CUDA, where it measured faster (``bench/results/ops-nvidia-h200-swiglu.json``); on ROCm it
    is unmeasured and interpreted on CPU slow, so it is opt-in there. The planner and
    ``--remat auto`` price what this chooses."""
    return accelerator_name == CUDA
