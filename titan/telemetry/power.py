"""Power and energy of the devices a run uses: ``power`` in ``run_start``, ``energy_j`` and
``joules_per_token`` in ``step`` events.

Sources, tried in order (each imported lazily; a missing library, unreadable file or devices of
another kind mean the next one is tried):

- ``nvml``: NVIDIA through nvidia-ml-py (``pynvml``): ``nvmlDeviceGetTotalEnergyConsumption``
  (mJ since the driver loaded) and ``nvmlDeviceGetPowerUsage`` (mW); a reading equal to NVML's
  "not available" value (all bits set: ``NVML_VALUE_NOT_AVAILABLE_*``) is N/A, not a number.
- ``amdsmi``: AMD through ``amdsmi``: ``amdsmi_get_energy_count`` (accumulator x counter
  resolution, µJ) and ``amdsmi_get_power_info`` (W).
- ``rapl``: CPU package energy through Linux RAPL, ``<root>/intel-rapl:N/energy_uj`` (µJ),
  wrapping at ``max_energy_range_uj``; sub-zones (``intel-rapl:N:M``) are inside their package
  and are not added. Used when the run's devices are CPUs.

Only the run's devices are read: :func:`open_reader` takes the JAX devices of the layout, keeps
this process's, and maps each to the library's handle through its ordinal among the visible
devices (``local_hardware_id``) and ``CUDA_VISIBLE_DEVICES`` (NVIDIA) or
``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES`` (AMD), whose entries are indices or
``GPU-`` UUIDs; a MIG entry is refused with its reason.

Method (``run_start.power.method``): the energy counter first (``counter``), read at each step's
end. Where a device has none (the function is missing from the library, the driver answers
NotSupported, or the reading is N/A), power is sampled every 100 ms and integrated over each step
(``sampled``, ``power_reading`` says whether the driver's reading is ``instant`` or an
``average``). The counter and the power reading are probed separately: a power reading that is
always N/A leaves a working counter in use. A counter reading below the previous one is a wrap
when its range is known (amdsmi's 32-bit accumulator: add 2**32 units), otherwise that interval
is dropped (counted in ``dropped_intervals``): energy is never negative. A counter that stops
moving while the devices are busy is frozen: :class:`PowerSampler` warns once and switches to
sampled power; the step after the switch carries ``power_switch``.

With no source, ``power`` is ``{"source": None, "available": False, "reason": ...}`` and the
step fields are None. On TPUs no source is tried: the reason is :data:`TPU_REASON`.
:class:`PowerSampler` reads the source in a background thread, every 1 s with a counter and
every 100 ms without. A failing read is counted (``errors``) and skipped, never raised.
"""

from __future__ import annotations

import abc
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from titan.telemetry.interval_thread import Ticker

RAPL_ROOT = Path("/sys/class/powercap")


class PowerUnavailable(Exception):
    """A source cannot be read here (the message says why)."""


class RaplReader:
    """Cumulative CPU package energy from Linux RAPL under ``root``, unwrapped across counter
    wraps (a reading lower than the previous one means the counter passed
    ``max_energy_range_uj``).

    Raises:
        PowerUnavailable: no readable package zone under ``root``.
    """

    source = "rapl"

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)
        if not self.zones:
            raise PowerUnavailable(f"no RAPL package zone under {root}")
        try:
            self._ranges = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]
            self._last = [self._raw(z) for z in self.zones]
        except (OSError, ValueError) as err:
            raise PowerUnavailable(f"RAPL unreadable: {err}") from None
        self._total_uj = 0
        self.method = "counter"
        self.power_reading = None

    def info(self) -> dict[str, Any]:
        """The reader's part of ``run_start.power``: the zones read."""
        return {
            "method": self.method,
            "power_reading": None,
            "devices": [zone.name for zone in self.zones],
            "fallbacks": [],
        }

    @staticmethod
    def _raw(zone: Path) -> int:
        return int((zone / "energy_uj").read_text())

    def read(self) -> tuple[float | None, float | None]:
        """(power W: None, energy J since this reader started)."""
        for i, zone in enumerate(self.zones):
            raw = self._raw(zone)
            delta = raw - self._last[i]
            if delta < 0:
                delta += self._ranges[i]
            self._total_uj += delta
            self._last[i] = raw
        return None, self._total_uj * 1e-6


