"""The other processes of a run of several: lost processes and their stalls.

Every process keeps its heartbeat file ``processes/<id>.json`` (:class:`Heartbeat`) fresh from a
background thread (:class:`PeerWatch`, once a second), whatever the training loop is doing, and
reads the others' files on the same beat:

- A process whose status is ``running`` and whose heartbeat is older than ``lost_after_s``
  (:func:`lost_after_s`: 30 s, or ``--watchdog-floor`` when that is shorter) is **lost**: killed,
  crashed or cut off (a process stuck in a collective still beats; the stall watchdog covers
  it). The first process to see it ends the run: the writer (process 0) records ``run_end``
  ``failed`` with reason ``lost_process`` naming it; when process 0 is the one lost, the lowest
  surviving process appends that ``run_end`` instead. Every other process marks its own
  heartbeat ``failed`` and exits with :data:`titan.exit_codes.EXIT_FAILED`, so nobody waits in
  a collective for a process that will never answer. JAX's coordination service would end the
  processes too, but only after its own heartbeat timeout (100 s) and without a record.
- A stall seen by the watchdog of another process (:class:`titan.observability.watchdog.Watchdog`)
  is written into that process's heartbeat; the writer records it as a ``stall`` event with
  its ``process``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan.observability.events import RunEnd, Stall
from titan.observability.records import RunRecord
from titan.observability.ticker import Ticker
from titan.parallel.distributed import process_count, process_index
from titan.trainer.processes import BEAT_INTERVAL_S, PROCESSES_DIR, STALL_FIELDS, Heartbeat

LOST_AFTER_S = 30.0  # 30 missed beats: well past scheduling hiccups, well before JAX's 100 s


def lost_after_s(watchdog_floor_s: float) -> float:
    """Seconds without a heartbeat after which a process counts as lost: :data:`LOST_AFTER_S`,
    or the watchdog floor when that is shorter (a run that allows short stalls also notices a
    lost process soon), never under 3 beats."""
    return max(3 * BEAT_INTERVAL_S, min(LOST_AFTER_S, watchdog_floor_s))


@dataclass(frozen=True)
class LostProcess:
    """A process of the run that stopped beating: its index, host, pid, last step done and the
    seconds since its last heartbeat."""

    process: int
    host: str
    pid: int
    step: int | None
    silent_s: float

    def describe(self) -> str:
        return (
            f"lost process {self.process} (pid {self.pid} on {self.host}): no heartbeat for "
            f"{self.silent_s:.0f} s, last step {self.step}"
        )


def read_heartbeats(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Process index -> its heartbeat fields (unreadable or half-written files are skipped)."""
    beats = {}
    for path in (Path(run_dir) / PROCESSES_DIR).glob("*.json"):
        try:
            data = json.loads(path.read_text())
            beats[int(data["process"])] = data
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return beats


def lost_processes(
    beats: dict[int, dict[str, Any]], now: float, after_s: float
) -> list[LostProcess]:
    """The processes among ``beats`` (not this one) still ``running`` whose last beat (Unix
    seconds) is more than ``after_s`` before ``now``."""
    lost = []
    for index, beat in sorted(beats.items()):
        silent_s = now - float(beat.get("beat", now))
        if index != process_index() and beat.get("status") == "running" and silent_s > after_s:
            lost.append(
                LostProcess(
                    index,
                    str(beat.get("host")),
                    int(beat.get("pid", 0)),
                    beat.get("step"),
                    silent_s,
                )
            )
    return lost


class PeerWatch:
    """The background beat of a run of several processes (see the module docstring).

    Args:
        run_dir: the run's directory.
        heartbeat: this process's heartbeat, kept fresh here.
        record: the run record (the writer's; muted elsewhere).
        after_s: seconds without a beat after which a process is lost.
        on_lost: called once, from this thread, with the lost processes; it ends the process.
    """

    def __init__(
        self,
        run_dir: Path,
        heartbeat: Heartbeat,
        record: RunRecord,
        after_s: float,
        on_lost: Callable[[list[LostProcess]], None],
    ) -> None:
        self.run_dir, self.heartbeat, self.record = Path(run_dir), heartbeat, record
        self.after_s, self.on_lost = after_s, on_lost
        self._stalls_seen: dict[int, tuple] = {}
        self._lost_reported = False
        self._ticker = Ticker(BEAT_INTERVAL_S, self.check, "titan-peers")

    def start(self) -> None:
        if process_count() > 1:
            self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def check(self) -> None:
        """One beat: refresh this process's heartbeat, record the others' new stalls (on the
        writer), and end the run if one is lost."""
        self.heartbeat.beat(None, force=True)
        beats = read_heartbeats(self.run_dir)
        if process_index() == 0:
            self._record_stalls(beats)
        lost = lost_processes(beats, time.time(), self.after_s)
        if lost and not self._lost_reported:
            self._lost_reported = True
            self.on_lost(lost)

    def settle(self) -> None:
        """Before this process records a failure: if a peer went quiet (killed, so that a
        collective failed here), wait until it counts as lost, and :meth:`check` ends the run
        naming it; returns as soon as every peer has beaten since the call."""
        if process_count() == 1:
            return
        since = time.time()
        while time.time() - since < self.after_s + 2 * BEAT_INTERVAL_S:
            beats = read_heartbeats(self.run_dir)
            peers = [b for i, b in beats.items() if i != process_index()]
            if all(b.get("status") != "running" or b.get("beat", 0) > since for b in peers):
                return
            time.sleep(BEAT_INTERVAL_S / 2)

    def _record_stalls(self, beats: dict[int, dict[str, Any]]) -> None:
        for index, beat in beats.items():
            stall = beat.get("stall")
            if index == 0 or not isinstance(stall, dict):
                continue
            key = tuple(stall.get(name) for name in STALL_FIELDS)
            if self._stalls_seen.get(index) != key:
                self._stalls_seen[index] = key
                self.record.emit(Stall(**{n: stall.get(n) for n in STALL_FIELDS}, process=index))


def end_for_lost(
    run_dir: Path, record: RunRecord, heartbeat: Heartbeat, lost: list[LostProcess], exit_code: int
) -> None:
    """End this process because ``lost`` stopped beating: the record's ``run_end`` (by the
    writer, or by the lowest surviving process when the writer is lost), this heartbeat's
    ``failed``, one line on stderr, and ``os._exit(exit_code)`` (the main thread may be stuck
    in a collective that never returns)."""
    message = "; ".join(p.describe() for p in lost)
    print(f"titan: {message}", file=sys.stderr, flush=True)
    step = heartbeat.fields.get("step")
    event = RunEnd(status="failed", step=step, reason="lost_process", error=message)
    lost_ids = {p.process for p in lost}
    survivors = [i for i in range(process_count()) if i not in lost_ids]
    if process_index() == 0:
        record.emit(event)
        record.close()
    elif 0 in lost_ids and survivors and survivors[0] == process_index():
        writer = RunRecord(run_dir, run_dir.name)
        writer.emit(event)
        writer.close()
    heartbeat.close("failed", None)
    os._exit(exit_code)
