"""The other processes of a run of several: lost processes and their stalls.

Every process keeps its heartbeat file ``processes/<id>.json`` (:class:`Heartbeat`) fresh from a
background thread (:class:`PeerWatch`, once a second), whatever the training loop is doing, and
reads the others' files on the same beat:

- A process whose status is ``running`` and whose heartbeat is older than the run's allowance
  (:func:`titan.telemetry.heartbeat.heartbeat_allowance_s`: 30 s, or ``--watchdog-floor``
  when that is shorter; the console and ``titan summarize`` use the same) is **lost**: killed,
  crashed or cut off (a process stuck in a collective still beats; the stall watchdog covers
  it). The first process to see it ends the run: the writer (process 0) records ``run_end``
  ``failed`` with reason ``lost_process`` naming it. A process that ended ``failed`` (a
  save that failed on its host alone) is lost likewise once its last beat is that old while
  others still run. When process 0 is the one lost, the lowest surviving process appends that
  ``run_end`` instead, if it can: JAX's coordination service runs in process 0, and when that
  process is killed JAX aborts the others at once (SIGABRT, a C++ stack trace), before any
  record; the run then has no ``run_end``, and its heartbeats say what happened
  (``titan summarize``: ``dead``). Every other process marks its own
  heartbeat ``failed`` and exits with :data:`titan.exit_codes.EXIT_FAILED`, so nobody waits in
  a collective for a process that will never answer. JAX's coordination service would end the
  processes too, but only after its own heartbeat timeout (100 s) and without a record.
- A stall seen by the watchdog of another process (:class:`titan.telemetry.watchdog.Watchdog`)
  is written into that process's heartbeat; the writer records it as a ``stall`` event with
  its ``process``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan.parallel.distributed import process_count, process_index
from titan.telemetry.events import RunEnd, Stall
from titan.telemetry.heartbeat import BEAT_INTERVAL_S, ProcessBeat, read_beats, read_small_json
from titan.telemetry.interval_thread import Ticker
from titan.telemetry.records import RunRecord
from titan.trainer.processes import PROCESSES_DIR, STALL_FIELDS, Heartbeat


@dataclass(frozen=True)
class LostProcess:
    """A process of the run that counts as lost: its heartbeat and why."""

    beat: ProcessBeat
    why: str

    @property
    def process(self) -> int:
        return self.beat.id.process

    def describe(self) -> str:
        doing = self.beat.doing()
        return f"lost {self.why}, last step {self.beat.step}" + (f", {doing}" if doing else "")


def lost_processes(beats: list[ProcessBeat], now: float, after_s: float) -> list[LostProcess]:
    """The processes among ``beats`` (not this one) that this one would wait for in vain: one
    still ``running`` that is gone, on this host by its pid
    (:meth:`titan.telemetry.heartbeat.ProcessId.gone`: at once), on any host by a last beat
    (Unix seconds) more than ``after_s`` before ``now``; and one that ended ``failed`` more than
    ``after_s`` ago (a save or write that failed on its host alone) while this one still runs,
    so would wait for it in the next collective. Peers failing together (a non-finite loss on
    every process) end within that time and are never reported."""
    lost = []
    for beat in beats:
        if beat.id.process == process_index() or beat.status not in ("running", "failed"):
            continue
        silent_s = now - beat.beat
        quiet = silent_s > after_s
        if beat.status == "failed":
            why = f"{beat.id.name()}: failed {silent_s:.0f} s ago" if quiet else None
        else:
            why = beat.id.gone() if beat.id.local else None
            if why is None and quiet:
                why = f"{beat.id.name()}: no heartbeat for {silent_s:.0f} s"
        if why is not None:
            lost.append(LostProcess(beat, why))
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
        """One beat: record the others' new stalls (on the writer), and end the run if one is
        lost."""
        if process_index() == 0:
            self._record_stalls()
        lost = lost_processes(read_beats(self.run_dir), time.time(), self.after_s)
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
            peers = [b for b in read_beats(self.run_dir) if b.id.process != process_index()]
            if all(b.status != "running" or b.beat > since for b in peers):
                return
            time.sleep(BEAT_INTERVAL_S / 2)

    def _record_stalls(self) -> None:
        for path in sorted((self.run_dir / PROCESSES_DIR).glob("*.json")):
            beat = read_small_json(path)
            index = beat.get("process") if isinstance(beat, dict) else None
            stall = beat.get("stall") if isinstance(index, int) else None
            if not isinstance(index, int) or index == 0 or not isinstance(stall, dict):
                continue
            key = tuple(stall.get(name) for name in STALL_FIELDS)
            if self._stalls_seen.get(index) != key:
                self._stalls_seen[index] = key
                fields: dict[str, Any] = {n: stall.get(n) for n in STALL_FIELDS}
                self.record.emit(Stall(**fields, process=index))


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