INSTALL = "pip install 'titan-jax[power]'"
NVML_ARCH_AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE: from it (but GA100) power usage is a 1 s mean
GA100_NAMES = ("A100", "A30")
NVML_NA_UINT = 2**32 - 1  # NVML_VALUE_NOT_AVAILABLE_uint (nvml.h): an N/A power reading, mW
NVML_NA_ULONGLONG = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong: an N/A energy reading, mJ
AMDSMI_COUNTER_BITS = 32  # amdsmi's accumulator wraps at 2**32 x counter_resolution on MI200/MI300


class GpuCounter:
    """One device's energy counter, unwrapped: a reading below the previous one is a wrap when
    the counter's range is known (the previous reading fitted in ``bits`` bits: add
    2**bits units), else the interval is dropped and counted (``dropped``). Never negative.

    Args:
        raw: the first reading, counter units.
        joules_per_unit: the counter's resolution, joules.
        bits: the counter's width, None when unknown (NVML's 64-bit millijoules).
    """

    def __init__(self, raw: float, joules_per_unit: float, bits: int | None) -> None:
        self.last = raw
        self.joules_per_unit = joules_per_unit
        self.bits = bits
        self.units = 0.0
        self.wraps = 0
        self.dropped = 0

    def advance(self, raw: float) -> float:
        """Take a reading; returns the energy since the first reading, joules."""
        delta = raw - self.last
        if delta < 0 and self.bits is not None and self.last < 2**self.bits:
            delta += 2**self.bits
            self.wraps += 1
        elif delta < 0:
            delta = 0.0
            self.dropped += 1
        self.units += delta
        self.last = raw
        return self.units * self.joules_per_unit


def _uuid_matches(entry: str, uuid: str | None) -> bool:
    """``entry`` names ``uuid`` (CUDA accepts any unique prefix of ``GPU-<uuid>``)."""
    return uuid is not None and uuid.lower().startswith(entry.lower())


def select_visible(
    variable: str, value: str | None, candidates: list[int], uuids: dict[int, str | None]
) -> list[int]:
    """The host indices visible through ``variable`` (``CUDA_VISIBLE_DEVICES``,
    ``ROCR_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``) of ``value``: each entry an ordinal into
    ``candidates`` or a ``GPU-`` UUID (a unique prefix is enough); as the CUDA runtime does, the
    list ends at the first entry that names no device. Unset: every candidate.

    Raises:
        PowerUnavailable: a MIG entry (NVML reads no power of a MIG slice), or an ambiguous UUID.
    """
    if value is None:
        return list(candidates)
    visible: list[int] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.upper().startswith("MIG-"):
            raise PowerUnavailable(f"{variable} names a MIG instance ({entry}): no power per slice")
        if entry.isdigit() and int(entry) < len(candidates):
            visible.append(candidates[int(entry)])
            continue
        matches = [i for i in candidates if entry and _uuid_matches(entry, uuids.get(i))]
        if len(matches) > 1:
            raise PowerUnavailable(f"{variable} entry {entry} matches {len(matches)} GPUs")
        if not matches:
            break
        visible.append(matches[0])
    return visible


def local_devices(devices: list[Any] | None, process_index: int | None) -> list[Any] | None:
    """The devices of ``devices`` that belong to this process (``process_index``, default
    ``jax.process_index()``): another host's GPUs are read by its own process."""
    if devices is None:
        return None
    if process_index is None:
        import jax  # only when devices are given: the trainer has started JAX already

        process_index = jax.process_index()
    return [d for d in devices if getattr(d, "process_index", 0) == process_index]


