"""Environment capture for ``run_start``: versions, devices, host, git commit and dirty flag,
accelerator driver and runtime versions, and the environment variables that change how XLA and
the collectives run (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`); a variable whose name contains
one of :data:`SECRET_MARKERS` is never recorded."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "sentencepiece")
ENV_PREFIXES = ("XLA_", "NCCL_", "RCCL_", "JAX_", "TF_CPP_", "CUDA_", "ROCM_", "HIP_", "HSA_")
ENV_NAMES = frozenset({"LIBTPU_INIT_ARGS", "OMP_NUM_THREADS", "LD_LIBRARY_PATH"})
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


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


def recorded_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of :data:`ENV_PREFIXES` / :data:`ENV_NAMES`, without any whose name
    contains a :data:`SECRET_MARKERS` word."""
    environ = os.environ if environ is None else environ
    return {
        name: value
        for name, value in sorted(environ.items())
        if (name.startswith(ENV_PREFIXES) or name in ENV_NAMES)
        and not any(marker in name.upper() for marker in SECRET_MARKERS)
    }


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
    """Python and package versions, backend, device kinds and counts, host, git commit and dirty
    flag, driver and runtime versions, recorded environment variables (and ``xla_flags``)."""
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
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "accelerator": accelerator_versions(),
        "env_vars": recorded_env_vars(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
