"""Environment capture for ``run_start``: versions, devices, host, git commit, XLA flags."""

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


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit(source: Path | None = None) -> str | None:
    """Commit of the Titan checkout the code runs from (None outside a git checkout)."""
    source = source or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def capture_environment() -> dict[str, Any]:
    """Python and package versions, backend, device kinds and counts, host, git, XLA_FLAGS."""
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
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