class GpuReader(abc.ABC):
    """Power and energy of a run's GPUs through a vendor library; subclasses say how to call it.

    The run's JAX devices are mapped to the library's handles through their ordinal among the
    visible devices (``local_hardware_id``) and the visibility variables; ``devices=None`` reads
    every GPU of the host. Each device's energy counter is probed at open: if it is missing, not
    supported or unreadable on any device, :attr:`method` is ``sampled`` and the reason is in
    :attr:`fallbacks`. Power is read separately, so a power reading that is N/A leaves a working
    counter in use (and a counter that is missing leaves the power readings in use).

    Attributes:
        source: ``nvml`` | ``amdsmi``.
        method: ``counter`` (energy from the devices' counters) | ``sampled`` (integrated power).
        power_reading: ``instant`` | ``average`` (over the driver's window) | None (no reading).
        devices: the devices read: ``jax_id`` (None without devices given), ``index`` (the
            library's host index) and ``uuid``.
        fallbacks: why the counter or the power reading is not used.

    Raises:
        PowerUnavailable: the library is not installed or fails to start, the devices are not
            its GPUs or cannot be mapped, or neither a counter nor a power reading works.
    """

    source = ""
    package = ""
    distribution = ""
    platforms: tuple[str, ...] = ()
    visibility: tuple[str, ...] = ()
    uuid_function = ""  # the library's function giving a device's UUID
    no_power = "N/A"  # the fallback reason when a device has no power reading

    def __init__(self, devices: list[Any] | None = None, process_index: int | None = None):
        devices = local_devices(devices, process_index)
        if devices is not None and (
            not devices or any(d.platform not in self.platforms for d in devices)
        ):
            kinds = sorted({d.platform for d in devices}) or ["none"]
            raise PowerUnavailable(f"{self.source}: the run's devices are {', '.join(kinds)}")
        try:
            self.lib = importlib.import_module(self.package)
        except ImportError:
            raise PowerUnavailable(f"{self.distribution} is not installed ({INSTALL})") from None
        try:
            handles = self._handles()
        except PowerUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 - NVMLError, AmdSmiException, or a broken driver
            raise PowerUnavailable(f"{self.package}: {_describe(err)}") from None
        if not handles:
            raise PowerUnavailable(f"{self.package} sees no GPU")
        uuids = {i: self._uuid(h) for i, h in enumerate(handles)}
        indices = self._indices(devices, list(range(len(handles))), uuids)
        self.handles = [handles[i] for i in indices]
        self.devices = [
            {"jax_id": None if devices is None else d.id, "index": i, "uuid": uuids[i]}
            for d, i in zip(devices or [None] * len(indices), indices, strict=True)
        ]
        self.fallbacks: list[str] = []
        self.power_reading = self._probe_power()
        self.counters = self._probe_counters()
        self.method = "counter" if self.counters is not None else "sampled"
        if self.counters is None and self.power_reading is None:
            raise PowerUnavailable(f"{self.source}: {'; '.join(self.fallbacks)}")

    def _optional_text(self, function: str, handle: Any) -> str | None:
        """``lib.<function>(handle)`` as text; None when the library lacks it or it fails
        (names and UUIDs only help to map devices: a UUID entry then matches nothing)."""
        try:
            return _text(getattr(self.lib, function)(handle))
        except Exception:  # noqa: BLE001 - AttributeError, NVMLError, AmdSmiException
            return None

    def _uuid(self, handle: Any) -> str | None:
        return self._optional_text(self.uuid_function, handle)

    def _indices(
        self, devices: list[Any] | None, host: list[int], uuids: dict[int, str | None]
    ) -> list[int]:
        visible = host
        for variable in self.visibility:
            visible = select_visible(variable, os.environ.get(variable), visible, uuids)
        if devices is None:
            return visible
        indices = []
        for d in devices:
            ordinal = getattr(d, "local_hardware_id", None)
            if ordinal is None or not 0 <= ordinal < len(visible):
                raise PowerUnavailable(
                    f"{self.source}: device {d.id} (ordinal {ordinal}) is not among the "
                    f"{len(visible)} visible GPUs ({', '.join(self.visibility)})"
                )
            indices.append(visible[ordinal])
        return indices

    def _probe_power(self) -> str | None:
        try:
            kind = self._power_kind()
        except Exception as err:  # noqa: BLE001 - a missing function, NVMLError, AmdSmiException
            self.fallbacks.append(f"power reading: {_describe(err)}")
            return None
        if kind is None:
            self.fallbacks.append(f"power reading: {self.no_power}")
        return kind

    def _probe_counters(self) -> list[GpuCounter] | None:
        try:
            counters = [self._counter(h) for h in self.handles]
        except Exception as err:  # noqa: BLE001 - a missing function, NotSupported, N/A
            self.fallbacks.append(f"energy counter: {_describe(err)}")
            return None
        return counters

    def read(self) -> tuple[float | None, float | None]:
        """(power of the devices W, None while any device's reading is N/A; energy J since
        open, from the counters, None without them or when one fails to read)."""
        try:
            readings = [self._power_w(h) for h in self.handles]
            known = [r for r in readings if r is not None]
            power_w = None if len(known) < len(readings) else float(sum(known))
        except Exception:  # noqa: BLE001 - N/A this time: the counter still counts
            power_w = None
        if self.counters is None:
            return power_w, None
        try:
            raws = [self._raw_energy(h) for h in self.handles]
        except Exception:  # noqa: BLE001 - this reading only
            return power_w, None
        return power_w, sum(c.advance(r) for c, r in zip(self.counters, raws, strict=True))

    @property
    def counter_wraps(self) -> int:
        return sum(c.wraps for c in self.counters or [])

    @property
    def dropped_intervals(self) -> int:
        return sum(c.dropped for c in self.counters or [])

    def info(self) -> dict[str, Any]:
        """The reader's part of ``run_start.power``."""
        return {
            "method": self.method,
            "power_reading": self.power_reading,
            "devices": self.devices,
            "fallbacks": self.fallbacks,
        }

    # The library calls, per vendor.
    @abc.abstractmethod
    def _handles(self) -> list[Any]:
        """The handles of the GPUs the library sees, in its own order."""

    @abc.abstractmethod
    def _power_w(self, handle: Any) -> float | None:
        """The power reading of one GPU, watts; None when it is N/A."""

    @abc.abstractmethod
    def _power_kind(self) -> str | None:
        """``instant`` | ``average`` after reading every device, None when one's is N/A."""

    @abc.abstractmethod
    def _counter(self, handle: Any) -> GpuCounter:
        """The energy counter of one GPU (its unit and range)."""

    @abc.abstractmethod
    def _raw_energy(self, handle: Any) -> float:
        """The raw energy counter of one GPU, in the counter's units."""


