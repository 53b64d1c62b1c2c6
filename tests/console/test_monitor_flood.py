"""The run monitor keeps up with a run that writes faster than it can be read, and follows the
run rather than one attempt: bounded reads, the newest step shown first with the history filled
in behind it, summaries instead of events, and a resume picked up after ``run_end``."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from console_helpers import append_events, event, parsed, stat, wait_until

from titan.telemetry.events import Step
from titan.telemetry.heartbeat import ProcessId
from titan.telemetry.records import EVENTS_FILE, EventTail, read_last_events
from tui.app import TitanConsole
from tui.curve import MAX_POINTS
from tui.launcher import LaunchedRun
from tui.run_state import POWER_STEPS_KEPT, STALLS_KEPT, RunState
from tui.run_watch import READ_SLICE_BYTES, RunWatcher
from tui.screens.monitor import MonitorScreen

SIZE = (120, 40)


def _step_lines(first: int, last: int) -> bytes:
    """``step`` lines as the trainer writes them, for steps ``first`` to ``last``."""
    fields = Step(step=1, loss=1.0, lr=1e-3, tokens=2048, tokens_per_s=2e3, step_time_s=0.5)
    template = {**fields.to_json(), "run_id": "test-run"}
    return b"".join(
        (json.dumps({**template, "step": s, "loss": 10.0 / s, "time": 100.0 + s}) + "\n").encode()
        for s in range(first, last + 1)
    )


def _flooded_run(run_dir: Path, steps: int, resumed_at: tuple[int, ...] = ()) -> None:
    """A run dir whose record holds ``steps`` steps, written at once: one attempt, or one
    more resumed at each step of ``resumed_at``."""
    run_dir.mkdir(parents=True)
    starts = (0, *resumed_at)
    for first, last in zip(starts, (*resumed_at, steps), strict=True):
        start = event("run_start", 100.0 + first, config={"preset": "tiny"}, total_steps=steps)
        append_events(run_dir, [{**start, "resumed_from_step": first or None}])
        with open(run_dir / EVENTS_FILE, "ab") as f:
            f.write(_step_lines(first + 1, last))


def _live_start(time_s: float, **fields) -> dict:
    """A ``run_start`` of an attempt whose process is this test's (alive on this host)."""
    process = ProcessId.current().as_dict()
    return event("run_start", time_s, config={"preset": "tiny"}, process=process, **fields)


def test_event_tail_reads_in_bounded_slices_and_keeps_a_torn_line(tmp_path: Path):
    path = tmp_path / EVENTS_FILE
    path.write_bytes(_step_lines(1, 50) + b'{"type": "step", "ti')
    tail = EventTail(path)
    first = tail.read_new_events(1000)
    offsets = [tail.offset]
    rest = []
    while tail.offset < path.stat().st_size:
        rest += tail.read_new_events(1000)
        offsets.append(tail.offset)
    assert all(b - a <= 1000 for a, b in zip([0, *offsets], offsets, strict=False))
    assert [e.step for e in first + rest] == list(range(1, 51))
    assert tail.bad_lines == 0  # the torn last line is held back, not counted
    with open(path, "ab") as f:
        f.write(b'me": 151.0, "step": 51}\n')
    assert [e.step for e in tail.read_new_events(1000)] == [51]


def test_read_last_events_gives_the_newest_whole_lines(tmp_path: Path):
    path = tmp_path / EVENTS_FILE
    path.write_bytes(_step_lines(1, 1000) + b'{"type": "st')
    start, events = read_last_events(path, path.stat().st_size, 4096)
    steps = [e.step for e in events]
    assert steps == list(range(steps[0], 1001)) and 1 < len(steps) < 20  # no cut first line
    assert path.read_bytes()[start:].startswith(b'{"schema"')
    assert read_last_events(path, 30, 20) == (30, [])  # no whole line in the window


def test_run_state_keeps_summaries_not_every_event():
    state = RunState()
    state.apply(parsed([event("run_start", 0.0, total_steps=100_000)]))
    steps = [
        event("step", float(s), step=s, loss=1.0, step_time_s=0.5, energy_j=100.0)
        for s in range(1, 5001)
    ]
    stalls = [event("stall", 9e3 + s, phase="step", step=s) for s in range(1, 101)]
    state.apply(parsed(steps + stalls))
    before = state.snapshot()
    state.apply(parsed([event("step", 1e4, step=5001, loss=0.5, step_time_s=0.5, energy_j=1.0)]))
    assert len(state.curve.steps) <= MAX_POINTS and state.curve.count == 5001
    assert len(state.power_w) == POWER_STEPS_KEPT and state.energy_j == 5000 * 100.0 + 1.0
    assert len(state.stalls) == STALLS_KEPT and state.stall_count == 100
    assert state.stalls[-1].step == 100
    # The snapshot the UI draws is not changed by the folds that follow it.
    assert (before.step, before.curve.count, before.curve.steps[-1]) == (5000, 5000, 5000)
    assert before.power_w[-1] == 200.0 and state.power_w[-1] == 2.0


