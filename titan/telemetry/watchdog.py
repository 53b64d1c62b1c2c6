"""Stall watchdog: a heartbeat thread that watches which phase the training loop is in.

The loop marks its phase (:data:`PHASES`) with :meth:`Watchdog.enter`, a plain attribute write
(no event, no lock), and reports each measured step time with :meth:`Watchdog.step_done`. A
background thread wakes every ``poll_s`` and compares the time spent in the current phase with
that phase's allowance (:meth:`Watchdog.threshold_s`):

- ``step`` and ``data_wait``: ``max(floor_s, factor x median of the last`` :data:`WINDOW`
  ``step times)``; before any step time is known (the first step may still compile, and an
  MPMD stage compiles on first use), the compile allowance.
- ``compile``, ``checkpoint_save``, ``checkpoint_restore``: ``max(`` :data:`LONG_PHASE_MIN_S`
  ``, LONG_PHASE_FLOORS x floor_s)``, so first compilation, recompilation and a slow
  filesystem are not false alarms.
- ``idle`` (outside the loop): never stalls.

A stall calls ``on_stall`` once per phase entry with a ``stall`` event
(:class:`titan.telemetry.events.Stall`) holding the phase, the time spent, the allowance,
the step and every thread's Python stack.

The thread needs the GIL, so a loop stuck in a call that holds it (a C extension that never
releases it) is never seen by it. For that case :meth:`Watchdog.arm_hang_timer` re-arms, at
each phase entry, :func:`faulthandler.dump_traceback_later`, a timer thread of CPython's own
that needs no GIL: if neither the next phase entry nor the watchdog thread's stall (proof that
Python code still runs) comes within the phase's allowance plus a grace, it writes every
thread's stack to the run's ``processes/<id>.stacks`` and, where a stall ends the run
(``--watchdog-abort``), ends the process (exit code 1); the run's liveness
(:mod:`titan.analysis.liveness`) then says why the process is gone. A process that runs on after
a dump (it was only stopped, ``SIGSTOP``, and continued) empties the file at its next phase.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from titan.telemetry.events import Stall
from titan.telemetry.interval_thread import Ticker

PHASES = (
    "idle",
    "compile",
    "checkpoint_restore",
    "data_wait",
    "step",
    "checkpoint_save",
    "eval",
)
# eval: the first evaluation compiles its forward pass
LONG_PHASES = frozenset({"compile", "checkpoint_save", "checkpoint_restore", "eval"})
WINDOW = 20  # step times in the rolling median
LONG_PHASE_FLOORS = 20  # compile and checkpoint allowance, in floors
LONG_PHASE_MIN_S = 30.0  # and never under this many seconds


_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _import_path(filename: str) -> str:
    """``filename`` relative to the ``sys.path`` entry it is imported from
    (``titan/trainer/train.py``, ``threading.py``), so records name no machine's folders."""
    candidates = [*sys.path, str(_SOURCE_ROOT)]
    roots = [p for p in candidates if p and filename.startswith(p.rstrip("/") + "/")]
    return filename[len(max(roots, key=len).rstrip("/")) + 1 :] if roots else filename


def _stack(frame: Any) -> list[str]:
    frames = traceback.extract_stack(frame)
    for summary in frames:
        summary.filename = _import_path(summary.filename)
    return [line.rstrip("\n") for line in traceback.format_list(frames)]


