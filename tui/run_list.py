"""The run dirs under a runs root, each with a summary of its record, newest first.

A runs root may hold 100k runs: the list reads the records of the :data:`RECENT_RUNS` run dirs
written to last (one ``stat`` per run dir finds them) and counts the rest; History lists every
run from the database. Call it from a worker, not the UI thread.
"""

from __future__ import annotations

import heapq
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from titan.analysis.liveness import LAUNCH_FILE, STDERR_LOG, Liveness, judge
from titan.telemetry.records import EVENTS_FILE, load_events
from tui.run_state import RunState

# Runs whose records the run list reads, at most: a few screenfuls. A record is read whole
# (about 3 ms for a short one), so this bounds the list's time at any size of runs root, where
# the stat of each run dir costs about 5 us (bench/console.py --scale: run_list_open_s).
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
    """

    run_dir: Path
    state: RunState
    created_at: float
    liveness: Liveness


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


def _recent_run_dirs(runs_root: Path, limit: int) -> tuple[list[Path], int]:
    """The ``limit`` run dirs written to last, and the number of run dirs."""
    written = []
    root_fd = os.open(runs_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(root_fd) as entries:
            for entry in entries:
                if entry.is_dir():
                    mtime = _last_write(entry.name, root_fd)
                    if mtime is not None:
                        written.append((mtime, entry.name))
    finally:
        os.close(root_fd)
    recent = heapq.nlargest(limit, written)
    return [runs_root / name for _, name in recent], len(written)


# A run dir's folded record as last read, by the stat key (size, mtime_ns) of its events file.
RecordCache = dict[Path, tuple[tuple[int, int] | None, RunState, float]]


def list_runs(
    runs_root: Path, limit: int = RECENT_RUNS, cache: RecordCache | None = None
) -> RunListing:
    """Summaries of the ``limit`` run dirs directly under ``runs_root`` whose record was
    written last, newest first by their first event (empty when the folder does not exist).
    Every run is judged anew (:func:`~titan.analysis.liveness.judge`); ``cache`` (kept by
    the caller between listings) spares reading again a record whose events file has not
    changed, so that a listing every few seconds costs a ``stat`` per unchanged run."""
    if not runs_root.is_dir():
        return RunListing([], 0)
    run_dirs, total = _recent_run_dirs(runs_root, limit)
    cache = {} if cache is None else cache
    summaries = []
    for run_dir in run_dirs:
        key = _record_key(run_dir)
        cached = cache.get(run_dir)
        if cached is None or cached[0] != key or key is None:
            events = load_events(run_dir)
            state = RunState()
            state.apply(events)
            created_at = events[0].written_time if events else run_dir.stat().st_mtime
            cached = cache[run_dir] = (key, state, created_at)
        _, state, created_at = cached
        summaries.append(RunSummary(run_dir, state, created_at, judge(run_dir, state.facts)))
    for gone in set(cache) - set(run_dirs):
        del cache[gone]
    summaries.sort(key=lambda s: s.created_at, reverse=True)
    return RunListing(summaries, total)


def _record_key(run_dir: Path) -> tuple[int, int] | None:
    """(size, st_mtime_ns) of the run's events file, None when it has none."""
    try:
        info = os.stat(run_dir / EVENTS_FILE)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns)