def test_a_watcher_far_behind_shows_the_newest_step_first_then_fills_the_history(
    tmp_path: Path,
):
    run_dir = tmp_path / "flood"
    _flooded_run(run_dir, 20_000)
    watcher = RunWatcher(run_dir)
    first = watcher.poll()
    polls = [first]
    while polls[-1].unread_bytes:
        polls.append(watcher.poll() or polls[-1])
    last = polls[-1].state
    assert first.state.step == 20_000 and first.state.loss == 10.0 / 20_000
    assert first.unread_bytes > READ_SLICE_BYTES  # the history is still to read
    assert first.state.curve.count < 20_000
    assert len(polls) > 2  # read in many bounded polls, not at once
    assert (last.step, last.curve.count, last.attempts) == (20_000, 20_000, 1)
    assert last.curve.steps[0] == 1 and last.curve.steps[-1] == 20_000
    assert len(last.curve.steps) <= MAX_POINTS


def test_a_watcher_follows_a_resume_after_its_child_exited(tmp_path: Path):
    run_dir = tmp_path / "resumed"
    run_dir.mkdir()
    child = subprocess.Popen(["true"])
    child.wait()
    append_events(
        run_dir,
        [
            event("run_start", 1.0, total_steps=10, process={**ProcessId.current().as_dict()}),
            event("step", 2.0, step=1, loss=3.0),
            event("run_end", 3.0, status="stopped", step=1),
        ],
    )
    watcher = RunWatcher(run_dir, LaunchedRun(run_dir, ["true"], child))
    exited = watcher.poll()
    append_events(run_dir, [_live_start(time.time(), total_steps=10, start_step=1)])
    resumed = watcher.poll()
    assert exited.returncode == 0 and exited.state.status == "stopped"
    assert resumed.returncode is None  # the child's exit no longer describes the run
    assert resumed.state.attempts == 2 and resumed.liveness.state == "running"


@pytest.mark.slow
async def test_the_monitor_shows_the_newest_step_of_a_flooded_record_and_fills_its_curve(
    tmp_path: Path,
):
    run_dir = tmp_path / "flood"
    _flooded_run(run_dir, 30_000, resumed_at=(10, 15_000))
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run_dir)
        await app.push_screen(screen)
        await wait_until(
            pilot,
            lambda: not stat(app, "step").startswith("0 / "),
            lambda: stat(app, "step"),
            30,
        )
        first_shown = stat(app, "step")
        first_elapsed = stat(app, "elapsed")
        first_count = screen.state.curve.count
        await wait_until(
            pilot,
            lambda: (
                screen.state.curve.count == 30_000
                and stat(app, "step") == "30000 / 30000 (resumed at 15000)"
            ),
            lambda: f"{screen.state.curve.count} read; {stat(app, 'step')}",
            300,
        )
        points = len(screen.state.curve.steps)
    # The history read so far holds an earlier attempt's run_start: not shown as this one's.
    assert first_shown.startswith("30000 / 30000 · ") and "MB of history to read" in first_shown
    assert "resumed" not in first_shown and first_elapsed == "-"
    assert first_count < 30_000
    assert points <= MAX_POINTS


async def test_a_monitor_opened_before_a_resume_follows_the_new_attempt(tmp_path: Path):
    run_dir = tmp_path / "resumed"
    run_dir.mkdir()
    append_events(
        run_dir,
        [
            event("run_start", 1.0, config={"preset": "tiny"}, total_steps=10),
            *(event("step", 1.0 + s, step=s, loss=3.0) for s in range(1, 4)),
            event("run_end", 5.0, status="stopped", step=3),
        ],
    )
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run_dir)
        await app.push_screen(screen)
        await wait_until(pilot, lambda: stat(app, "status") == "stopped", lambda: "", 30)
        stopped = (screen.check_action("resume", ()), screen.check_action("signal", ("stop",)))
        now = time.time()
        append_events(
            run_dir,
            [
                _live_start(now, total_steps=10, start_step=3, resumed_from_step=3),
                *(event("step", now, step=s, loss=2.0) for s in (4, 5)),
            ],
        )
        await wait_until(
            pilot,
            lambda: stat(app, "step") == "5 / 10 (resumed at 3)",
            lambda: f"{stat(app, 'status')}; {stat(app, 'step')}",
            30,
        )
        await wait_until(pilot, lambda: stat(app, "status") == "running", lambda: "", 30)
        running = (screen.check_action("resume", ()), screen.check_action("signal", ("stop",)))
    assert stopped == (True, False)
    assert running == (False, True)