def thread_stacks() -> list[dict[str, Any]]:
    """The current Python stack of every thread (``sys._current_frames``), file names relative
    to their import root."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return [
        {"thread": names.get(ident, "?"), "ident": ident, "stack": _stack(frame)}
        for ident, frame in sys._current_frames().items()
    ]


class Watchdog:
    """Detects a training loop stuck in one phase.

    Args:
        floor_s: smallest step allowance, seconds (``--watchdog-floor``).
        factor: step allowance in median step times (``--watchdog-factor``).
        on_stall: called (from the watchdog thread) with each :class:`Stall`.
        clock: monotonic seconds; tests pass a fake one and call :meth:`check` directly.
        poll_s: heartbeat interval of the thread (default: ``floor_s / 4``, at most 1 s).
    """

    def __init__(
        self,
        floor_s: float,
        factor: float,
        on_stall: Callable[[Stall], None],
        clock: Callable[[], float] = time.monotonic,
        poll_s: float | None = None,
    ) -> None:
        self.floor_s = floor_s
        self.factor = factor
        self.on_stall = on_stall
        self.clock = clock
        self.poll_s = poll_s if poll_s is not None else min(1.0, floor_s / 4)
        self._step_times: deque[float] = deque(maxlen=WINDOW)
        # (phase, step, entered at, entry number): replaced as one tuple, read as one.
        self._phase: tuple[str, int, float, int] = ("idle", 0, clock(), 0)
        self._reported_entry = -1
        self.heartbeat = Ticker(self.poll_s, self._beat, "titan-watchdog")
        self._hang: tuple[IO[Any], float, bool] | None = None

    def arm_hang_timer(self, stacks: IO[Any], grace_s: float, end: bool) -> None:
        """From the next phase entry on, watch for a hang holding the GIL (module docstring):
        :func:`faulthandler.dump_traceback_later` of the phase's allowance plus ``grace_s``
        seconds writes every thread's stack to ``stacks`` (an open file, kept open until
        :meth:`stop`) and, with ``end``, ends the process."""
        self._hang = (stacks, grace_s, end)

    def enter(self, phase: str, step: int) -> None:
        """The loop enters ``phase`` working on ``step`` (and the hang timer, when armed, is
        re-armed for it)."""
        self._phase = (phase, step, self.clock(), self._phase[3] + 1)
        if self._hang is not None:
            stacks, grace_s, end = self._hang
            fd = stacks.fileno()
            if os.fstat(fd).st_size:  # a dump of a process that ran on: no hang to tell of
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
            allowance_s = self.threshold_s(phase)
            if allowance_s == float("inf"):
                faulthandler.cancel_dump_traceback_later()
            else:
                faulthandler.dump_traceback_later(allowance_s + grace_s, exit=end, file=stacks)

    def step_done(self, step_time_s: float) -> None:
        """A step completed in ``step_time_s`` seconds (feeds the rolling median)."""
        self._step_times.append(step_time_s)

    def threshold_s(self, phase: str) -> float:
        """Seconds ``phase`` may last before it counts as stalled (``inf`` for ``idle``).

        Raises:
            ValueError: ``phase`` not in :data:`PHASES`.
        """
        if phase not in PHASES:
            raise ValueError(f"watchdog phase must be one of {PHASES}, got {phase!r}")
        long_phase_s = max(LONG_PHASE_MIN_S, LONG_PHASE_FLOORS * self.floor_s)
        if phase == "idle":
            return float("inf")
        if phase in LONG_PHASES or not self._step_times:
            return long_phase_s
        return max(self.floor_s, self.factor * statistics.median(self._step_times))

    def check(self) -> Stall | None:
        """The stall of the current phase, once per phase entry; None while within allowance."""
        phase, step, entered, entry = self._phase
        elapsed_s = self.clock() - entered
        threshold_s = self.threshold_s(phase)
        if elapsed_s <= threshold_s or entry == self._reported_entry:
            return None
        self._reported_entry = entry
        if self._hang is not None:  # Python code runs: the stall is this thread's to report
            faulthandler.cancel_dump_traceback_later()
        return Stall(
            phase=phase,
            elapsed_s=elapsed_s,
            threshold_s=threshold_s,
            step=step,
            stacks=thread_stacks(),
        )

    def start(self) -> None:
        """Start the heartbeat thread."""
        self.heartbeat.start()

    def stop(self) -> None:
        """Stop the heartbeat thread and wait for it, and the hang timer."""
        self.heartbeat.stop()
        if self._hang is not None:
            faulthandler.cancel_dump_traceback_later()
            self._hang = None

    def _beat(self) -> None:
        stall = self.check()
        if stall is not None:
            self.on_stall(stall)
