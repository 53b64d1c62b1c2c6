"""Control of any run of this host from any console: stop, kill (after a confirmation) and
resume, guarded by the recorded process's start time; refused, with the reason shown, where a
key cannot act (another host, a run that ended)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from console_helpers import (
    append_events,
    event,
    kill_children,
    launch_from_form,
    notes_into,
    run_context,
    stat,
    tiny_form_texts,
    wait_until,
    write_lost_peer,
)

from titan.analysis.liveness import UNRESPONSIVE
from titan.exit_codes import EXIT_STOPPED
from titan.telemetry.heartbeat import HEARTBEAT_TIMEOUT_S, PROCESSES_DIR, ProcessId
from titan.telemetry.records import read_events, write_json_atomic
from tui.app import TitanConsole
from tui.launcher import signal_run
from tui.screens.confirm import ConfirmScreen
from tui.screens.launch import LaunchScreen
from tui.screens.monitor import MonitorScreen
from tui.widgets.process_table import ProcessTable

SIZE = (80, 24)


def _offered(app: TitanConsole) -> set[str]:
    """The actions the footer offers on the current screen."""
    return {b.binding.action for b in app.screen.active_bindings.values()}


def _sleeper() -> subprocess.Popen:
    """A live process in its own process group, to stand for a run's process."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def _started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def _recorded_run(run_dir: Path, identity: ProcessId, beat_age_s: float = 0.0) -> None:
    """A run dir whose run_start and heartbeat name ``identity``, with a beat ``beat_age_s``
    old."""
    run_dir.mkdir(parents=True)
    now = time.time()
    append_events(run_dir, [event("run_start", now, total_steps=9, process=identity.as_dict())])
    (run_dir / PROCESSES_DIR).mkdir()
    beat = {**identity.as_dict(), "processes": 1, "step": 2, "status": "running"}
    beat["beat"] = now - beat_age_s
    write_json_atomic(run_dir / PROCESSES_DIR / "0.json", beat)


@pytest.fixture
def stopped_children():
    made: list[TitanConsole] = []
    yield made
    for app in made:
        kill_children(app)


@pytest.mark.slow
async def test_a_run_launched_by_one_console_is_stopped_from_another_and_resumed(
    corpus_dir: Path, tmp_path: Path, stopped_children: list[TitanConsole]
):
    runs_root = tmp_path / "runs"
    first = TitanConsole(runs_root, show_launch_form=True)
    stopped_children.append(first)
    stalling = {
        **tiny_form_texts(corpus_dir),
        "steps": "1000",
        "checkpoint_every": "1000",
        "debug_stall_at_step": "3",
        "watchdog_floor": "1",
        "watchdog_factor": "1",
    }
    async with first.run_test(size=SIZE) as pilot:
        await launch_from_form(first, pilot, stalling, until=lambda m: m.state.step >= 1)
    [run] = first.launched.values()  # the first console has quit; its run goes on
    assert run.returncode() is None, run_context(run.run_dir)

    second = TitanConsole(runs_root, open_run=run.run_dir)
    stopped_children.append(second)
    async with second.run_test(size=SIZE) as pilot:
        monitor = second.screen
        await wait_until(
            pilot, lambda: monitor.status == "stalled", lambda: run_context(run.run_dir), 120
        )
        await wait_until(pilot, lambda: stat(second, "process") != "-", lambda: "", 10)
        stalled = {"process": stat(second, "process"), "offered": _offered(second)}
        await pilot.press("s")
        await pilot.pause()
        asked = isinstance(second.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_until(
            pilot, lambda: monitor.status == "stopped", lambda: run_context(run.run_dir), 120
        )
        await wait_until(
            pilot, lambda: stat(second, "process") == "the run has ended", lambda: "", 10
        )
        stopped = {"process": stat(second, "process"), "offered": _offered(second)}
        await pilot.press("R")  # resume: the launch form with the run's options
        await pilot.pause()
        form = second.screen
        await pilot.press("ctrl+r")
        await wait_until(
            pilot,
            lambda: any(e.get("resumed_from_step") for e in read_events(run.run_dir)),
            lambda: run_context(run.run_dir),
            120,
        )
    assert run.process.wait(timeout=60) == EXIT_STOPPED
    assert stalled["process"] == f"running (pid {run.pid})"
    assert {"signal('stop')", "signal('kill')"} <= stalled["offered"]
    assert "resume" not in stalled["offered"]
    assert asked
    assert stopped["process"] == "the run has ended"
    assert "signal('stop')" not in stopped["offered"] and "resume" in stopped["offered"]
    assert isinstance(form, LaunchScreen) and form.resume == run.run_dir
    assert form.texts["steps"] == "1000"
    ends = [e for e in read_events(run.run_dir) if e["type"] == "run_end"]
    assert ends[0]["status"] == "stopped" and ends[0]["signal"] == "SIGTERM"


async def test_kill_asks_first_then_sigkills_the_recorded_group(tmp_path: Path):
    child = _sleeper()
    try:
        identity = ProcessId(ProcessId.current().host, child.pid, child.pid, _started(child.pid))
        _recorded_run(tmp_path / "run", identity)
        app = TitanConsole(tmp_path, open_run=tmp_path / "run")
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.screen.status == "running", lambda: "?", 10)
            await pilot.press("7")
            app.screen.query_one(ProcessTable).focus()  # a table's own k moves up a row
            await pilot.pause()
            await pilot.press("k", "n")  # asked, and answered no: nothing sent
            await pilot.pause(0.3)
            alive_after_no = child.poll() is None
            await pilot.press("k", "y")
            returncode = child.wait(timeout=10)
            await wait_until(pilot, lambda: app.screen.status == "dead", lambda: "not dead", 10)
            await pilot.press("7")
            await pilot.pause()
            rows = app.screen.query_one(ProcessTable).row_count
    finally:
        child.kill()
        child.wait()
    assert alive_after_no
    assert returncode == -signal.SIGKILL
    assert rows == 1


