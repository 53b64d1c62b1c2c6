"""Run records made by hand for the tests of their readers (ETTR, ``titan summarize``, the
console's History): a constructed crash-and-resume run, a record written to a runs root, and a
runs root made read-only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from titan.telemetry.records import EVENTS_FILE, SCHEMA


def event(event_type: str, time_s: float, *, run_id: str = "test-run", **fields) -> dict:
    """One event of run ``run_id`` as the trainer writes it (a line of ``events.jsonl``)."""
    return {"schema": SCHEMA, "type": event_type, "time": time_s, "run_id": run_id, **fields}


def run_event(kind: str, time: float, **fields) -> dict:
    """One event of run ``r`` (:func:`event`)."""
    return event(kind, time, run_id="r", **fields)


def crash_then_resume() -> list[dict]:
    """Attempt 0 (fresh) checkpoints step 2, runs steps 3 and 4 and crashes; attempt 1 resumes
    from step 2 after an 83.5 s gap, redoes steps 3 and 4 and completes at step 6.

    Attempt 0, wall 1016.5 - 1000 = 16.5 s: initialization 1002 - 1000 = 2 (compile ends at
    1012 after 10 s); steps 1-4 of 1.0, 1.0, 1.5 (0.5 of it the step-2 save) and 1.0 (0.25 of it
    data wait). Attempt 1, wall 12.5 s: restore 1103 - 1100 = 3, compile 5, steps 3-6 of 1.0,
    1.0, 1.4 (0.4 save), 1.0, then a 0.1 s save and run_end.
    """
    return [
        run_event("run_start", 1000.0, start_step=0, resumed_from_step=None, total_steps=6),
        run_event("compile", 1012.0, what="train_step", seconds=10.0),
        run_event("step", 1013.0, step=1, step_time_s=1.0, loss=5.0),
        run_event("step", 1014.0, step=2, step_time_s=1.0, loss=4.0),
        run_event("checkpoint", 1014.5, step=2, seconds=0.5, path="c/2"),
        run_event("step", 1015.5, step=3, step_time_s=1.5, loss=3.5, future_field={"x": 1}),
        run_event("stall", 1016.0, phase="step", elapsed_s=30.0, threshold_s=20.0, stacks="..."),
        run_event("step", 1016.5, step=4, step_time_s=1.0, data_wait_s=0.25, loss=3.4),
        run_event("run_start", 1100.0, start_step=2, resumed_from_step=2, total_steps=6),
        run_event("compile", 1108.0, what="train_step", seconds=5.0),
        run_event("step", 1109.0, step=3, step_time_s=1.0, loss=3.6),
        run_event("some_new_type", 1109.5, payload=[1, 2]),
        run_event("step", 1110.0, step=4, step_time_s=1.0, loss=3.3),
        run_event("checkpoint", 1110.4, step=4, seconds=0.4, path="c/4"),
        run_event("step", 1111.4, step=5, step_time_s=1.4, loss=3.2),
        run_event("step", 1112.4, step=6, step_time_s=1.0, loss=3.1),
        run_event("checkpoint", 1112.5, step=6, seconds=0.1, path="c/6"),
        run_event("run_end", 1112.5, status="completed", step=6, reason=None),
    ]


def write_run(root: Path, run_id: str, events: list[dict], tail: str = "") -> Path:
    """Writes ``events`` (with ``run_id``) and ``tail`` as ``root/run_id/events.jsonl``; returns
    that file."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({**e, "run_id": run_id}) + "\n" for e in events)
    (run_dir / EVENTS_FILE).write_text(lines + tail)
    return run_dir / EVENTS_FILE


# The capabilities that let root write past the permission bits: a process without them is
# bound by them, as any other user is.
_PERMISSION_OVERRIDES = "--bounding-set=-dac_override,-dac_read_search"


def read_only(root: Path) -> list[str]:
    """Make ``root`` and everything under it read-only (``chmod -R a-w``, as a shared or mounted
    directory of records); returns the command prefix of a process for which it is read-only
    (as root: ``setpriv`` without the capabilities that override the permission bits)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no process here is bound by chmod")
    return ["setpriv", _PERMISSION_OVERRIDES, "--"]


def titan(prefix: list[str], *args: str) -> subprocess.CompletedProcess:
    """``titan ARGS`` in a child process started with ``prefix`` (:func:`read_only`)."""
    command = [*prefix, sys.executable, "-m", "titan.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)
