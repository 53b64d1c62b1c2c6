"""The run dirs under a runs root, each with a summary of its record, newest first.

A runs root may hold 100k runs: the list reads the records of the :data:`RECENT_RUNS` run dirs
written to last (one ``stat`` per run dir finds them) and counts the rest; History lists every
run from the database. Call it from a worker, not the UI thread.
"""

from __future__ import annotations

import heapq
import math
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from titan.analysis.liveness import LAUNCH_FILE, STDERR_LOG, Liveness, judge
from titan.reading import open_regular
from titan.telemetry.records import EVENTS_FILE, EventTail
from tui.run_state import RunState

# Runs whose records the run list reads, at most: a few screenfuls. A short record is read in
# about 3 ms, so this bounds the list's time at any size of runs root, where the stat of each
# run dir costs about 5 us (bench/console.py --scale: run_list_open_s).
RECENT_RUNS = 100
# The files that make a folder a run dir, the first that exists giving its last write.
_RUN_FILES = (EVENTS_FILE, LAUNCH_FILE, STDERR_LOG)


@dataclass(frozen=True)
class RunSummary:
    """One run dir and its state.

    Attributes:
        run_dir: the run dir.
        state: its events folded into a :class:`~tui.run_state.RunState`.
        created_at: unix seconds of its first event, or the dir's mtime when it has none yet.
        liveness: its state (:func:`titan.analysis.liveness.judge`).
        read_bytes, unread_bytes: bytes of its record read, and not read yet (0: ``state``
            holds all of it).
    """

    run_dir: Path
    state: RunState
    created_at: float
    liveness: Liveness
    read_bytes: int = 0
    unread_bytes: int = 0

    @property
    def read_fraction(self) -> float:
        """The part of the record read, 0 to 1."""
        size = self.read_bytes + self.unread_bytes
        return 1.0 if not size else self.read_bytes / size

    @property
    def status(self) -> str:
        """The status the list shows, filters and orders by: the run's state, or ``reading
        N%`` while its record is not all read (the state so far may be an earlier attempt's)."""
        if self.unread_bytes:
            return f"reading {self.read_fraction:.0%}"
        return self.liveness.state


@dataclass(frozen=True)
class RunListing:
    """The run list: the summaries of the most recently written run dirs, newest first, and
    how many run dirs the runs root holds in all (``total > len(summaries)`` when some are
    left out)."""

    summaries: list[RunSummary]
    total: int


def _last_write(run_dir: str, root_fd: int) -> float | None:
    """``st_mtime`` of the run dir's record (``events.jsonl``, else the launch record, else
    ``stderr.log``), or None when the run dir (a name in the runs root open as ``root_fd``)
    holds none of them as a file: a run dir has a run record, or at least what a console
    wrote starting its child. Each ``stat`` is relative to the open runs root, which spares the
    kernel the walk of its path (about a quarter of the time at 100k run dirs)."""
    for name in _RUN_FILES:
        try:
            info = os.stat(f"{run_dir}{os.sep}{name}", dir_fd=root_fd)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            return info.st_mtime
    return None


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether a runs root's entry is a folder (or a link to one); a link loop is none."""
    try:
        return entry.is_dir()
    except OSError:  # ELOOP: the link names itself
        return False