def _describe(err: BaseException) -> str:
    if isinstance(err, AttributeError):
        return f"not in this library version ({err})"
    return f"{type(err).__name__}: {err}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: Any) -> float | None:
    """A reading as a float; None for amdsmi's "N/A" (or anything else that is not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class NvmlReader(GpuReader):
    """NVIDIA GPUs through nvidia-ml-py: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the
    driver loaded, 64 bits: a decrease is dropped and counted) and the power: the field
    ``NVML_FI_DEV_POWER_INSTANT`` (mW) where the driver has it, else ``nvmlDeviceGetPowerUsage``
    (mW; averaged over 1 s from Ampere except GA100, instant before: NVML's documentation).
    On an H200 the counter moves in steps of about 0.1 s, so a step shorter than that can read
    0 J and the next one the rest (their sum is exact).
    Handles are mapped through ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs); CUDA's
    default order is NVML's (PCI bus) order on hosts of one GPU model, so a mixed host needs
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""

    source = "nvml"
    package = "pynvml"
    distribution = "nvidia-ml-py (pynvml)"
    platforms = ("gpu", "cuda")
    visibility = ("CUDA_VISIBLE_DEVICES",)
    uuid_function = "nvmlDeviceGetUUID"

    def _handles(self) -> list[Any]:
        self.lib.nvmlInit()
        handles = [
            self.lib.nvmlDeviceGetHandleByIndex(i) for i in range(self.lib.nvmlDeviceGetCount())
        ]
        names = {self._optional_text("nvmlDeviceGetName", h) for h in handles}
        if len(names) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            raise PowerUnavailable(
                f"GPUs of {len(names)} models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: "
                "CUDA's device order cannot be matched to NVML's"
            )
        self._instant = self._instant_field(handles)
        return handles

    def _instant_field(self, handles: list[Any]) -> int | None:
        """``NVML_FI_DEV_POWER_INSTANT`` where every device answers it (drivers from R535), else
        None: then ``nvmlDeviceGetPowerUsage``, a 1 s average on current GPUs, is read."""
        field = getattr(self.lib, "NVML_FI_DEV_POWER_INSTANT", None)
        if field is None:
            return None
        try:
            replies = [self.lib.nvmlDeviceGetFieldValues(h, [field])[0] for h in handles]
        except Exception:  # noqa: BLE001 - a missing function or an NVMLError
            return None
        return field if all(reply.nvmlReturn == 0 for reply in replies) else None

    def _power_w(self, handle: Any) -> float | None:
        if self._instant is None:
            milliwatts = self.lib.nvmlDeviceGetPowerUsage(handle)
        else:
            reply = self.lib.nvmlDeviceGetFieldValues(handle, [self._instant])[0]
            milliwatts = reply.value.uiVal if reply.nvmlReturn == 0 else NVML_NA_UINT
        return None if milliwatts == NVML_NA_UINT else milliwatts * 1e-3

    def _power_kind(self) -> str | None:
        if None in [self._power_w(h) for h in self.handles]:
            return None
        if self._instant is not None:
            return "instant"
        try:
            archs = [self.lib.nvmlDeviceGetArchitecture(h) for h in self.handles]
        except Exception:  # noqa: BLE001 - unknown: the reading of the current GPUs
            return "average"
        ga100 = any(
            n in (self._optional_text("nvmlDeviceGetName", h) or "")
            for h in self.handles
            for n in GA100_NAMES
        )
        return "average" if min(archs) >= NVML_ARCH_AMPERE and not ga100 else "instant"

    def _counter(self, handle: Any) -> GpuCounter:
        return GpuCounter(self._raw_energy(handle), 1e-3, None)

    def _raw_energy(self, handle: Any) -> float:
        millijoules = self.lib.nvmlDeviceGetTotalEnergyConsumption(handle)
        if millijoules == NVML_NA_ULONGLONG:
            raise PowerUnavailable("total energy consumption is N/A")
        return float(millijoules)


