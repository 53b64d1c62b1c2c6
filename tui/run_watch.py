"""Background polling of one run dir: new events, the child's exit code, the stderr tail and
the run's liveness (:func:`titan.observability.liveness.judge`, at most every
:data:`LIVENESS_INTERVAL_S`).

:class:`RunWatcher` does the file reads; the monitor calls :meth:`RunWatcher.poll` from a thread
worker every :data:`POLL_INTERVAL_S` and posts what changed to the UI thread, which only draws.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from titan.observability.events import Event, RunEnd, RunStart
from titan.observability.liveness import STDERR_LOG, Liveness, RecordFacts, judge
from titan.observability.records import EVENTS_FILE, EventTail, open_regular
from tui.launcher import LaunchedRun

# A stat of the record every 0.1 s costs microseconds and puts a step on screen well within
# 250 ms; the file is opened only when the stat shows it grew, and the monitor batches repaints
# (a burst of events is drawn once).
POLL_INTERVAL_S = 0.1
STDERR_TAIL_LINES = 8
# The run's processes are checked this often (a few stats and reads of /proc): the state it
# shows is at most this old, plus a poll.
LIVENESS_INTERVAL_S = 1.0
# Bytes read from the end of stderr.log to find its last lines.
_STDERR_TAIL_BYTES = 16_384


@dataclass(frozen=True)
class RunUpdate:
    """What changed in a run since the previous poll.

    Attributes:
        events: new complete events, in file order (typed; lines that are not events skipped).
        returncode: the child's exit code; ``None`` while it runs or when the run was not
            launched by this console.
        stderr_tail: the last lines of ``stderr.log`` (empty when there is none).
        liveness: the run's state, from the record and its processes (None: not judged yet).
    """

    events: list[Event] = field(default_factory=list)
    returncode: int | None = None
    stderr_tail: tuple[str, ...] = ()
    liveness: Liveness | None = None


class RunWatcher:
    """Incremental reader of a run dir (not thread-safe: one worker owns it).

    Args:
        run_dir: the run dir to follow.
        launched: the child when this console started the run, else ``None``.
    """

    def __init__(self, run_dir: Path, launched: LaunchedRun | None = None) -> None:
        self._events = EventTail(Path(run_dir) / EVENTS_FILE)
        self._stderr_path = Path(run_dir) / STDERR_LOG
        self._launched = launched
        self._stderr_size: int | None = None
        self._stderr_tail: tuple[str, ...] = ()
        self._returncode: int | None = None
        self._run_dir = Path(run_dir)
        self._facts = RecordFacts()
        self._liveness: Liveness | None = None
        self._judged_at = -LIVENESS_INTERVAL_S
        self._ended = False
        self.done = False
        """True once nothing more can change: the child exited (and its last events were read),
        or, for a run not launched here, ``run_end`` was read."""

    def poll(self) -> RunUpdate | None:
        """Read what changed; ``None`` when nothing did. Never blocks on the child."""
        # Exit code first: once the child is gone, the events read below are all it wrote.
        returncode = self._launched.returncode() if self._launched else None
        grew = (_size(self._events.path) or 0) > self._events.offset
        events = self._events.read_new_events() if grew else []
        self._facts = self._facts.fold(events)
        for event in events:
            if isinstance(event, RunStart | RunEnd):
                self._ended = isinstance(event, RunEnd)
        stderr_changed = self._read_stderr_tail()
        judged = self._judge(bool(events) or returncode != self._returncode)
        self.done = returncode is not None if self._launched else self._ended
        if not events and not stderr_changed and returncode == self._returncode and not judged:
            return None
        self._returncode = returncode
        return RunUpdate(events, returncode, self._stderr_tail, self._liveness)

    def _judge(self, now_due: bool) -> bool:
        """Judge the run again when an interval has passed (or ``now_due``); returns whether
        its state or reason changed."""
        clock = time.monotonic()
        if not now_due and clock - self._judged_at < LIVENESS_INTERVAL_S:
            return False
        self._judged_at = clock
        before = self._liveness
        failed = self._launched.failed_start() if self._launched else None
        self._liveness = failed or judge(self._run_dir, self._facts)
        if before is None:
            return True
        return (before.state, before.reason, before.processes) != (
            self._liveness.state,
            self._liveness.reason,
            self._liveness.processes,
        )

    def _read_stderr_tail(self) -> bool:
        """Refresh the stderr tail when the file's size changed (or from the error kept of a
        launch whose run dir was removed at start-up); returns whether it did."""
        if self._launched is not None and self._launched.startup_error is not None:
            tail = tuple(self._launched.startup_error.splitlines()[-STDERR_TAIL_LINES:])
            changed, self._stderr_tail = tail != self._stderr_tail, tail
            return changed
        size = _size(self._stderr_path)
        if size is None or size == self._stderr_size:
            return False
        self._stderr_size = size
        try:
            with open_regular(self._stderr_path) as f:
                f.seek(max(size - _STDERR_TAIL_BYTES, 0))
                text = f.read().decode("utf-8", errors="replace")
        except OSError as err:  # a directory, a FIFO, unreadable: say so instead of a tail
            text = f"cannot read {STDERR_LOG}: {err.strerror or err}"
        self._stderr_tail = tuple(text.splitlines()[-STDERR_TAIL_LINES:])
        return True


def _size(path: Path) -> int | None:
    """The size of ``path`` in bytes from a stat (no open, no read); ``None`` when missing."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None