def test_a_reused_pid_is_never_signalled(tmp_path: Path):
    child = _sleeper()
    try:
        real = _started(child.pid)
        reused = ProcessId(ProcessId.current().host, child.pid, child.pid, real - 3600.0)
        refused = signal_run(reused, signal.SIGTERM)
        alive = child.poll() is None
    finally:
        child.kill()
        child.wait()
    assert refused.startswith(f"pid {child.pid} is now another process")
    assert alive


async def test_a_run_on_another_host_is_not_offered_stop_and_the_monitor_says_why(
    tmp_path: Path,
):
    remote = ProcessId("another-host.example", 4242, 4242, time.time() - 100)
    _recorded_run(tmp_path / "run", remote)
    app = TitanConsole(tmp_path, open_run=tmp_path / "run")
    notes: list[str] = []
    async with app.run_test(size=SIZE, message_hook=notes_into(notes)) as pilot:
        await wait_until(pilot, lambda: app.screen.status == "running", lambda: "?", 10)
        # the process field is drawn from the screen's state a beat later
        await wait_until(pilot, lambda: stat(app, "process") != "-", lambda: "not drawn", 10)
        offered = _offered(app)
        process = stat(app, "process")
        await pilot.press("s")
        await pilot.pause()
        still_monitor = isinstance(app.screen, MonitorScreen)
    assert "signal('stop')" not in offered and "signal('kill')" not in offered
    assert process == "the run is on host another-host.example, not this one: stop it there"
    assert still_monitor and notes == []


async def test_a_multi_process_run_shows_a_row_per_process_and_names_the_lost_one(
    tmp_path: Path,
):
    me = ProcessId.current()
    run_dir = tmp_path / "run"
    _recorded_run(run_dir, me)
    lost = write_lost_peer(run_dir, me.host)
    app = TitanConsole(tmp_path, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        # the screen's state first, then its status field, which is drawn from it a beat later
        await wait_until(pilot, lambda: stat(app, "status").startswith("dead"), lambda: "", 10)
        status = stat(app, "status")
        await pilot.press("7")
        await pilot.pause()
        table = app.screen.query_one(ProcessTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
    assert status.startswith(f"dead: process 1 (pid {lost.pid} on {me.host}) is gone; last seen ")
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [
        ("0", me.host, str(me.pid), "2", "running"),
        ("1", me.host, str(lost.pid), "7", "dead"),
    ]
    assert all(r[4].endswith(" s ago") for r in rows)


async def test_a_frozen_run_is_unresponsive_in_the_status_process_row_and_processes_tab(
    tmp_path: Path,
):
    child = _sleeper()  # a live process whose heartbeat stopped: what SIGSTOP leaves
    try:
        identity = ProcessId(ProcessId.current().host, child.pid, child.pid, _started(child.pid))
        _recorded_run(tmp_path / "run", identity, beat_age_s=HEARTBEAT_TIMEOUT_S + 10)
        app = TitanConsole(tmp_path, open_run=tmp_path / "run")
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.screen.status == UNRESPONSIVE, lambda: "?", 10)
            await wait_until(pilot, lambda: stat(app, "process") != "-", lambda: "", 10)
            shown = {"status": stat(app, "status"), "process": stat(app, "process")}
            await pilot.press("7")
            await pilot.pause()
            table = app.screen.query_one(ProcessTable)
            [row] = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            await pilot.press("3")
            await pilot.pause()
            labels = [str(label.content) for label in app.screen.query(".stat-label").results()]
    finally:
        child.kill()
        child.wait()
    # One word for the state, and each allowance named for what it allows.
    assert shown["status"].startswith(f"unresponsive: process 0 (pid {child.pid} on ")
    assert f"(heartbeat allowance {HEARTBEAT_TIMEOUT_S:.0f} s)" in shown["status"]
    assert shown["process"] == f"unresponsive (pid {child.pid})"
    assert row[5] == "unresponsive"
    assert {"stall allowance", "last event", "wall time"} <= set(labels)
    assert "allowance" not in labels and "heartbeat" not in labels


async def test_a_stop_sent_to_a_stalled_run_says_it_waits_and_that_k_kills(tmp_path: Path):
    ignores_stop = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', "
        "flush=True); time.sleep(600)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", ignores_stop], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        identity = ProcessId(ProcessId.current().host, child.pid, child.pid, _started(child.pid))
        _recorded_run(tmp_path / "run", identity)
        stall = event("stall", time.time(), phase="step", elapsed_s=40.0, threshold_s=30.0, step=3)
        append_events(tmp_path / "run", [stall])
        app = TitanConsole(tmp_path, open_run=tmp_path / "run")
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_until(pilot, lambda: app.screen.status == "stalled", lambda: "?", 10)
            await pilot.press("s", "y")
            await wait_until(
                pilot, lambda: "k kills" in stat(app, "status"), lambda: stat(app, "status"), 10
            )
            shown = (app.screen.status, stat(app, "status"))
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert shown[0] == "stalled"
    assert shown[1].endswith("; stop sent, not acted on yet: k kills")