class AmdSmiReader(GpuReader):
    """AMD GPUs through amdsmi: ``amdsmi_get_energy_count`` (accumulator x
    ``counter_resolution`` µJ; the accumulator wraps at 2**32 units, about 65,536 J at
    15.3 µJ) and ``amdsmi_get_power_info`` (W: ``current_socket_power``, instant, where the
    device has it; ``average_socket_power`` otherwise, as on MI200; "N/A" is no reading).
    Handles are mapped through ``ROCR_VISIBLE_DEVICES`` (over the host's GPUs in amdsmi's
    order) and then ``HIP_VISIBLE_DEVICES`` or, when unset, ``CUDA_VISIBLE_DEVICES``, which HIP
    also honours."""

    source = "amdsmi"
    package = "amdsmi"
    distribution = "amdsmi"
    platforms = ("gpu", "rocm")
    uuid_function = "amdsmi_get_gpu_device_uuid"
    no_power = "current and average socket power are N/A"
    POWER_KEYS = (("current_socket_power", "instant"), ("average_socket_power", "average"))

    @property
    def visibility(self) -> tuple[str, ...]:  # type: ignore[override]
        hip = (
            "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in os.environ else "CUDA_VISIBLE_DEVICES"
        )
        return ("ROCR_VISIBLE_DEVICES", hip)

    def _handles(self) -> list[Any]:
        self.lib.amdsmi_init()
        self._power_key = self.POWER_KEYS[0][0]
        return self.lib.amdsmi_get_processor_handles()

    def _power_w(self, handle: Any) -> float | None:
        return _number(self.lib.amdsmi_get_power_info(handle).get(self._power_key))

    def _power_kind(self) -> str | None:
        infos = [self.lib.amdsmi_get_power_info(h) for h in self.handles]
        for key, kind in self.POWER_KEYS:
            if all(_number(info.get(key)) is not None for info in infos):
                self._power_key = key
                return kind
        return None

    def _energy(self, handle: Any) -> tuple[float, float]:
        count = self.lib.amdsmi_get_energy_count(handle)
        raw = _number(count.get("energy_accumulator", count.get("power")))
        resolution = _number(count.get("counter_resolution"))
        if raw is None or resolution is None:
            raise PowerUnavailable(f"energy count is N/A ({count})")
        return raw, resolution

    def _counter(self, handle: Any) -> GpuCounter:
        raw, resolution_uj = self._energy(handle)
        return GpuCounter(raw, resolution_uj * 1e-6, AMDSMI_COUNTER_BITS)

    def _raw_energy(self, handle: Any) -> float:
        return self._energy(handle)[0]


