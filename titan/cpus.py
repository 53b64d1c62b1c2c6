"""How many CPUs this process may use: what sizes the tokenizer's workers and threads and
``titan launch``'s process limit."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU bandwidth limit of this process's group (``<quota> <period>`` in
microseconds, or ``max <period>``): a container's ``--cpus`` (Linux kernel documentation,
Documentation/admin-guide/cgroup-v2.rst, "cpu.max")."""


def _cgroup_cpus() -> int | None:
    """CPUs the cgroup's bandwidth limit allows (its quota over its period, rounded up), or None
    when there is no limit or no cgroup v2 file."""
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        return max(1, math.ceil(int(quota) / int(period))) if quota != "max" else None
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (``taskset``, SLURM's binding) where the
    OS has one, else the CPU count, capped by a container's CPU limit (:func:`_cgroup_cpus`)."""
    if hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    limit = _cgroup_cpus()
    return min(cpus, limit) if limit else cpus
