"""Whether a run is alive, decided from its record alone: one rule for the console (run list,
monitor, History) and ``titan summarize``.

A run's processes say who they are in three places, each a :class:`ProcessId` (host, pid,
process group, start time; :mod:`titan.telemetry.heartbeat`, the side a run writes):

- ``launch.json``: written by the console's launcher when it starts ``titan train``, before the
  child has written anything (:data:`LAUNCH_FILE`);
- ``run_start``'s ``process`` field: process 0 of the attempt;
- ``processes/<id>.json``: one heartbeat file per process (:class:`ProcessBeat`), rewritten
  every :data:`BEAT_INTERVAL_S` by a thread of that process, whatever its loop is doing.

:func:`judge` turns them, with the record's last events, into one :class:`Liveness`, the first
rule that applies giving the state:

0. ``removed``: the run dir no longer exists (deleted while a reader follows it): nothing it
   read before is the run's any more.
1. ``completed``, ``stopped``, ``failed``: the last attempt's ``run_end`` status (``failed``
   with its error; a record's other status text is shown as it is).
2. ``dead``: a process of the run that has not ended is gone. On the host it runs on, a pid is
   checked directly: gone (or a zombie), or now another process (its start time differs from
   the recorded one by more than :data:`START_TIME_TOLERANCE_S`), is dead at once. From another
   host a pid cannot be checked; there a heartbeat older than the run's allowance
   (:func:`heartbeat_allowance_s`) is dead. A record that names no process (written before
   processes were recorded) is dead once its last event is older than
   :data:`titan.analysis.ettr.RUNNING_WINDOW_S` (its time, but never later than the record's
   modification time: a clock set ahead does not keep it alive). A dead run says when it was
   last seen alive (the newest heartbeat or event) and why, naming the lost process (host, pid,
   process id).
   A process of this host gone after its hang timer's dump (``processes/<id>.stacks``: it hung
   holding the GIL, :mod:`titan.telemetry.watchdog`) is dead for that reason; one that is
   unresponsive (4.) with such a dump says so.
   A run whose record holds no ``run_end`` and names no live process, but whose heartbeat
   files all hold their process's end (a record cut short or damaged), takes the status of
   process 0's heartbeat.
3. ``failed``: a launch whose process is gone before it wrote ``run_start`` (a layout the
   devices cannot hold, a bad option), or a run dir with neither ``run_start`` nor a recorded
   process whose ``stderr.log`` (or, without one, ``events.jsonl``) has not changed for
   :data:`~titan.analysis.ettr.RUNNING_WINDOW_S`: the last line of ``stderr.log`` is the
   reason.
4. ``unresponsive``: a process of this host exists but its heartbeat is older than the run's
   allowance (:func:`heartbeat_allowance_s`): its heartbeat thread, which beats whatever the
   loop does, has not run for that long, so the whole process is stopped (SIGSTOP, a debugger)
   or frozen; its own watchdog cannot record a stall. It can still be stopped or killed.
5. ``stalled``: alive, and the record's last event is a ``stall`` event, the trainer's own
   watchdog saying that the phase in flight has run past its allowance (``--watchdog-floor``,
   ``--watchdog-factor``); it stays stalled until the next event.
6. ``starting``: alive (or not yet known to be gone) and no ``run_start`` yet.
7. ``running``: otherwise.

The console refreshes a run's state with each poll (about once a second), so a run killed with
SIGKILL on this host reads ``dead`` within a second, and a process frozen there reads
``unresponsive`` within its allowance plus a second; on another host a lost process reads
``dead`` within its allowance plus a second.

The allowance is one rule, :func:`heartbeat_allowance_s` of the run's ``--watchdog-floor``
(recorded in ``run_start``'s config), shared by the console, ``titan summarize`` and the
multi-process peer watch (:mod:`titan.trainer.peers`), which ends a run whose peer is silent
for that long.

This module imports neither JAX nor Textual nor DuckDB.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from titan.analysis.ettr import RUNNING_WINDOW_S
from titan.formatting import format_clock
from titan.reading import open_regular
from titan.telemetry.events import Event, RunEnd, RunStart, Stall
from titan.telemetry.heartbeat import (
    HEARTBEAT_TIMEOUT_S,
    ProcessBeat,
    ProcessId,
    hang_stacks_path,
    heartbeat_allowance_s,
    read_beats,
    read_hang,
    read_small_json,
)
from titan.telemetry.records import EVENTS_FILE

LAUNCH_FILE = "launch.json"
STDERR_LOG = "stderr.log"
# Bytes read from the end of stderr.log for a failed launch's reason.
_STDERR_TAIL_BYTES = 4096

STARTING, RUNNING, STALLED, DEAD, FAILED = "starting", "running", "stalled", "dead", "failed"
UNRESPONSIVE, REMOVED = "unresponsive", "removed"


@dataclass(frozen=True)
class RecordFacts:
    """What the record's events say, as each reader folds them.

    Attributes:
        started: the last attempt has a ``run_start``.
        process: that ``run_start``'s ``process`` (None: not recorded).
        end_status: the last attempt's ``run_end`` status (None: no ``run_end`` yet).
        end_error: its error text.
        last_event_at: unix seconds of the record's last event (None: no events).
        stalled: the last event is a ``stall`` event.
        allowance_s: the last attempt's heartbeat allowance (:func:`heartbeat_allowance_s` of
            its ``run_start``'s ``watchdog_floor``).
    """

    started: bool = False
    process: ProcessId | None = None
    end_status: str | None = None
    end_error: str | None = None
    last_event_at: float | None = None
    stalled: bool = False
    allowance_s: float = HEARTBEAT_TIMEOUT_S

    def fold(self, events: Iterable[Event]) -> RecordFacts:
        """These facts with ``events`` (the record's next events, in file order) applied."""
        started, process, status, error = (
            self.started,
            self.process,
            self.end_status,
            self.end_error,
        )
        last, stalled, allowance = self.last_event_at, self.stalled, self.allowance_s
        for event in events:
            last, stalled = event.time, isinstance(event, Stall)
            if isinstance(event, RunStart):
                started, process, status, error = True, ProcessId.of(event.process), None, None
                allowance = run_allowance_s(event)
            elif isinstance(event, RunEnd):
                status, error = event.status, event.error
        return RecordFacts(started, process, status, error, last, stalled, allowance)


def run_allowance_s(start: RunStart) -> float:
    """The heartbeat allowance of the attempt ``start`` begins (:func:`heartbeat_allowance_s`
    of its config's ``watchdog_floor``; the longest when the record has none)."""
    floor = (start.config or {}).get("watchdog_floor") if isinstance(start.config, dict) else None
    if isinstance(floor, int | float) and not isinstance(floor, bool) and floor > 0:
        return heartbeat_allowance_s(float(floor))
    return heartbeat_allowance_s(None)


@dataclass(frozen=True)
class Liveness:
    """A run's state and why.

    Attributes:
        state: ``starting``, ``running``, ``stalled``, ``unresponsive``, ``dead``,
            ``completed``, ``stopped``, ``failed`` or ``removed``.
        reason: why (for ``dead``: why it is judged dead; ``failed``: the error); "" when there
            is nothing to say.
        last_seen: unix seconds it was last seen alive (newest heartbeat or event), or None.
        lost: the process judged gone (``dead``), or None.
        control: the process to signal (process 0 of this host, alive), or None.
        no_control: why the run cannot be stopped from here (another host, ended) when
            ``control`` is None.
        processes: the heartbeat of each process, by process index.
        allowance_s: the heartbeat allowance the run was judged by (s).
    """

    state: str
    reason: str = ""
    last_seen: float | None = None
    lost: ProcessId | None = None
    control: ProcessId | None = None
    no_control: str = ""
    processes: list[ProcessBeat] = field(default_factory=list)
    allowance_s: float = HEARTBEAT_TIMEOUT_S

    @property
    def alive(self) -> bool:
        """Whether a process of the run still exists (it may be stopped or killed)."""
        return self.state in (STARTING, RUNNING, STALLED, UNRESPONSIVE)

    def process_state(self, beat: ProcessBeat, now: float) -> str:
        """One process's state, in the words of the run's states (module docstring), so that a
        process row never names a state the run's status does not: its heartbeat's status once
        it ended (``completed``, ``stopped``, ``failed``); ``dead`` for the process the run is
        judged dead by, and for a process of another host whose heartbeat is older than the
        allowance (its pid cannot be checked: rule 2.); ``unresponsive`` for a process of this
        host whose heartbeat is older than the allowance (rule 4.); else ``running``.

        Args:
            beat: the process's heartbeat (one of :attr:`processes`).
            now: unix seconds.
        """
        if beat.status != RUNNING:
            return beat.status
        if self.lost is not None and self.lost.process == beat.id.process:
            return DEAD
        if now - beat.beat > self.allowance_s:
            return UNRESPONSIVE if beat.id.local else DEAD
        return RUNNING

    def describe(self) -> str:
        """``dead: process 0 (pid 12 on h) is gone; last seen 12:00:01``, one line."""
        text = self.state + (f": {self.reason}" if self.reason else "")
        if self.state == DEAD and self.last_seen is not None:
            text += "; last seen " + format_clock(self.last_seen)
        return text


def read_launch(run_dir: Path) -> ProcessId | None:
    """The process the console's launcher started for the run (``launch.json``), or None."""
    return ProcessId.of(read_small_json(Path(run_dir) / LAUNCH_FILE))


def judge(run_dir: Path, facts: RecordFacts, now: float | None = None) -> Liveness:
    """The state of the run in ``run_dir`` (module docstring: the rules, in order).

    Args:
        run_dir: the run dir (its heartbeat files, ``launch.json`` and ``stderr.log`` are read).
        facts: what the record's events say.
        now: unix seconds (default: the clock).
    """
    now = time.time() if now is None else now
    if not Path(run_dir).is_dir():
        return Liveness(REMOVED, f"{run_dir} no longer exists", no_control="its run dir is gone")
    beats, allowance = read_beats(run_dir), facts.allowance_s
    ended = "the run has ended"
    if facts.end_status is not None:
        return Liveness(
            facts.end_status, facts.end_error or "", None, None, None, ended, beats, allowance
        )
    leader = facts.process or read_launch(run_dir)
    live_beats = [b for b in beats if b.status == RUNNING and not _earlier(b, leader)]
    known = [b.id for b in live_beats]
    if leader is not None and all(p.process != leader.process for p in known):
        known.insert(0, leader)
    seen = [t for t in (facts.last_event_at, *(b.beat for b in live_beats)) if t is not None]
    last_seen = max(seen) if seen else None
    beat_at = {b.id.process: b.beat for b in live_beats}
    lost, why = _lost(known, beat_at, now, allowance)
    if lost is not None:
        if not facts.started and leader is not None and lost == leader:
            reason = "exited before run_start" + _stderr_reason(run_dir)
            return Liveness(FAILED, reason, last_seen, lost, None, ended, beats, allowance)
        return Liveness(
            DEAD, _hung(run_dir, lost) or why, last_seen, lost, None, ended, beats, allowance
        )
    if not known and beats:  # every heartbeat holds its process's end, and none is running
        status = beats[0].status
        reason = f"the record holds no run_end; the heartbeat of process 0 says {status}"
        return Liveness(status, reason, last_seen, None, None, ended, beats, allowance)
    if not known:
        last_seen = _last_write(run_dir, last_seen)
        if last_seen is not None and now - last_seen > RUNNING_WINDOW_S:
            silent = f"no process recorded and nothing written for {now - last_seen:.0f} s"
            if not facts.started:
                reason = f"no run_start: {silent}" + _stderr_reason(run_dir)
                return Liveness(FAILED, reason, last_seen, None, None, ended, beats, allowance)
            return Liveness(DEAD, silent, last_seen, None, None, ended, beats, allowance)
    control, no_control = _control(leader)
    frozen = _frozen(known, beat_at, now, allowance)
    hangs = [h for p in known if p.local and (h := _hang_dump(run_dir, p))]
    if frozen:
        state, reason = UNRESPONSIVE, frozen + "".join(f"; {h}" for h in hangs[:1])
    elif facts.stalled:
        state, reason = STALLED, "the watchdog recorded a stall and nothing since"
    else:
        state, reason = (RUNNING if facts.started else STARTING), ""
    return Liveness(state, reason, last_seen, None, control, no_control, beats, allowance)


def _hung(run_dir: Path, process: ProcessId) -> str:
    """Why ``process`` is gone when its hang timer found it hung holding the GIL (and ended it,
    or it was killed then: :meth:`titan.telemetry.watchdog.Watchdog.arm_hang_timer`), or ""
    when it did not."""
    hang = _hang_dump(run_dir, process)
    return f"{process.name()} is gone after {hang}" if hang else ""


def _hang_dump(run_dir: Path, process: ProcessId) -> str:
    """``a hang with no Python thread running (the GIL held) past 0:00:04; every thread's stack
    is in processes/0.stacks`` when ``process``'s hang timer dumped its stacks, else ""."""
    dump = read_hang(run_dir, process.process)
    if dump is None:
        return ""
    timeout = re.fullmatch(r"Timeout \(([0-9:.]+)\)!", dump)
    after = f" past {timeout.group(1)}" if timeout else ""
    stacks = hang_stacks_path(run_dir, process.process).relative_to(run_dir)
    return (
        f"a hang with no Python thread running (the GIL held){after}; every thread's stack is "
        f"in {stacks}"
    )


def _silence(process: ProcessId, age_s: float, allowance_s: float) -> str:
    """``process 0 (pid 1 on h): no heartbeat for 40 s (heartbeat allowance 30 s)``."""
    return (
        f"{process.name()}: no heartbeat for {age_s:.0f} s "
        f"(heartbeat allowance {allowance_s:.0f} s)"
    )


def _frozen(
    known: list[ProcessId], beat_at: dict[int, float], now: float, allowance_s: float
) -> str:
    """Why a process of this host that exists is unresponsive (its heartbeat is older than the
    allowance), or "" when none is."""
    for process in known:
        age = now - beat_at.get(process.process, now)
        if process.local and age > allowance_s:
            return (
                _silence(process, age, allowance_s)
                + "; it exists but does not run (stopped or frozen)"
            )
    return ""


def _earlier(beat: ProcessBeat, leader: ProcessId | None) -> bool:
    """Whether a beat is from an earlier attempt of the run: its process started well before
    this attempt's process 0 (the processes of one attempt start together)."""
    return leader is not None and beat.id.started < leader.started - HEARTBEAT_TIMEOUT_S


def _lost(
    known: list[ProcessId], beat_at: dict[int, float], now: float, allowance_s: float
) -> tuple[ProcessId | None, str]:
    """The first process that is gone and why: by its pid on this host, by its heartbeat's age
    (over ``allowance_s``) elsewhere (a process with neither check is taken as alive)."""
    for process in known:
        if process.local:
            why = process.gone()
        elif process.process in beat_at and now - beat_at[process.process] > allowance_s:
            age = now - beat_at[process.process]
            why = _silence(process, age, allowance_s) + "; its pid cannot be checked from this host"
        else:
            why = None
        if why is not None:
            return process, why
    return None, ""


def _control(leader: ProcessId | None) -> tuple[ProcessId | None, str]:
    """The process a stop signals, or why there is none."""
    if leader is None:
        return None, "the record names no process to signal"
    if not leader.local:
        return None, f"the run is on host {leader.host}, not this one: stop it there"
    return leader, ""


def _stderr_reason(run_dir: Path) -> str:
    """``: <last line of stderr.log>``, or "" when there is none."""
    with contextlib.suppress(OSError):
        with open_regular(Path(run_dir) / STDERR_LOG) as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(size - _STDERR_TAIL_BYTES, 0))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line]
            if lines:
                return f": {lines[-1].strip()}"
    return ""


def _last_write(run_dir: Path, last_event_at: float | None) -> float | None:
    """When a run without a recorded process last wrote (unix s): its last event's time, but
    never after the record's own modification time (an event time in the future, from a clock
    set wrong, would keep the run alive until then); without events, ``stderr.log``'s or the
    record's modification time."""
    written = _mtime(Path(run_dir) / EVENTS_FILE)
    if last_event_at is None:
        return _mtime(Path(run_dir) / STDERR_LOG) or written
    return last_event_at if written is None else min(last_event_at, written)


def _mtime(path: Path) -> float | None:
    """When ``path`` was last written (unix s), or None when it is missing."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