def _rapl(devices: list[Any] | None = None, process_index: int | None = None) -> RaplReader:
    """A :class:`RaplReader` when the run's devices are CPUs (or none are given)."""
    devices = local_devices(devices, process_index)
    if devices and any(d.platform != "cpu" for d in devices):
        raise PowerUnavailable("RAPL reads CPU packages, and the run's devices are not CPUs")
    return RaplReader()


READERS: tuple[Callable[..., Any], ...] = (NvmlReader, AmdSmiReader, _rapl)

TPU_REASON = (
    "not available on TPU: neither JAX nor the TPU runtime (libtpu, its tpu-info metrics) "
    "gives a process on the VM the chips' power or energy"
)
"""Why a TPU run records no power: what the TPU VM offers a process is JAX's device memory
statistics and libtpu's runtime metrics (duty cycle, memory; ``tpu-info``), none of them power
(Cloud TPU documentation, "Monitor TPU VMs" and the ``tpu-info`` tool)."""


def open_reader(
    readers: tuple[Callable[..., Any], ...] = READERS,
    *,
    devices: list[Any] | None = None,
    process_index: int | None = None,
) -> tuple[Any, dict[str, Any]]:
    """(the first reader that works or None, the ``power`` field of ``run_start``).

    Args:
        readers: reader factories, tried in order, each called with ``devices`` and
            ``process_index``.
        devices: the JAX devices the run's layout uses (e.g. ``jax.devices()[:n]``, the devices
            of the trainer's meshes); only this process's are read. None: every device of the
            host.
        process_index: this process (default ``jax.process_index()``).

    Returns the ``power`` field: ``source``, ``available``, ``reason`` (why no source works),
    ``method`` (``counter`` | ``sampled``), ``power_reading`` (``instant`` | ``average`` | None),
    ``devices`` (what is read) and ``fallbacks`` (why the counter or the power reading is not
    used).
    """
    local = local_devices(devices, process_index)
    if local and all(getattr(d, "platform", None) == "tpu" for d in local):
        return None, _unavailable(TPU_REASON)
    reasons = []
    for make in readers:
        try:
            reader = make(devices=devices, process_index=process_index)
        except PowerUnavailable as err:
            reasons.append(str(err))
            continue
        except Exception as err:  # noqa: BLE001 - a sensor must never stop the run
            reasons.append(f"{getattr(make, '__name__', make)}: {_describe(err)}")
            continue
        info = {"source": reader.source, "available": True, "reason": None}
        return reader, {**info, **_reader_info(reader)}
    return None, _unavailable("; ".join(reasons))


