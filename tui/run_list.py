"""The run dirs under a runs root, each with a summary of its record, newest first.

Reads every listed run's ``events.jsonl``: call it from a worker, not the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from titan.observability.liveness import LAUNCH_FILE, STDERR_LOG, Liveness, judge
from titan.observability.records import EVENTS_FILE, load_events
from tui.run_state import RunState


@dataclass(frozen=True)
class RunSummary:
    """One run dir and its state.

    Attributes:
        run_dir: the run dir.
        state: its events folded into a :class:`~tui.run_state.RunState`.
        created_at: unix seconds of its first event, or the dir's mtime when it has none yet.
        liveness: its state (:func:`titan.observability.liveness.judge`).
    """

    run_dir: Path
    state: RunState
    created_at: float
    liveness: Liveness


def is_run_dir(path: Path) -> bool:
    """A run dir has a run record, or at least what a console wrote starting its child."""
    return path.is_dir() and any(
        (path / name).is_file() for name in (EVENTS_FILE, LAUNCH_FILE, STDERR_LOG)
    )


def list_runs(runs_root: Path) -> list[RunSummary]:
    """Summaries of the run dirs directly under ``runs_root``, newest first (empty when the
    folder does not exist)."""
    if not runs_root.is_dir():
        return []
    summaries = []
    for run_dir in filter(is_run_dir, runs_root.iterdir()):
        events = load_events(run_dir)
        state = RunState()
        state.apply(events)
        created_at = events[0].time if events else run_dir.stat().st_mtime
        summaries.append(RunSummary(run_dir, state, created_at, judge(run_dir, state.facts)))
    return sorted(summaries, key=lambda s: s.created_at, reverse=True)
