"""Power sources: RAPL parsing and counter wrap on a fake sysfs, the unavailable path, the
sampler thread and per-step energy."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest

from titan.telemetry.events import Step
from titan.telemetry.power import (
    TPU_REASON,
    AmdSmiReader,
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


def test_step_energy_after_a_restart_leaves_the_pause_to_no_step():
    """An evaluation or the pinned host reservation between two steps restarts the step clock,
    and the energy with it: the next step's energy is its own, not the pause's."""
    counter = Counter()
    sampler = PowerSampler(counter)
    sampler.sample()
    steps = StepEnergy(sampler)
    counter.joules = 10.0
    assert steps.step_fields(tokens=500)["energy_j"] == 10.0
    counter.joules = 4010.0  # the pause: 4 kJ
    steps.restart()
    counter.joules = 4012.0
    assert steps.step_fields(tokens=500)["energy_j"] == 2.0


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
    assert isinstance(reader, NvmlReader) and {
        key: info[key] for key in ("source", "available", "reason")
    } == {
        "source": "nvml",
        "available": True,
        "reason": None,
    }
    assert info["method"] == "counter" and info["fallbacks"] == []
    assert [d["index"] for d in info["devices"]] == [0, 1]
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


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


def _nvml(
    power_w: list[float | None],
    energy_mj: list[int | None],
    *,
    uuids: list[str] | None = None,
    power_error: type[Exception] | None = None,
    energy_error: type[Exception] | None = None,
    missing: tuple[str, ...] = (),
) -> types.ModuleType:
    """A stand-in for nvidia-ml-py: one GPU per entry of ``power_w`` (H200s, Hopper), energy
    counters from ``energy_mj`` (changed by the test); None is a reading NVML gives as N/A (all
    bits set, as ``nvidia-smi`` shows "N/A"); ``power_error`` / ``energy_error`` are raised by
    those reads, ``missing`` functions are absent (an old pynvml)."""
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.nvmlInit = lambda: None
    module.nvmlDeviceGetCount = lambda: len(power_w)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    module.nvmlDeviceGetArchitecture = lambda h: 9
    uuids = uuids or [f"GPU-{i:08x}-0000" for i in range(len(power_w))]
    module.nvmlDeviceGetUUID = lambda h: uuids[h]

    def power(h):
        if power_error:
            raise power_error("Not Supported")
        return 2**32 - 1 if power_w[h] is None else int(power_w[h] * 1000)

    def energy(h):
        if energy_error:
            raise energy_error("Not Supported")
        return 2**64 - 1 if energy_mj[h] is None else energy_mj[h]

    module.nvmlDeviceGetPowerUsage = power
    module.nvmlDeviceGetTotalEnergyConsumption = energy
    for name in missing:
        delattr(module, name)
    return module


def _gpus(*ordinals: int, platform: str = "gpu", process_index: int = 0) -> list:
    """JAX-like devices: ids 0.., ``local_hardware_id`` the ordinal among visible devices."""
    return [
        types.SimpleNamespace(
            id=i, platform=platform, local_hardware_id=o, process_index=process_index
        )
        for i, o in enumerate(ordinals)
    ]


@pytest.fixture
def no_visibility(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return monkeypatch


def test_nvml_reads_only_the_runs_devices_under_cuda_visible_devices(no_visibility):
    energy_mj = [0, 0, 0, 0]
    no_visibility.setitem(sys.modules, "pynvml", _nvml([100, 200, 300, 400], energy_mj))
    no_visibility.setenv("CUDA_VISIBLE_DEVICES", "2,3,1")
    reader, info = open_reader(devices=_gpus(0, 1), process_index=0)
    assert info["source"] == "nvml" and info["method"] == "counter"
    assert info["power_reading"] == "average"  # Hopper: nvmlDeviceGetPowerUsage is a 1 s mean
    assert info["devices"] == [
        {"jax_id": 0, "index": 2, "uuid": "GPU-00000002-0000"},
        {"jax_id": 1, "index": 3, "uuid": "GPU-00000003-0000"},
    ]
    energy_mj[:] = [9_000, 9_000, 1_000, 2_000]  # the other GPUs' energy is not the run's
    assert reader.read() == pytest.approx((700.0, 3.0))


def test_nvml_maps_cuda_visible_uuids_and_their_prefixes(no_visibility):
    uuids = ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-cccc-3"]
    energy_mj = [0, 0, 0]
    no_visibility.setitem(sys.modules, "pynvml", _nvml([100, 200, 300], energy_mj, uuids=uuids))
    no_visibility.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc-3,GPU-aa")
    reader, info = open_reader(devices=_gpus(1), process_index=0)
    assert info["devices"] == [{"jax_id": 0, "index": 0, "uuid": "GPU-aaaa-1"}]
    assert reader.read()[0] == pytest.approx(100.0)
    # An unknown UUID ends the visible list, as in CUDA: ordinal 1 is then not visible.
    no_visibility.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc,GPU-ffff")
    with pytest.raises(PowerUnavailable, match="ordinal 1.*1 visible GPUs"):
        NvmlReader(devices=_gpus(1), process_index=0)


def test_nvml_refuses_mig_entries_and_other_kinds_of_device(no_visibility):
    no_visibility.setitem(sys.modules, "pynvml", _nvml([100], [0]))
    no_visibility.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f1c2d3e-aaaa")
    reader, info = open_reader(devices=_gpus(0), process_index=0)
    assert reader is None and "MIG instance (MIG-4f1c2d3e-aaaa)" in info["reason"]
    no_visibility.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(PowerUnavailable, match="the run's devices are cpu"):
        NvmlReader(devices=_gpus(0, platform="cpu"), process_index=0)


def test_only_this_process_devices_are_read(no_visibility):
    no_visibility.setitem(sys.modules, "pynvml", _nvml([100, 200], [0, 0]))
    devices = _gpus(0) + _gpus(0, process_index=1)  # another host's first GPU
    reader = NvmlReader(devices=devices, process_index=0)
    assert [d["index"] for d in reader.devices] == [0]
    assert reader.read()[0] == pytest.approx(100.0)


def test_energy_not_supported_falls_back_to_sampled_power_at_100_ms(no_visibility):
    no_visibility.setitem(
        sys.modules, "pynvml", _nvml([250, 250], [0, 0], energy_error=NVMLError_NotSupported)
    )
    reader, info = open_reader(devices=_gpus(0, 1), process_index=0)
    assert info["method"] == "sampled" and info["power_reading"] == "average"
    assert info["fallbacks"] == ["energy counter: NVMLError_NotSupported: Not Supported"]
    assert reader.read() == (500.0, None)
    now = [0.0]
    sampler = PowerSampler(reader, clock=lambda: now[0])
    assert sampler.ticker.interval_s == 0.1
    sampler.sample()
    steps = StepEnergy(sampler)
    for _ in range(10):
        now[0] += 0.1
        sampler.sample()
    assert steps.step_fields(tokens=1000) == pytest.approx(
        {"energy_j": 500.0, "joules_per_token": 0.5}
    )


def test_a_pynvml_without_the_energy_function_samples_power(no_visibility):
    no_visibility.setitem(
        sys.modules,
        "pynvml",
        _nvml([300], [0], missing=("nvmlDeviceGetTotalEnergyConsumption",)),
    )
    reader, info = open_reader(devices=_gpus(0), process_index=0)
    assert info["method"] == "sampled"
    assert "nvmlDeviceGetTotalEnergyConsumption" in info["fallbacks"][0]
    assert "not in this library version" in info["fallbacks"][0]
    assert PowerSampler(reader).ticker.interval_s == 0.1


def test_power_always_na_keeps_the_working_counter(no_visibility):
    energy_mj = [5_000]
    no_visibility.setitem(
        sys.modules, "pynvml", _nvml([0], energy_mj, power_error=NVMLError_NotSupported)
    )
    reader, info = open_reader(devices=_gpus(0), process_index=0)
    assert info["method"] == "counter" and info["power_reading"] is None
    assert info["fallbacks"] == ["power reading: NVMLError_NotSupported: Not Supported"]
    sampler = PowerSampler(reader)
    assert sampler.ticker.interval_s == 1.0
    sampler.sample()
    steps = StepEnergy(sampler)
    energy_mj[0] += 42_000
    assert steps.step_fields(tokens=42) == {"energy_j": 42.0, "joules_per_token": 1.0}


def test_neither_counter_nor_power_is_unavailable_with_both_reasons(no_visibility):
    no_visibility.setitem(
        sys.modules,
        "pynvml",
        _nvml([0], [0], power_error=NVMLError, energy_error=NVMLError_NotSupported),
    )
    reader, info = open_reader((NvmlReader,), devices=_gpus(0), process_index=0)
    assert reader is None and info["available"] is False
    assert "energy counter: NVMLError_NotSupported" in info["reason"]
    assert "power reading: NVMLError" in info["reason"]


def test_power_and_energy_always_na_record_power_unavailable_with_the_reasons(no_visibility):
    """NVML answers, but both readings are its "not available" value on every call: no source,
    and the reason names both (then AMD and RAPL are tried, as for any unavailable source)."""
    no_visibility.setitem(sys.modules, "pynvml", _nvml([None, None], [None, None]))
    no_visibility.setitem(sys.modules, "amdsmi", None)
    reader, info = open_reader(devices=_gpus(0, 1), process_index=0)
    assert reader is None
    assert (info["source"], info["available"], info["method"]) == (None, False, None)
    nvml_reason = info["reason"].split("; amdsmi")[0]
    assert nvml_reason == (
        "nvml: power reading: N/A; "
        "energy counter: PowerUnavailable: total energy consumption is N/A"
    )
    assert "RAPL reads CPU packages" in info["reason"]


def test_energy_always_na_samples_the_power_and_says_why(no_visibility):
    no_visibility.setitem(sys.modules, "pynvml", _nvml([250, 250], [None, 7]))
    reader, info = open_reader(devices=_gpus(0, 1), process_index=0)
    assert (info["source"], info["method"], info["power_reading"]) == ("nvml", "sampled", "average")
    assert info["fallbacks"] == [
        "energy counter: PowerUnavailable: total energy consumption is N/A"
    ]
    assert reader.read() == (500.0, None)


def test_an_na_reading_mid_run_is_skipped_not_counted(no_visibility):
    energy_mj = [1_000]
    power_w: list[float | None] = [300]
    no_visibility.setitem(sys.modules, "pynvml", _nvml(power_w, energy_mj))
    reader, info = open_reader(devices=_gpus(0), process_index=0)
    assert info["method"] == "counter"
    energy_mj[0], power_w[0] = None, None
    assert reader.read() == (None, None)  # this reading only: no 2**64 mJ jump
    energy_mj[0], power_w[0] = 4_000, 300
    assert reader.read() == (300.0, 3.0)


def test_a_64_bit_counter_going_back_drops_the_interval_never_negative(no_visibility):
    energy_mj = [10_000]
    no_visibility.setitem(sys.modules, "pynvml", _nvml([100], energy_mj))
    reader = NvmlReader(devices=_gpus(0), process_index=0)
    energy_mj[0] = 12_000
    assert reader.read()[1] == pytest.approx(2.0)
    energy_mj[0] = 500  # a driver reload: range unknown
    assert reader.read()[1] == pytest.approx(2.0) and reader.dropped_intervals == 1
    energy_mj[0] = 1_500
    assert reader.read()[1] == pytest.approx(3.0) and reader.counter_wraps == 0


class AmdSmiException(Exception):
    pass


def _amdsmi(
    infos: list[dict], counts: list[dict], uuids: list[str] | None = None
) -> types.ModuleType:
    """A stand-in for amdsmi: one GPU per power-info dict; values may be the string "N/A"."""
    module = types.ModuleType("amdsmi")
    module.AmdSmiException = AmdSmiException
    module.amdsmi_init = lambda: None
    module.amdsmi_get_processor_handles = lambda: list(range(len(infos)))
    module.amdsmi_get_power_info = lambda h: dict(infos[h])
    module.amdsmi_get_energy_count = lambda h: dict(counts[h])
    uuids = uuids or [f"{i:02d}ff74a1-0000-1000-80ab-a5a9d1f3d6bf" for i in range(len(infos))]
    module.amdsmi_get_gpu_device_uuid = lambda h: uuids[h]
    return module


def _count(accumulator: int) -> dict:
    return {"energy_accumulator": accumulator, "counter_resolution": 15.259, "timestamp": 0}


def test_amdsmi_mi200_uses_average_power_when_current_is_na(no_visibility):
    infos = [{"current_socket_power": "N/A", "average_socket_power": 300}] * 2
    counts = [_count(0), _count(0)]
    no_visibility.setitem(sys.modules, "amdsmi", _amdsmi(infos, counts))
    no_visibility.setitem(sys.modules, "pynvml", None)  # not installed
    reader, info = open_reader(devices=_gpus(0, 1), process_index=0)
    assert info["source"] == "amdsmi" and info["power_reading"] == "average"
    assert info["method"] == "counter" and info["fallbacks"] == []
    assert reader.read() == (600.0, 0.0)
    infos[0] = {"current_socket_power": 50, "average_socket_power": "N/A"}
    assert reader.read()[0] is None  # one device N/A this time: no partial sum


def test_amdsmi_with_no_power_reading_says_so_and_keeps_the_counter(no_visibility):
    infos = [{"current_socket_power": "N/A", "average_socket_power": "N/A"}]
    counts = [_count(1000)]
    no_visibility.setitem(sys.modules, "amdsmi", _amdsmi(infos, counts))
    reader = AmdSmiReader(devices=_gpus(0), process_index=0)
    assert reader.power_reading is None and reader.method == "counter"
    assert reader.fallbacks == ["power reading: current and average socket power are N/A"]
    counts[0] = _count(2000)
    assert reader.read() == pytest.approx((None, 1000 * 15.259e-6))


def test_amdsmi_32_bit_wrap_adds_the_counter_range(no_visibility):
    counts = [_count(2**32 - 1000)]
    infos = [{"current_socket_power": 500, "average_socket_power": 480}]
    no_visibility.setitem(sys.modules, "amdsmi", _amdsmi(infos, counts))
    reader = AmdSmiReader(devices=_gpus(0), process_index=0)
    assert reader.power_reading == "instant"
    counts[0] = _count(500)  # passed 2**32: 1500 units, not -65,536 J
    power_w, energy_j = reader.read()
    assert power_w == 500.0 and energy_j == pytest.approx(1500 * 15.259e-6)
    assert reader.counter_wraps == 1 and reader.dropped_intervals == 0


def test_amdsmi_maps_rocr_then_hip_visible_devices(no_visibility):
    infos = [{"current_socket_power": 100 * (i + 1), "average_socket_power": 0} for i in range(4)]
    counts = [_count(0)] * 4
    no_visibility.setitem(sys.modules, "amdsmi", _amdsmi(infos, counts))
    no_visibility.setenv("ROCR_VISIBLE_DEVICES", "1,3")
    no_visibility.setenv("HIP_VISIBLE_DEVICES", "1")
    reader = AmdSmiReader(devices=_gpus(0), process_index=0)
    assert [d["index"] for d in reader.devices] == [3]
    assert reader.read()[0] == 400.0


class StuckCounter:
    """A counter stuck at 10 J with ``power_w`` of power (None: no power reading)."""

    source = "stuck"
    method = "counter"

    def __init__(self, power_w: float | None) -> None:
        self.power_w = power_w
        self.joules = 10.0

    def read(self):
        return self.power_w, self.joules


def test_a_frozen_counter_warns_once_and_switches_to_sampled_power(capsys):
    now = [0.0]
    reader = StuckCounter(power_w=200.0)
    sampler = PowerSampler(reader, clock=lambda: now[0])
    reader.joules = 0.0
    sampler.sample()
    reader.joules = 10.0  # moves at t=1, then freezes
    now[0] = 1.0
    sampler.sample()
    steps = StepEnergy(sampler)
    for t in range(2, 6):
        now[0] = float(t)
        sampler.sample()
    assert sampler.method == "counter"  # 4 s without movement: not yet
    now[0] = 6.5
    fields = steps.step_fields(tokens=100)  # the step end sees 5.5 s at 200 W without movement
    assert sampler.method == "sampled" and sampler.ticker.interval_s == 0.1
    assert fields["power_switch"]["method"] == "sampled"
    assert "frozen at 10.000 J for 5.5 s" in fields["power_switch"]["reason"]
    assert fields["energy_j"] == pytest.approx(200.0 * 5.5)  # from the last movement, not 0 J
    now[0] = 7.0
    sampler.sample()
    later = steps.step_fields(tokens=100)
    assert later == pytest.approx({"energy_j": 100.0, "joules_per_token": 1.0})
    assert capsys.readouterr().err.count("energy counter frozen") == 1


def test_a_frozen_counter_without_power_is_found_by_steps_and_gives_none():
    now = [0.0]
    sampler = PowerSampler(StuckCounter(power_w=None), clock=lambda: now[0])
    sampler.sample()
    steps = StepEnergy(sampler)
    now[0] = 2.0
    assert steps.step_fields(tokens=10) == {"energy_j": 0.0, "joules_per_token": 0.0}
    now[0] = 6.0  # two steps in 6 s: not enough steps to call it frozen
    assert steps.step_fields(tokens=10)["energy_j"] == 0.0
    now[0] = 7.0
    fields = steps.step_fields(tokens=10)  # the third step without movement
    assert fields["energy_j"] is None and "no power reading" in fields["power_switch"]["reason"]
    assert steps.step_fields(tokens=10) == {"energy_j": None, "joules_per_token": None}


def test_not_installed_names_the_extra(no_visibility):
    no_visibility.setitem(sys.modules, "pynvml", None)
    no_visibility.setitem(sys.modules, "amdsmi", None)
    reader, info = open_reader(devices=_gpus(0), process_index=0)
    assert reader is None
    assert (
        "nvidia-ml-py (pynvml) is not installed (pip install 'titan-jax[power]')" in info["reason"]
    )
    assert "amdsmi is not installed (pip install 'titan-jax[power]')" in info["reason"]
    assert "RAPL reads CPU packages" in info["reason"]


def test_a_power_switch_is_a_step_event_field():
    event = Step(step=3, energy_j=1.0, power_switch={"method": "sampled", "reason": "frozen"})
    assert event.to_json()["power_switch"] == {"method": "sampled", "reason": "frozen"}
    assert "power_switch" not in Step(step=4).to_json()


def _field_reply(status: int, milliwatts: int) -> list:
    return [types.SimpleNamespace(nvmlReturn=status, value=types.SimpleNamespace(uiVal=milliwatts))]


def test_nvml_reads_instant_power_where_the_driver_has_the_field(no_visibility):
    module = _nvml([250], [0])  # the 1 s average says 250 W
    module.NVML_FI_DEV_POWER_INSTANT = 186
    replies = {186: _field_reply(0, 410_000)}
    module.nvmlDeviceGetFieldValues = lambda h, fields: replies[fields[0]]
    no_visibility.setitem(sys.modules, "pynvml", module)
    reader = NvmlReader(devices=_gpus(0), process_index=0)
    assert reader.power_reading == "instant" and reader.read()[0] == pytest.approx(410.0)
    replies[186] = _field_reply(3, 0)  # NVML_ERROR_NOT_SUPPORTED: the average is read instead
    reader = NvmlReader(devices=_gpus(0), process_index=0)
    assert reader.power_reading == "average" and reader.read()[0] == pytest.approx(250.0)


def test_a_reader_that_breaks_unexpectedly_is_a_reason_not_a_crash(no_visibility):
    def broken(**_):
        raise KeyError("driver returned garbage")

    no_visibility.setitem(sys.modules, "pynvml", _nvml([100, 200], [0, 0]))
    reader, info = open_reader((broken, NvmlReader), devices=_gpus(1), process_index=0)
    assert isinstance(reader, NvmlReader) and info["devices"][0]["index"] == 1
    assert info["reason"] is None
    reader, info = open_reader((broken,), devices=_gpus(0), process_index=0)
    assert reader is None and info["reason"] == "broken: KeyError: 'driver returned garbage'"


def test_mixed_gpu_models_need_pci_bus_order(no_visibility):
    module = _nvml([100, 200], [0, 0])
    module.nvmlDeviceGetName = lambda h: ["NVIDIA H200", "NVIDIA L4"][h]
    no_visibility.setitem(sys.modules, "pynvml", module)
    with pytest.raises(PowerUnavailable, match="^GPUs of 2 models and CUDA_DEVICE_ORDER"):
        NvmlReader(devices=_gpus(0), process_index=0)
    no_visibility.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert NvmlReader(devices=_gpus(1), process_index=0).read()[0] == pytest.approx(200.0)


def test_a_tpu_run_reads_no_power_and_says_why():
    def working(**_: object) -> FakeReader:  # a source that would read, were it asked
        return FakeReader()

    reader, info = open_reader((working,), devices=_gpus(0, 1, platform="tpu"), process_index=0)
    assert reader is None and info["available"] is False and info["source"] is None
    assert info["reason"] == TPU_REASON and TPU_REASON.startswith("not available on TPU: ")
    assert StepEnergy(PowerSampler(reader)).step_fields(100)["energy_j"] is None
    # the same source on GPUs is read
    reader, info = open_reader((working,), devices=_gpus(0, 1), process_index=0)
    assert reader is not None and info["available"] is True
