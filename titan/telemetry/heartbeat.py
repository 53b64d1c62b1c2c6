"""Who a run's processes are, as each writes it while the run trains: one :class:`ProcessId`
(host, pid, process group, start time) per process, and one heartbeat file per process,
``processes/<id>.json`` (:class:`ProcessBeat`), rewritten every :data:`BEAT_INTERVAL_S`.

The trainer writes them (:class:`titan.trainer.processes.Heartbeat`), its peer watch reads them
(:mod:`titan.trainer.peers`), and :mod:`titan.analysis.liveness` judges a run from them; the
allowance a silent process gets, :func:`heartbeat_allowance_s`, is the one rule all three share.

This module imports neither JAX nor Textual nor DuckDB.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import psutil

from titan.formatting import format_clock
from titan.reading import open_regular, parse_json

PROCESSES_DIR = "processes"
# A heartbeat thread rewrites processes/<id>.json this often (seconds).
BEAT_INTERVAL_S = 1.0
# The longest heartbeat allowance (heartbeat_allowance_s): thirty missed beats, so a thread
# starved for a while by a busy process is not taken for a lost one, and under JAX's own
# coordination timeout (100 s), so the record names the lost process first.
HEARTBEAT_TIMEOUT_S = 30.0
# The shortest allowance: three missed beats.
MIN_ALLOWANCE_BEATS = 3
# Start times are read from /proc (clock ticks since boot, 1/100 s on Linux, plus the boot time,
# a whole second): the same process reads within this of its recorded start time.
START_TIME_TOLERANCE_S = 1.0


def heartbeat_allowance_s(watchdog_floor_s: float | None = None) -> float:
    """Seconds a process of a run may go without a heartbeat before it counts as unresponsive
    (on this host) or lost (elsewhere, and for the peer watch): :data:`HEARTBEAT_TIMEOUT_S`,
    or the run's ``--watchdog-floor`` when that is shorter (a run that allows short stalls also
    notices a silent process soon), never under :data:`MIN_ALLOWANCE_BEATS` beats.

    Args:
        watchdog_floor_s: the run's ``--watchdog-floor`` in seconds (None: not recorded).
    """
    if watchdog_floor_s is None:
        return HEARTBEAT_TIMEOUT_S
    return max(MIN_ALLOWANCE_BEATS * BEAT_INTERVAL_S, min(HEARTBEAT_TIMEOUT_S, watchdog_floor_s))


def _is_int(value: Any) -> TypeGuard[int]:
    """``value`` is a JSON integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ProcessId:
    """Who one process of a run is.

    Attributes:
        host: ``socket.gethostname()`` of its machine.
        pid: its process id there.
        pgid: its process group (a stop signals the group).
        started: unix seconds it started (psutil's ``create_time``: /proc's start time).
        process: its index among the run's processes (``jax.process_index()``; 0 when one).
    """

    host: str
    pid: int
    pgid: int
    started: float
    process: int = 0

    @classmethod
    def current(cls, process: int = 0) -> ProcessId:
        """The calling process."""
        return cls(
            socket.gethostname(),
            os.getpid(),
            os.getpgid(0),
            psutil.Process().create_time(),
            process,
        )

    @classmethod
    def of(cls, record: Any) -> ProcessId | None:
        """The identity held by a record's dict (``run_start.process``, a heartbeat or launch
        file); None when a field is missing or of another type (a hostile or older record)."""
        if not isinstance(record, dict):
            return None
        host, pid, pgid = record.get("host"), record.get("pid"), record.get("pgid")
        started, process = record.get("started"), record.get("process", 0)
        if not (
            isinstance(host, str)
            and _is_int(pid)
            and _is_int(pgid)
            and _is_int(process)
            and isinstance(started, int | float)
        ):
            return None
        return cls(host, pid, pgid, float(started), process)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "pgid": self.pgid,
            "started": self.started,
            "process": self.process,
        }

    @property
    def local(self) -> bool:
        """Whether it runs on this host (only then can its pid be checked or signalled)."""
        return self.host == socket.gethostname()

    def name(self) -> str:
        """``process 0 (pid 123 on host)``."""
        return f"process {self.process} (pid {self.pid} on {self.host})"

    def gone(self) -> str | None:
        """Why this process, on this host, is not running any more (None: it runs).

        Raises:
            ValueError: it is on another host (:attr:`local` is False).
        """
        if not self.local:
            raise ValueError(f"{self.name()} is on another host")
        try:
            proc = psutil.Process(self.pid)
            started, status = proc.create_time(), proc.status()
        except psutil.NoSuchProcess:
            return f"{self.name()} is gone"
        except psutil.AccessDenied:
            return None  # exists, but another user's: it cannot be told apart, take it as alive
        if abs(started - self.started) > START_TIME_TOLERANCE_S:
            when = format_clock(started, "%H:%M:%S")
            return f"pid {self.pid} is now another process (started {when})"
        if status == psutil.STATUS_ZOMBIE:
            return f"{self.name()} has exited"
        return None