def _unavailable(reason: str) -> dict[str, Any]:
    """The ``power`` field of a run with no source, and why."""
    return {
        "source": None,
        "available": False,
        "reason": reason,
        "method": None,
        "power_reading": None,
        "devices": [],
        "fallbacks": [],
    }


def _reader_info(reader: Any) -> dict[str, Any]:
    if hasattr(reader, "info"):
        return reader.info()
    return {"method": "counter", "power_reading": None, "devices": [], "fallbacks": []}


SAMPLED_INTERVAL_S = 0.1  # no counter: power is integrated, so sample at 100 ms
COUNTER_INTERVAL_S = 1.0  # a counter is read at each step's end; samples only watch it
FROZEN_AFTER_S = 5.0  # a counter that has not moved for this long may be frozen...
FROZEN_STEPS = 3  # ...when this many steps ended meanwhile,
IDLE_W = 1.0  # ...or the power read meanwhile was above this (an idle GPU draws tens of watts)


class PowerSampler:
    """Samples a reader every ``interval_s`` seconds in a daemon thread; see the module doc.

    With a counter (``reader.method == "counter"``; a reader that does not say has one when its
    first reading has energy),
    energy is the counter's; the counter is watched, and one that has not moved for
    ``frozen_after_s`` while the power was above :data:`IDLE_W` or :data:`FROZEN_STEPS` steps
    ended is frozen: a warning is printed once, :attr:`switch` says so, sampling goes to
    :data:`SAMPLED_INTERVAL_S`, and energy continues from the counter's last movement with the
    integrated power (None without a power reading). Without a counter, energy is the integral
    of the sampled power (trapezoids), None until a power reading arrives.

    Args:
        reader: an object with ``read() -> (watts or None, joules since start or None)``, or
            None (then :meth:`energy_j` is always None).
        interval_s: sampling interval, seconds; default :data:`COUNTER_INTERVAL_S` with a
            counter, :data:`SAMPLED_INTERVAL_S` without.
        frozen_after_s: seconds without counter movement before it is considered frozen.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        reader: Any,
        interval_s: float | None = None,
        frozen_after_s: float = FROZEN_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        # None until the first reading of a reader that does not say: energy in it is a counter
        self.method: str | None = getattr(reader, "method", None)
        if interval_s is None:
            interval_s = SAMPLED_INTERVAL_S if self.method == "sampled" else COUNTER_INTERVAL_S
        self.frozen_after_s = frozen_after_s
        self.clock = clock
        self.errors = 0
        self.last_error = ""
        self.samples = 0
        self.switch: dict[str, str] | None = None  # set once when a frozen counter is left
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # readers keep state (counter unwrapping)
        self._energy_j: float | None = None
        self._integrated_j = 0.0
        self._last: tuple[float, float] | None = None  # (time, watts)
        self._counter_j: float | None = None  # the counter's latest value
        self._moved: tuple[float, float] = (clock(), 0.0)  # (time, integral) at its last move
        self._steps_since_move = 0
        self._high_power_since_move = False
        self.ticker = Ticker(interval_s, self.sample, "titan-power")

    def sample(self) -> None:
        """Take one reading (the thread calls this; errors are counted, not raised)."""
        reading = self._read()
        if reading is not None:
            self._observe(*reading)

    def _observe(self, power_w: float | None, counter_j: float | None) -> float | None:
        """Account one reading; returns the energy since start, joules (None: unknown)."""
        now = self.clock()
        with self._lock:
            self.samples += 1
            if power_w is not None and self._last is not None:
                self._integrated_j += 0.5 * (power_w + self._last[1]) * (now - self._last[0])
            if power_w is not None:
                self._last = (now, power_w)
                self._high_power_since_move |= power_w > IDLE_W
            if self.method is None:
                self.method = "sampled" if counter_j is None else "counter"
            if self.method == "counter" and counter_j is not None:
                self._watch_counter(counter_j, now)
            self._energy_j = self._energy_locked()
            return self._energy_j

    def _watch_counter(self, counter_j: float, now: float) -> None:
        if counter_j != self._counter_j:
            self._counter_j = counter_j
            self._moved = (now, self._integrated_j)
            self._steps_since_move = 0
            self._high_power_since_move = False
            return
        busy = self._high_power_since_move or self._steps_since_move >= FROZEN_STEPS
        if now - self._moved[0] >= self.frozen_after_s and busy:
            self._leave_frozen_counter(now - self._moved[0])

    def _leave_frozen_counter(self, stalled_s: float) -> None:
        reason = (
            f"energy counter frozen at {self._counter_j:.3f} J for {stalled_s:.1f} s while the "
            "devices were busy"
        )
        if self._last is None:
            reason += "; no power reading to sample either: energy is unknown from here"
        self.method = "sampled"
        self.switch = {"method": "sampled", "reason": reason}
        self.ticker.interval_s = min(self.ticker.interval_s, SAMPLED_INTERVAL_S)
        print(f"titan: power: {reason}; sampling power instead", file=sys.stderr, flush=True)

    def _energy_locked(self) -> float | None:
        if self.method == "counter":
            return self._counter_j
        if self._last is None:
            return None
        if self._counter_j is None:  # sampled from the start
            return self._integrated_j
        return self._counter_j + self._integrated_j - self._moved[1]  # after a frozen counter

    def note_step(self) -> None:
        """A step ended (a frozen counter is also recognised by steps that did not move it)."""
        with self._lock:
            self._steps_since_move += 1

    def _read(self) -> tuple[float | None, float | None] | None:
        """One reading, or None after counting an error."""
        try:
            with self._read_lock:
                return self.reader.read()
        except Exception as err:  # noqa: BLE001 - a sensor must never stop the run
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"
            return None

    def energy_j(self) -> float | None:
        """Energy since the sampler started, joules, as of the latest sample (None: none yet or
        no reader)."""
        with self._lock:
            return self._energy_j

    def energy_now_j(self) -> float | None:
        """Energy since the sampler started, joules. With a counter it is read now (a driver or
        sysfs query, microseconds), so that it ends where the caller's interval ends; without
        one, or when the read fails, the latest sample's figure."""
        if self.reader is None:
            return None
        if self.method == "sampled":
            return self.energy_j()
        reading = self._read()
        if reading is None or reading[1] is None:
            return self.energy_j()
        return self._observe(*reading)

    def start(self) -> None:
        """Take a first sample and start sampling in the background (nothing without a reader)."""
        if self.reader is None:
            return
        self.sample()
        self.ticker.start()

    def stop(self) -> None:
        self.ticker.stop()


