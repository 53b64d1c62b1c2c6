"""Environment capture for ``run_start``: versions, devices, host, git commit and dirty flag,
accelerator driver and runtime versions, and the environment variables that change how XLA, JAX,
the collectives and the devices run.

Which variables are recorded is an allow list, never a guess about what looks secret: a run
record is shared (reports, the performance database), and an environment holds credentials under
any name (``JAX_PASSWD``, ``CUDA_CREDENTIALS``, ``JAX_GCS_PRIVATE_CERT`` were recorded by the deny
list this replaced). A variable is recorded when:

- its name is in :data:`ENV_NAMES`, exact names whose meaning is known:

  - XLA and JAX: ``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``, and the ``JAX_*`` variables that set a
    JAX configuration option changing what is compiled or how it runs (:data:`JAX_OPTIONS`: the
    platforms, x64, matmul precision, PRNG, promotion, caches, partitioner, optimization level,
    device visibility, debug checks). Every one names a real option of ``jax.config`` (a test
    checks it against the installed JAX); other ``JAX_*`` names are not recorded.
  - devices: ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER`` and the CUDA runtime switches
    (launch blocking, connections, module loading, JIT cache), ``NVIDIA_TF32_OVERRIDE``,
    ``HIP_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``, ``GPU_DEVICE_ORDINAL`` and the HSA/HIP
    runtime switches, the TPU topology variables.
  - host: ``OMP_NUM_THREADS``, ``TF_CPP_MIN_LOG_LEVEL`` / ``TF_CPP_MAX_VLOG_LEVEL`` /
    ``TF_CPP_VMODULE`` (XLA's logging), ``LD_LIBRARY_PATH`` and ``ROCM_PATH`` (which runtime
    libraries load).

- or it starts with one of :data:`ENV_PREFIXES`, narrow namespaces owned by one library whose
  variables are all tuning switches and that grow with every release, so that an exact list would
  go stale: ``NCCL_*``, ``RCCL_*`` (the collectives) and ``XLA_PYTHON_CLIENT_*`` (the allocator).
  Anyone can still put a credential under such a prefix, so a prefixed name that contains one of
  :data:`CREDENTIAL_WORDS` is refused (a second guard on the families only; exact names were
  vetted one by one).

Everything else (``HF_TOKEN``, ``AWS_*``, ``CUDA_CREDENTIALS``, unknown ``JAX_*``, ``XLA_*``
other than the above) is left out.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "sentencepiece")
# JAX configuration options (``jax.config``) that change what is compiled or how it runs, as
# environment variables (the option name upper-cased).
JAX_OPTIONS = frozenset(
    {
        "JAX_PLATFORMS",
        "JAX_PLATFORM_NAME",
        "JAX_ENABLE_X64",
        "JAX_DEFAULT_MATMUL_PRECISION",
        "JAX_DEFAULT_PRNG_IMPL",
        "JAX_ENABLE_CUSTOM_PRNG",
        "JAX_LEGACY_PRNG_KEY",
        "JAX_THREEFRY_PARTITIONABLE",
        "JAX_RANDOM_SEED_OFFSET",
        "JAX_NUMPY_RANK_PROMOTION",
        "JAX_NUMPY_DTYPE_PROMOTION",
        "JAX_SOFTMAX_CUSTOM_JVP",
        "JAX_DISABLE_JIT",
        "JAX_DEBUG_NANS",
        "JAX_DEBUG_INFS",
        "JAX_ENABLE_CHECKS",
        "JAX_ENABLE_COMPILATION_CACHE",
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
        "JAX_USE_SHARDY_PARTITIONER",
        "JAX_OPTIMIZATION_LEVEL",
        "JAX_MEMORY_FITTING_LEVEL",
        "JAX_DISABLE_MOST_OPTIMIZATIONS",
        "JAX_ENABLE_PGLE",
        "JAX_PGLE_PROFILING_RUNS",
        "JAX_CUDA_VISIBLE_DEVICES",
        "JAX_ROCM_VISIBLE_DEVICES",
        "JAX_NUM_CPU_DEVICES",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION",
        "JAX_CPU_ENABLE_ASYNC_DISPATCH",
        "JAX_PALLAS_USE_MOSAIC_GPU",
        "JAX_TRANSFER_GUARD",
    }
)
ENV_NAMES = JAX_OPTIONS | frozenset(
    {
        "XLA_FLAGS",
        "LIBTPU_INIT_ARGS",
        "TPU_VISIBLE_CHIPS",
        "TPU_PROCESS_BOUNDS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_MODULE_LOADING",
        "CUDA_CACHE_DISABLE",
        "CUDA_CACHE_MAXSIZE",
        "CUDA_FORCE_PTX_JIT",
        "CUDA_DISABLE_PTX_JIT",
        "NVIDIA_TF32_OVERRIDE",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "HIP_LAUNCH_BLOCKING",
        "AMD_SERIALIZE_KERNEL",
        "GPU_MAX_HW_QUEUES",
        "HSA_OVERRIDE_GFX_VERSION",
        "HSA_ENABLE_SDMA",
        "HSA_FORCE_FINE_GRAIN_PCIE",
        "HSA_NO_SCRATCH_RECLAIM",
        "OMP_NUM_THREADS",
        "TF_CPP_MIN_LOG_LEVEL",
        "TF_CPP_MAX_VLOG_LEVEL",
        "TF_CPP_VMODULE",
        "LD_LIBRARY_PATH",
        "ROCM_PATH",
    }
)
ENV_PREFIXES = ("NCCL_", "RCCL_", "XLA_PYTHON_CLIENT_")
CREDENTIAL_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CERT", "AUTH")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _run(args: list[str], cwd: Path | None = None) -> str | None:
    """stdout of a command, stripped; None when it is missing, fails or prints nothing."""
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_commit(source: Path | None = None) -> str | None:
    """Commit of the Titan checkout the code runs from (None outside a git checkout)."""
    return _run(["git", "rev-parse", "HEAD"], source or Path(__file__).resolve().parent)


def git_dirty(source: Path | None = None) -> bool | None:
    """Whether the checkout has uncommitted changes to tracked files (None outside git)."""
    cwd = source or Path(__file__).resolve().parent
    if git_commit(cwd) is None:
        return None
    return _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd) is not None


def recorded_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) on the allow list (see the module
    doc): a name of :data:`ENV_NAMES`, or one starting with :data:`ENV_PREFIXES` that contains
    none of :data:`CREDENTIAL_WORDS`; sorted by name."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in sorted(environ.items()) if _allowed(name)}


def _allowed(name: str) -> bool:
    if name in ENV_NAMES:
        return True
    return name.startswith(ENV_PREFIXES) and not any(word in name for word in CREDENTIAL_WORDS)


def accelerator_versions() -> dict[str, Any]:
    """NVIDIA driver and the CUDA version it supports (``nvidia-smi``), ROCm version
    (``/opt/rocm``), each None when not readable here, and the installed JAX GPU plugins
    (``jax-cuda*`` / ``jax-rocm*`` packages, which bring the CUDA or ROCm runtime)."""
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    banner = _run(["nvidia-smi"]) or ""
    cuda = banner.split("CUDA Version:")[1].split()[0] if "CUDA Version:" in banner else None
    rocm_file = Path("/opt/rocm/.info/version")
    rocm = rocm_file.read_text().strip() if rocm_file.is_file() else None
    return {
        "nvidia_driver": smi.splitlines()[0] if smi else None,
        "cuda": cuda,
        "rocm": rocm,
        "jax_plugins": {
            dist.metadata["Name"]: dist.version
            for dist in metadata.distributions()
            if dist.metadata["Name"].startswith(("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm"))
        },
    }


def capture_environment() -> dict[str, Any]:
    """Python and package versions, backend, device kinds and counts, host, working directory
    (``cwd``: where a resume reads the run's relative paths from), git commit and dirty flag,
    driver and runtime versions, recorded environment variables (and ``xla_flags``)."""
    import jax

    devices = jax.devices()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "backend": jax.default_backend(),
        "device_kinds": sorted({d.device_kind for d in devices}),
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "accelerator": accelerator_versions(),
        "env_vars": recorded_env_vars(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
