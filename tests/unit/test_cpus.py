"""The CPUs a process may use: its affinity mask, capped by a container's cgroup CPU limit."""

from __future__ import annotations

import os

import pytest

from titan import cpus


@pytest.mark.parametrize(
    "cpu_max, cap", [("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)]
)
def test_usable_cpus_are_the_affinity_mask_capped_by_the_cgroup_limit(
    cpu_max, cap, tmp_path, monkeypatch
):
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(cpus, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    affinity = len(os.sched_getaffinity(0))
    assert cpus.usable_cpus() == (min(affinity, cap) if cap else affinity)


def test_usable_cpus_follow_the_affinity_mask(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "CGROUP_CPU_MAX", tmp_path / "absent")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cpus.usable_cpus() == 1
