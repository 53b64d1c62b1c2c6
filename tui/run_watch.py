"""Background polling of one run dir: new events folded into a :class:`~tui.run_state.RunState`,
the child's exit code, the stderr tail and the run's liveness
(:func:`titan.analysis.liveness.judge`, at most every :data:`LIVENESS_INTERVAL_S` unless
the record's facts change).

:class:`RunWatcher` does the file reads, the parsing and the folding; the monitor calls
:meth:`RunWatcher.poll` from a thread worker every :data:`POLL_INTERVAL_S` and posts a snapshot
of what changed to the UI thread, which only draws. It keeps up with a run that writes faster
than it can be parsed:

- each poll parses slices of at most :data:`READ_SLICE_BYTES` of ``events.jsonl`` for at most
  :data:`PARSE_BUDGET_S` of the worker's CPU (a quarter of it while the newest lines keep
  coming), so a poll never takes long and the UI thread gets the interpreter between polls;
- when more than a slice is left to read, the newest complete lines (the last
  :data:`HEAD_BYTES` of the file) are parsed as well and folded into a copy of the state: the
  newest step is what is shown, while the history behind it (the curves, the counters) fills
  in slice by slice;
- the state keeps summaries, not events (:mod:`tui.run_state`), and stderr is read by its tail,
  so memory does not grow with the record.

The watcher follows the run, not one attempt: it keeps polling after ``run_end``, and a resume's
``run_start`` (from this console or any other) is followed like the first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from titan.analysis.liveness import STDERR_LOG, Liveness, RecordFacts, judge
from titan.reading import open_regular
from titan.telemetry.events import Event
from titan.telemetry.records import EVENTS_FILE, EventTail, read_last_events
from tui.launcher import STDOUT_LOG, LaunchedRun
from tui.run_list import IDENTITY_BYTES, record_head
from tui.run_state import RunState

# A stat of the record every 0.1 s costs microseconds and puts a step on screen well within
# 250 ms; the file is opened only when the stat shows it grew, and the monitor batches repaints
# (a burst of events is drawn once).
POLL_INTERVAL_S = 0.1
STDERR_TAIL_LINES = 8
# The run's processes are checked this often (a few stats and reads of /proc): the state it
# shows is at most this old, plus a poll.
LIVENESS_INTERVAL_S = 1.0
# Bytes read from the end of stderr.log (or stdout.log) to find its last lines.
_LOG_TAIL_BYTES = 16_384
# One read of events.jsonl: about 170 step lines of 380 bytes.
READ_SLICE_BYTES = 65_536
# CPU seconds of the worker thread spent parsing per poll at most (then it sleeps a poll
# interval): at most about a third of the interpreter's time while a flood is read.
PARSE_BUDGET_S = 0.04
# The newest bytes of the record parsed when more than a slice is left to read: a few dozen
# step lines, enough for the newest step, loss and rate.
HEAD_BYTES = 16_384


@dataclass(frozen=True)
class RunUpdate:
    """What changed in a run since the previous poll.

    Attributes:
        state: a snapshot of the run's state (:meth:`RunState.snapshot`) when events were read,
            else ``None``; while history is being filled in, it holds the newest events too.
        returncode: the child's exit code; ``None`` while it runs, when the run was not
            launched by this console, or once another attempt has started.
        stderr_tail: the last lines of ``stderr.log`` (empty when there is none).
        stdout_line: the last line of ``stdout.log``, where the trainer says what it is doing
            while it starts (its phases, tokenization's progress); "" when there is none.
        liveness: the run's state, from the record and its processes (None: not judged yet).
        unread_bytes: bytes of ``events.jsonl`` not yet folded into the history (0: caught up).
    """

    state: RunState | None = None
    returncode: int | None = None
    stderr_tail: tuple[str, ...] = ()
    stdout_line: str = ""
    liveness: Liveness | None = None
    unread_bytes: int = 0


class RunWatcher:
    """Incremental reader of a run dir (not thread-safe: one worker owns it).

    Args:
        run_dir: the run dir to follow.
        launched: the child when this console started the run, else ``None``.
    """

    def __init__(self, run_dir: Path, launched: LaunchedRun | None = None) -> None:
        self._stderr = _LogTail(Path(run_dir) / STDERR_LOG, STDERR_TAIL_LINES)
        self._stdout = _LogTail(Path(run_dir) / STDOUT_LOG, 1)
        self._launched = launched
        self._stderr_tail: tuple[str, ...] = ()
        self._returncode: int | None = None
        self._run_dir = Path(run_dir)
        self._judged_facts: tuple | None = None
        self._liveness: Liveness | None = None
        self._judged_at = -LIVENESS_INTERVAL_S
        self._start_record()

    def _start_record(self) -> None:
        """Read the record from its start, as a new one (at first, and when it was replaced)."""
        self._events = EventTail(self._run_dir / EVENTS_FILE)
        self._history = RunState()
        self._facts = RecordFacts()  # of the newest events read
        self._exit_size: int | None = None  # the record's size when the child's exit was seen
        self._attempts_at_exit: int | None = None  # attempts once all the child wrote was read
        self._head: list[Event] = []  # the newest events, while the history is behind them
        self._head_start = 0  # where the head's first line starts in the file
        self._head_end = 0  # the file's size when the head was read
        self._seen: tuple[int, int, bytes] | None = None  # (device, inode, first bytes) read
        self._seen_size = 0

    def poll(self) -> RunUpdate | None:
        """Read what changed; ``None`` when nothing did. Never blocks on the child."""
        # Exit code first: once the child is gone, the events read below are all it wrote.
        returncode = self._launched.returncode() if self._launched else None
        status = _stat(self._events.path)
        replaced = self._replaced(status)
        if replaced:  # shrunk, another file, or gone: what was read is no longer the record
            self._start_record()
        size = status.st_size if status is not None else 0
        if returncode is not None and self._exit_size is None:
            self._exit_size = size
        # The newest lines first; while they keep coming, the history is read at a slower pace
        # (the UI thread has the interpreter for the keys).
        head = self._read_head(size)
        budget = PARSE_BUDGET_S / 4 if head else PARSE_BUDGET_S
        read = self._read_history(size, budget) or head or replaced
        self._remember(status)
        state = None
        if read:
            state = self._history.snapshot()
            state.apply(self._head)
            self._facts = state.facts
            if self._resumed_elsewhere(state):
                self._launched, returncode = None, None
        logs_changed = self._read_stderr_tail() | self._stdout.read()
        judged = self._judge(self._facts, returncode != self._returncode)
        if not read and not logs_changed and returncode == self._returncode and not judged:
            return None
        self._returncode = returncode
        unread = max(size - self._events.offset, 0)
        stdout_line = self._stdout.tail[-1] if self._stdout.tail else ""
        return RunUpdate(state, returncode, self._stderr_tail, stdout_line, self._liveness, unread)

    def _replaced(self, status: os.stat_result | None) -> bool:
        """Whether the record read so far is no longer the file: it is gone, shrank, is
        another file (inode), or its first bytes changed (a copy over it: read only when its
        size changed)."""
        if self._seen is None:
            return False
        if status is None or status.st_size < self._events.offset:
            return True
        if (status.st_dev, status.st_ino) != self._seen[:2]:
            return True
        if status.st_size == self._seen_size:
            return False
        seen = self._seen[2]
        return record_head(self._events.path)[: len(seen)] != seen

    def _remember(self, status: os.stat_result | None) -> None:
        """Keep what tells the record read so far apart from a replacement."""
        if status is None or self._events.offset == 0:
            return
        short = self._seen is None or len(self._seen[2]) < IDENTITY_BYTES
        if short and status.st_size != self._seen_size:  # a record shorter than them grew
            self._seen = (status.st_dev, status.st_ino, record_head(self._events.path))
        self._seen_size = status.st_size

    def _read_history(self, size: int, budget_s: float) -> bool:
        """Fold the next slices of the record into the history, for at most ``budget_s`` of
        CPU; returns whether any bytes were read."""
        start_offset, start_cpu = self._events.offset, time.thread_time()
        # Until all the exited child wrote is read, not past it (see _resumed_elsewhere).
        exit_size = self._exit_size if self._attempts_at_exit is None else None
        end = size if exit_size is None else min(size, exit_size)
        while end > self._events.offset and time.thread_time() - start_cpu < budget_s:
            before = self._events.offset
            slice_bytes = min(READ_SLICE_BYTES, end - before)
            self._history.apply(self._events.read_new_events(slice_bytes))
            if self._events.offset == before:  # unreadable, or shrunk under us
                break
        if exit_size is not None and self._events.offset >= exit_size:
            self._attempts_at_exit = self._history.attempts
        if self._head and self._events.offset >= self._head_start:
            self._head = []  # the history has caught up with the head
        return self._events.offset != start_offset

    def _read_head(self, size: int) -> bool:
        """Read the newest lines when the history is more than a slice behind them and the
        file grew since they were read; returns whether it read them."""
        if size - self._events.offset <= READ_SLICE_BYTES or size == self._head_end:
            return False
        start, events = read_last_events(self._events.path, size, HEAD_BYTES)
        self._head_end = size
        if start < self._events.offset or not events:
            return False
        self._head, self._head_start = events, start
        return True

    def _resumed_elsewhere(self, state: RunState) -> bool:
        """Whether an attempt started after this console's child exited (a resume from
        another console or a shell): the run is that attempt now, and the child's exit code no
        longer describes it. Counted once everything the child wrote has been read."""
        if self._launched is None or self._attempts_at_exit is None:
            return False
        return state.attempts > self._attempts_at_exit

    def _judge(self, facts: RecordFacts, now_due: bool) -> bool:
        """Judge the run again when an interval has passed, ``now_due``, or the record's facts
        other than its latest time changed; returns whether its state or reason changed."""
        clock = time.monotonic()
        key = (facts.started, facts.process, facts.end_status, facts.end_error, facts.stalled)
        if (
            not now_due
            and key == self._judged_facts
            and clock - self._judged_at < LIVENESS_INTERVAL_S
        ):
            return False
        self._judged_at, self._judged_facts = clock, key
        before = self._liveness
        failed = self._launched.failed_start() if self._launched else None
        self._liveness = failed or judge(self._run_dir, facts)
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
        if not self._stderr.read():
            return False
        self._stderr_tail = self._stderr.tail
        return True


class _LogTail:
    """The last ``lines`` lines of a log file, read again when its size changed."""

    def __init__(self, path: Path, lines: int) -> None:
        self.path, self.lines = path, lines
        self.size: int | None = None
        self.tail: tuple[str, ...] = ()

    def read(self) -> bool:
        """Refresh :attr:`tail` if the file's size changed; returns whether it did."""
        status = _stat(self.path)
        size = status.st_size if status is not None else None
        if size is None or size == self.size:
            return False
        self.size = size
        try:
            with open_regular(self.path) as f:
                f.seek(max(size - _LOG_TAIL_BYTES, 0))
                text = f.read(_LOG_TAIL_BYTES).decode("utf-8", errors="replace")
        except OSError as err:  # a directory, a FIFO, unreadable: say so instead of a tail
            text = f"cannot read {self.path.name}: {err.strerror or err}"
        self.tail = tuple(text.splitlines()[-self.lines :])
        return True


def _stat(path: Path) -> os.stat_result | None:
    """``os.stat(path)`` (no open, no read); ``None`` when it is missing or cannot be read."""
    try:
        return os.stat(path)
    except OSError:
        return None
