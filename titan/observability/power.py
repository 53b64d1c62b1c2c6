"""Power and energy of the devices a run uses: ``power`` in ``run_start``, ``energy_j`` and
``joules_per_token`` in ``step`` events.

Sources, tried in order (each imported lazily; a missing library or unreadable file means the
next one is tried):

- ``nvml``: NVIDIA through nvidia-ml-py (``pynvml``): ``nvmlDeviceGetPowerUsage`` (mW) and
  ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded), summed over the devices.
- ``amdsmi``: AMD through ``amdsmi``: ``amdsmi_get_power_info`` (W) and
  ``amdsmi_get_energy_count`` (accumulator x counter resolution, µJ), summed over the GPUs.
- ``rapl``: CPU package energy through Linux RAPL, ``<root>/intel-rapl:N/energy_uj`` (µJ),
  wrapping at ``max_energy_range_uj``; sub-zones (``intel-rapl:N:M``) are inside their package
  and are not added.

With no source, ``power`` is ``{"source": None, "available": False, "reason": ...}`` and the
step fields are None. :class:`PowerSampler` reads the source every ``interval_s`` (default 1 s)
in a background thread; energy comes from the counter where there is one, else from integrating
the sampled power (trapezoids). A failing read is counted (``errors``) and skipped, never raised.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from titan.observability.ticker import Ticker

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


def _open_gpus(package: str, install: str, handles: Callable[[Any], list[Any]]) -> tuple[Any, list]:
    """(the imported ``package``, its device handles from ``handles(module)``).

    Raises:
        PowerUnavailable: ``package`` is not installed (``install`` names its distribution), its
            library fails to start, or it sees no device.
    """
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise PowerUnavailable(f"{install} is not installed") from None
    try:
        found = handles(module)
    except Exception as err:  # noqa: BLE001 - NVMLError, AmdSmiException, or a broken driver
        raise PowerUnavailable(f"{package}: {type(err).__name__}: {err}") from None
    if not found:
        raise PowerUnavailable(f"{package} sees no GPU")
    return module, found


def _nvml_handles(pynvml: Any) -> list[Any]:
    pynvml.nvmlInit()
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def _amdsmi_handles(amdsmi: Any) -> list[Any]:
    amdsmi.amdsmi_init()
    return amdsmi.amdsmi_get_processor_handles()


class NvmlReader:
    """Board power and energy of every NVIDIA GPU (nvidia-ml-py).

    Raises:
        PowerUnavailable: pynvml missing, or NVML failed to start or has no device.
    """

    source = "nvml"

    def __init__(self) -> None:
        self._nvml, self._handles = _open_gpus("pynvml", "nvidia-ml-py (pynvml)", _nvml_handles)
        self._start_mj = self._energy_mj()

    def _energy_mj(self) -> int:
        return sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles)

    def read(self) -> tuple[float | None, float | None]:
        power_mw = sum(self._nvml.nvmlDeviceGetPowerUsage(h) for h in self._handles)
        return power_mw * 1e-3, (self._energy_mj() - self._start_mj) * 1e-3


class AmdSmiReader:
    """Socket power and energy of every AMD GPU (amdsmi).

    Raises:
        PowerUnavailable: amdsmi missing, or it failed to start or has no GPU.
    """

    source = "amdsmi"

    def __init__(self) -> None:
        self._amdsmi, self._handles = _open_gpus("amdsmi", "amdsmi", _amdsmi_handles)
        self._start_uj = self._energy_uj()

    def _energy_uj(self) -> float:
        total = 0.0
        for handle in self._handles:
            count = self._amdsmi.amdsmi_get_energy_count(handle)
            total += count["energy_accumulator"] * count["counter_resolution"]
        return total

    def read(self) -> tuple[float | None, float | None]:
        power_w = 0.0
        for handle in self._handles:
            info = self._amdsmi.amdsmi_get_power_info(handle)
            power_w += float(info.get("current_socket_power") or info["average_socket_power"])
        return power_w, (self._energy_uj() - self._start_uj) * 1e-6


READERS: tuple[Callable[[], Any], ...] = (NvmlReader, AmdSmiReader, RaplReader)


def open_reader(readers: tuple[Callable[[], Any], ...] = READERS) -> tuple[Any, dict[str, Any]]:
    """(the first reader that works or None, the ``power`` field of ``run_start``)."""
    reasons = []
    for make in readers:
        try:
            reader = make()
        except PowerUnavailable as err:
            reasons.append(str(err))
            continue
        return reader, {"source": reader.source, "available": True, "reason": None}
    return None, {"source": None, "available": False, "reason": "; ".join(reasons)}


class PowerSampler:
    """Samples a reader every ``interval_s`` seconds in a daemon thread; see the module doc.

    Args:
        reader: an object with ``read() -> (watts or None, joules since start or None)``, or
            None (then :meth:`energy_j` is always None).
        interval_s: sampling interval, seconds.
    """

    def __init__(self, reader: Any, interval_s: float = 1.0) -> None:
        self.reader = reader
        self.errors = 0
        self.last_error = ""
        self.samples = 0
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # readers keep state (RAPL unwrapping)
        self._energy_j: float | None = None
        self._integrated_j = 0.0
        self._last: tuple[float, float] | None = None  # (time, watts)
        self.ticker = Ticker(interval_s, self.sample, "titan-power")

    def sample(self) -> None:
        """Take one reading (the thread calls this; errors are counted, not raised)."""
        reading = self._read()
        if reading is None:
            return
        power_w, energy_j = reading
        now = time.monotonic()
        with self._lock:
            self.samples += 1
            if power_w is not None and self._last is not None:
                self._integrated_j += 0.5 * (power_w + self._last[1]) * (now - self._last[0])
            if power_w is not None:
                self._last = (now, power_w)
            self._energy_j = energy_j if energy_j is not None else self._integrated_j

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
        """Energy since the sampler started, joules, read from the device's energy counter now
        (a driver or sysfs query, microseconds), so that it ends where the caller's interval
        ends; the latest sample's figure when the reader has no counter or the read fails."""
        if self.reader is None:
            return None
        reading = self._read()
        if reading is None or reading[1] is None:
            return self.energy_j()
        return reading[1]

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
    step shorter than the sampling interval gets the energy of the samples that fell in it:
    single steps are coarse, their sum is exact."""

    def __init__(self, sampler: PowerSampler) -> None:
        self.sampler = sampler
        self._previous = sampler.energy_now_j()

    def step_fields(self, tokens: int) -> dict[str, float | None]:
        total = self.sampler.energy_now_j()
        if total is None or self._previous is None:
            self._previous = total
            return {"energy_j": None, "joules_per_token": None}
        energy_j, self._previous = total - self._previous, total
        return {"energy_j": energy_j, "joules_per_token": energy_j / tokens}