@dataclass(frozen=True)
class ProcessBeat:
    """One ``processes/<id>.json``.

    Attributes:
        id: the process's identity.
        processes: how many processes the run has.
        step: last step it reported (None before the first).
        beat: unix seconds of its last beat.
        status: ``running``, then the run's ``run_end`` status.
        saving: the step whose checkpoint it is saving (its loop in the ``checkpoint_save``
            phase), or None.
    """

    id: ProcessId
    processes: int
    step: int | None
    beat: float
    status: str
    saving: int | None = None

    @classmethod
    def of(cls, record: Any) -> ProcessBeat | None:
        """The beat of a heartbeat file's JSON; None when it is not one."""
        identity = ProcessId.of(record)
        if identity is None:
            return None
        count, step = record.get("processes"), record.get("step")
        beat, status = record.get("beat"), record.get("status")
        if not isinstance(count, int) or not isinstance(beat, int | float):
            return None
        step = step if _is_int(step) else None
        saving = record.get("saving")
        status = status if isinstance(status, str) else "?"
        return cls(identity, count, step, float(beat), status, saving if _is_int(saving) else None)

    def doing(self) -> str:
        """What the process was doing at its last beat, when that says more than its step:
        ``inside the checkpoint save of step 4``, else ""."""
        return "" if self.saving is None else f"inside the checkpoint save of step {self.saving}"


def hang_stacks_path(run_dir: Path, process: int) -> Path:
    """``processes/<id>.stacks``: where a process's hang timer
    (:meth:`titan.telemetry.watchdog.Watchdog.arm_hang_timer`) writes every thread's stack
    before it ends the process; empty (or absent) unless that happened."""
    return Path(run_dir) / PROCESSES_DIR / f"{process}.stacks"


def read_hang(run_dir: Path, process: int) -> str | None:
    """The first line of a process's hang dump (faulthandler's ``Timeout (0:00:05)!``), or
    None when its hang timer never fired."""
    try:
        with open_regular(hang_stacks_path(run_dir, process)) as f:
            first = f.read(256).split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    except OSError:
        return None
    return first or None


def read_beats(run_dir: Path) -> list[ProcessBeat]:
    """The heartbeat files of a run, by process index (files that are not one are skipped)."""
    beats = []
    for path in sorted(Path(run_dir, PROCESSES_DIR).glob("*.json")):
        beat = ProcessBeat.of(read_small_json(path))
        if beat is not None:
            beats.append(beat)
    return sorted(beats, key=lambda b: b.id.process)


def read_small_json(path: Path) -> Any:
    """The JSON of a small file, or None when it is missing, unreadable or not JSON."""
    try:
        with open_regular(path) as f:
            return parse_json(f.read(1 << 16))
    except OSError:
        return None