def _recent_run_dirs(runs_root: Path, limit: int) -> tuple[list[Path], int]:
    """The ``limit`` run dirs written to last, and the number of run dirs."""
    written = []
    root_fd = os.open(runs_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(root_fd) as entries:
            for entry in entries:
                if _is_dir(entry):
                    mtime = _last_write(entry.name, root_fd)
                    if mtime is not None:
                        written.append((mtime, entry.name))
    finally:
        os.close(root_fd)
    recent = heapq.nlargest(limit, written)
    return [runs_root / name for _, name in recent], len(written)


# One read of a record: a listing folds a record slice by slice, so its memory stays bounded
# whatever the record's size (a 180 MB record read whole held 1.4 GB of parsed events).
READ_SLICE_BYTES = 1 << 20
# The first bytes of a record that tell it from another made in its place (its run_start).
IDENTITY_BYTES = 4096


def record_head(path: Path) -> bytes:
    """The first :data:`IDENTITY_BYTES` of ``path`` (empty when it cannot be read)."""
    try:
        with open_regular(path) as f:
            return f.read(IDENTITY_BYTES)
    except OSError:
        return b""


@dataclass
class _Record:
    """A run dir's record as folded so far: its reader, the file it read, the state."""

    tail: EventTail
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
    size: int = 0  # the file's size at the last look
    mtime_ns: int = 0  # and its modification time
    head: bytes = b""  # its first IDENTITY_BYTES (fewer while it is shorter)
    state: RunState = field(default_factory=RunState)
    shown: RunState = field(default_factory=RunState)  # the snapshot listings hand out
    created_at: float | None = None

    @classmethod
    def of(cls, run_dir: Path, known: _Record | None) -> _Record:
        """``known`` with the events file looked at, or a fresh record when there is none, or
        the file is another: another inode, shorter than what was read, or other first bytes
        (a file made anew can take the inode of the one removed)."""
        path = run_dir / EVENTS_FILE
        try:
            info = os.stat(path)
        except OSError:  # no record (yet, or any more)
            return cls(EventTail(path))
        if known is not None and (known.size, known.mtime_ns) == (info.st_size, info.st_mtime_ns):
            return known
        identity, head = (info.st_dev, info.st_ino), record_head(path)
        if (
            known is None
            or identity != known.identity
            or info.st_size < known.tail.offset
            or head[: len(known.head)] != known.head
        ):
            known = cls(EventTail(path), identity)
        known.size, known.mtime_ns, known.head = info.st_size, info.st_mtime_ns, head
        return known

    def unread(self) -> int:
        """Bytes of the events file not folded yet (as of the last look)."""
        return max(self.size - self.tail.offset, 0)

    def read(self, deadline: float, first: bool) -> bool:
        """Fold slices of what is unread until it is all read or ``deadline`` passes (after
        one slice at least when ``first``); returns whether it read any."""
        changed = False
        while self.tail.offset < self.size and (first or time.monotonic() < deadline):
            first = False
            before = self.tail.offset
            events = self.tail.read_new_events(READ_SLICE_BYTES)
            if self.created_at is None and events:
                self.created_at = events[0].written_time
            self.state.apply(events)
            changed = True
            if self.tail.offset == before:  # unreadable (a directory, say): no more to read
                self.size = before
                break
        if changed:
            self.shown = self.state.snapshot()
        return changed


# The records of a runs root as folded so far, by run dir (kept by the caller between listings).
RecordCache = dict[Path, _Record]


def list_runs(
    runs_root: Path,
    limit: int = RECENT_RUNS,
    cache: RecordCache | None = None,
    budget_s: float = math.inf,
) -> RunListing:
    """Summaries of the ``limit`` run dirs directly under ``runs_root`` whose record was
    written last, newest first by their first event (empty when the folder does not exist).
    Every run is judged anew (:func:`~titan.analysis.liveness.judge`). ``cache`` (kept by the
    caller between listings) holds each record folded so far, so that a listing reads only
    what was appended since the last one. Records are read, the smallest remainder first,
    until every one is read or ``budget_s`` seconds have passed (a slice at least, so that
    listings always progress); a summary then says how much of its record is left
    (``unread_bytes``) and the next listing goes on from there."""
    if not runs_root.is_dir():
        return RunListing([], 0)
    run_dirs, total = _recent_run_dirs(runs_root, limit)
    cache = {} if cache is None else cache
    records = [_Record.of(d, cache.get(d)) for d in run_dirs]
    cache.update(zip(run_dirs, records, strict=True))
    deadline, read = time.monotonic() + budget_s, False
    for record in sorted(records, key=_Record.unread):
        read = record.read(deadline, first=not read) or read
    summaries = [
        RunSummary(
            run_dir,
            record.shown,
            record.created_at or _mtime(run_dir),
            judge(run_dir, record.shown.facts),
            record.tail.offset,
            record.unread(),
        )
        for run_dir, record in zip(run_dirs, records, strict=True)
    ]
    for gone in set(cache) - set(run_dirs):
        del cache[gone]
    summaries.sort(key=lambda s: s.created_at, reverse=True)
    return RunListing(summaries, total)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