class StepEnergy:
    """``energy_j`` and ``joules_per_token`` of each step from a :class:`PowerSampler` (None when
    the sampler has no reading). With an energy counter (NVML, amdsmi, RAPL) the counter is read
    at each step's end, so each step gets its own energy. Without one (power readings only), a
    step gets the energy integrated up to the latest sample (every 100 ms): single steps are
    coarse by up to one interval at each end, their sum is exact. The one step after the
    sampler left a frozen counter also gets ``power_switch`` (the new method and the reason)."""

    def __init__(self, sampler: PowerSampler) -> None:
        self.sampler = sampler
        self._previous = sampler.energy_now_j()
        self._switch_reported = False

    def restart(self) -> None:
        """The next step's energy starts now: what the devices used since the last step's end
        (an evaluation, the pinned host reservation) goes to no step, as its time does."""
        self._previous = self.sampler.energy_now_j()

    def step_fields(self, tokens: int) -> dict[str, Any]:
        self.sampler.note_step()
        total = self.sampler.energy_now_j()
        fields: dict[str, Any] = {"energy_j": None, "joules_per_token": None}
        if total is not None and self._previous is not None:
            energy_j = max(total - self._previous, 0.0)
            fields = {"energy_j": energy_j, "joules_per_token": energy_j / tokens}
        self._previous = total
        if self.sampler.switch is not None and not self._switch_reported:
            self._switch_reported = True
            fields["power_switch"] = self.sampler.switch
        return fields
