"""Power sources: RAPL parsing and counter wrap on a fake sysfs, the unavailable path, the
sampler thread and per-step energy."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest

from titan.observability.power import (
    NvmlReader,
    PowerSampler,
    PowerUnavailable,
    RaplReader,
    StepEnergy,
    open_reader,
)


def _zone(root: Path, name: str, energy_uj: int, max_uj: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_sums_packages_unwraps_the_counter_and_skips_subzones(tmp_path):
    package0 = _zone(tmp_path, "intel-rapl:0", 900_000, 1_000_000)
    package1 = _zone(tmp_path, "intel-rapl:1", 10_000, 1_000_000)
    core = _zone(tmp_path, "intel-rapl:0:0", 5, 1_000_000)
    reader = RaplReader(tmp_path)
    assert [z.name for z in reader.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert reader.read() == (None, 0.0)
    (package0 / "energy_uj").write_text("50000\n")  # wrapped: 100000 + 50000 uJ
    (package1 / "energy_uj").write_text("30000\n")  # 20000 uJ
    (core / "energy_uj").write_text("999999\n")
    power_w, energy_j = reader.read()
    assert power_w is None and energy_j == pytest.approx(0.17)


def test_rapl_without_zones_or_unreadable_is_unavailable(tmp_path):
    with pytest.raises(PowerUnavailable, match="no RAPL package zone"):
        RaplReader(tmp_path)
    (tmp_path / "intel-rapl:0").mkdir()
    with pytest.raises(PowerUnavailable, match="RAPL unreadable"):
        RaplReader(tmp_path)


def test_no_source_here_records_why_and_gives_null_energy():
    # The CPU test machines have neither pynvml, amdsmi nor a readable RAPL.
    reader, info = open_reader()
    assert reader is None
    assert info["available"] is False and info["source"] is None
    assert "pynvml" in info["reason"] and "amdsmi" in info["reason"] and "RAPL" in info["reason"]
    sampler = PowerSampler(reader)
    sampler.start()
    sampler.stop()
    assert StepEnergy(sampler).step_fields(100) == {"energy_j": None, "joules_per_token": None}


class FakeReader:
    """Constant 100 W, no energy counter; fails on the second read."""

    source = "fake"

    def __init__(self) -> None:
        self.reads = 0
        self.read_twice = threading.Event()

    def read(self):
        self.reads += 1
        if self.reads == 2:
            self.read_twice.set()
            raise OSError("sensor went away")
        return 100.0, None


def test_sampler_thread_integrates_power_survives_errors_and_stops():
    reader = FakeReader()
    sampler = PowerSampler(reader, interval_s=0.01)
    sampler.start()
    assert reader.read_twice.wait(timeout=10)
    sampler.stop()
    assert not sampler.ticker.thread.is_alive()
    assert sampler.errors == 1 and "sensor went away" in sampler.last_error
    reads = reader.reads
    assert sampler.samples == reads - 1 >= 1
    assert sampler.energy_j() >= 0.0


class Counter:
    """An energy counter the test advances; ``power_only`` hides it (power readings only)."""

    source = "counter"

    def __init__(self, power_only: bool = False) -> None:
        self.joules = 0.0
        self.power_only = power_only

    def read(self):
        return 300.0, None if self.power_only else self.joules


def test_step_energy_reads_the_counter_at_each_step_end():
    counter = Counter()
    sampler = PowerSampler(counter)
    sampler.sample()
    steps = StepEnergy(sampler)
    counter.joules = 12.5  # no background sample since: the step end reads the counter itself
    assert steps.step_fields(tokens=500) == {"energy_j": 12.5, "joules_per_token": 0.025}
    counter.joules = 13.0
    assert steps.step_fields(tokens=500) == {"energy_j": 0.5, "joules_per_token": 0.001}
    assert steps.step_fields(tokens=500) == {"energy_j": 0.0, "joules_per_token": 0.0}


def test_step_energy_without_a_counter_takes_the_sampled_integral():
    sampler = PowerSampler(Counter(power_only=True))
    sampler.sample()
    steps = StepEnergy(sampler)
    assert steps.step_fields(tokens=100) == {"energy_j": 0.0, "joules_per_token": 0.0}
    time.sleep(0.05)
    sampler.sample()  # 300 W over the time between the two samples
    fields = steps.step_fields(tokens=100)
    assert fields["energy_j"] == pytest.approx(300 * 0.05, rel=0.5)
    assert fields["joules_per_token"] == pytest.approx(fields["energy_j"] / 100)


def _fake_pynvml(energy_mj: list[int], count: int = 2, fail: bool = False) -> types.ModuleType:
    """A stand-in for nvidia-ml-py: ``count`` GPUs at 250 W, energy counters from a list."""
    module = types.ModuleType("pynvml")

    def init():
        if fail:
            raise RuntimeError("Driver Not Loaded")

    module.nvmlInit = init
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetPowerUsage = lambda handle: 250_000
    module.nvmlDeviceGetTotalEnergyConsumption = lambda handle: energy_mj[handle]
    return module


def test_nvml_reader_sums_devices_in_watts_and_joules(monkeypatch):
    energy_mj = [1_000_000, 2_000_000]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(energy_mj))
    reader, info = open_reader()
    assert isinstance(reader, NvmlReader) and info == {
        "source": "nvml",
        "available": True,
        "reason": None,
    }
    energy_mj[0] += 1500
    energy_mj[1] += 500
    assert reader.read() == pytest.approx((500.0, 2.0))


def test_nvml_that_fails_to_start_or_sees_no_gpu_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([0], fail=True))
    with pytest.raises(PowerUnavailable, match="Driver Not Loaded"):
        NvmlReader()
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([], count=0))
    with pytest.raises(PowerUnavailable, match="sees no GPU"):
        NvmlReader()
