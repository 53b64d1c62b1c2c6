"""A run's state from its record (titan.analysis.liveness): one judgement for the console's
monitor and run list, History and `titan summarize`, checked on real `titan train` processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from console_helpers import append_events, event, write_lost_peer
from helpers import cli_args, small_run, start_subprocess, wait_for_event

from titan.analysis import summarize
from titan.analysis.liveness import DEAD, UNRESPONSIVE, Liveness, RecordFacts, judge
from titan.analysis.report import write_report
from titan.telemetry.heartbeat import BEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S, PROCESSES_DIR, ProcessId
from titan.telemetry.records import load_events, write_json_atomic
from tui.history_queries import HistoryQuery, HistoryStore
from tui.run_list import list_runs
from tui.run_watch import RunWatcher


def _facts(run_dir: Path) -> RecordFacts:
    return RecordFacts().fold(load_events(run_dir))


def _long_run(corpus_dir: Path, runs_root: Path, run_id: str, **options) -> subprocess.Popen:
    opts = small_run(corpus_dir, runs_root, steps=100_000, run_id=run_id, **options)
    return start_subprocess({**opts, "checkpoint_every": 100_000, "dp": 1})


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate()


def _wait_for_beat_with_step(run_dir: Path, timeout_s: float = 60.0) -> Liveness:
    """The run's judgement once its heartbeat file has a step (it is written once a second)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        judged = judge(run_dir, _facts(run_dir))
        if judged.processes and judged.processes[0].step is not None:
            return judged
        time.sleep(0.2)
    raise AssertionError(f"no heartbeat with a step in {run_dir}")


@pytest.mark.slow
def test_a_run_killed_with_sigkill_reads_dead_everywhere(corpus_dir: Path, tmp_path: Path):
    process = _long_run(corpus_dir, tmp_path, "killed")
    run_dir = tmp_path / "killed"
    try:
        wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] >= 2)
        alive = _wait_for_beat_with_step(run_dir)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        _stop(process)
    # The pid is checked on this host: dead at the first judgement after the exit.
    judged = judge(run_dir, _facts(run_dir))
    update = RunWatcher(run_dir).poll()
    [listed] = list_runs(tmp_path).summaries
    store = HistoryStore(tmp_path)
    store.ingest()
    [row] = store.page(HistoryQuery()).rows
    [summary] = summarize.summarize(tmp_path)
    attempts = write_report(run_dir, tmp_path / "report").read_text().split("## Attempts")[1]
    assert (alive.state, alive.control.pid) == ("running", process.pid)
    assert judged.state == DEAD
    assert "| crashed |" in attempts.split("##")[0]  # the report says what its summary says
    assert judged.reason == f"process 0 (pid {process.pid} on {socket.gethostname()}) is gone"
    assert judged.lost.pid == process.pid and judged.control is None
    assert judged.last_seen is not None and judged.last_seen <= time.time()
    assert "; last seen " in judged.describe()
    assert update.liveness.state == listed.liveness.state == row.status == DEAD
    assert (summary.status, summary.reason) == (DEAD, judged.describe().partition(": ")[2])
    [beat] = judged.processes
    assert (beat.id.pid, beat.status, beat.step is not None) == (process.pid, "running", True)


@pytest.mark.slow
def test_a_stalled_live_run_reads_stalled_and_a_stop_ends_it(corpus_dir: Path, tmp_path: Path):
    process = _long_run(
        corpus_dir, tmp_path, "stalls", debug_stall_at_step=4, watchdog_floor=1, watchdog_factor=1
    )
    run_dir = tmp_path / "stalls"
    try:
        wait_for_event(run_dir, lambda e: e["type"] == "stall")
        stalled = judge(run_dir, _facts(run_dir))
        [summary] = summarize.summarize(tmp_path)
        process.send_signal(signal.SIGTERM)  # the debug stall ends on a stop signal
        process.communicate(timeout=120)
    finally:
        _stop(process)
    assert (stalled.state, stalled.control.pid) == ("stalled", process.pid)
    assert summary.status == "stalled"
    assert judge(run_dir, _facts(run_dir)).state == "stopped"


def _record_process(run_dir: Path, identity: ProcessId, beat_age_s: float = 0.0) -> None:
    """A run_start naming ``identity``, and its heartbeat file ``beat_age_s`` old."""
    run_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    append_events(run_dir, [event("run_start", now - 60, process=identity.as_dict())])
    (run_dir / PROCESSES_DIR).mkdir(exist_ok=True)
    beat = {**identity.as_dict(), "processes": 1, "step": 3, "status": "running"}
    write_json_atomic(run_dir / PROCESSES_DIR / "0.json", {**beat, "beat": now - beat_age_s})


def test_a_recorded_pid_now_another_process_reads_dead(tmp_path: Path):
    me = ProcessId.current()
    # Our own pid, but a process that started an hour earlier: the pid was reused.
    earlier = ProcessId(me.host, me.pid, me.pgid, me.started - 3600.0)
    _record_process(tmp_path / "reused", earlier)
    judged = judge(tmp_path / "reused", _facts(tmp_path / "reused"))
    assert judged.state == DEAD
    assert judged.reason.startswith(f"pid {me.pid} is now another process (started ")
    assert judged.control is None


def test_a_live_recorded_process_reads_running_and_is_offered_for_control(tmp_path: Path):
    me = ProcessId.current()
    _record_process(tmp_path / "live", me, beat_age_s=1.0)
    judged = judge(tmp_path / "live", _facts(tmp_path / "live"))
    assert (judged.state, judged.control, judged.no_control) == ("running", me, "")


def test_a_live_process_with_a_heartbeat_past_the_allowance_reads_unresponsive(tmp_path: Path):
    me = ProcessId.current()
    _record_process(tmp_path / "frozen", me, beat_age_s=HEARTBEAT_TIMEOUT_S + 10)
    judged = judge(tmp_path / "frozen", _facts(tmp_path / "frozen"))
    # On this host an old heartbeat does not make a live process dead: it is unresponsive, and
    # still offered for a stop or a kill.
    assert (judged.state, judged.control, judged.alive) == (UNRESPONSIVE, me, True)
    assert judged.process_state(judged.processes[0], time.time()) == UNRESPONSIVE
    assert judged.reason == (
        f"{me.name()}: no heartbeat for {HEARTBEAT_TIMEOUT_S + 10:.0f} s (heartbeat allowance "
        f"{HEARTBEAT_TIMEOUT_S:.0f} s); it exists but does not run (stopped or frozen)"
    )


@pytest.mark.slow
def test_a_sigstopped_run_reads_unresponsive_everywhere_within_its_allowance(
    corpus_dir: Path, tmp_path: Path
):
    # --watchdog-floor 3 makes the allowance 3 s (heartbeat_allowance_s), for every reader.
    process = _long_run(corpus_dir, tmp_path, "frozen", watchdog_floor=3)
    run_dir = tmp_path / "frozen"
    try:
        wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] >= 2)
        alive = _wait_for_beat_with_step(run_dir)
        os.kill(process.pid, signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(alive.allowance_s + 1.5 * BEAT_INTERVAL_S)
        judged = judge(run_dir, _facts(run_dir))
        update = RunWatcher(run_dir).poll()
        [listed] = list_runs(tmp_path).summaries
        [summary] = summarize.summarize(tmp_path)
        frozen_for = time.time() - stopped_at
    finally:
        process.send_signal(signal.SIGCONT)
        _stop(process)
    assert (alive.state in ("running", "stalled"), alive.allowance_s) == (True, 3.0)
    assert (judged.state, judged.control.pid) == (UNRESPONSIVE, process.pid)
    assert update.liveness.state == listed.liveness.state == summary.status == UNRESPONSIVE
    assert summary.reason.partition(": no heartbeat")[0] == f"{judged.control.name()}"
    [beat] = judged.processes
    assert time.time() - beat.beat >= frozen_for - BEAT_INTERVAL_S  # no beat since the stop
    assert judged.reason.startswith(f"process 0 (pid {process.pid} on {socket.gethostname()}): ")
    frozen_text = " (heartbeat allowance 3 s); it exists but does not run (stopped or frozen)"
    assert judged.reason.endswith(frozen_text)


@pytest.mark.parametrize(
    ("beat_age_s", "state"), [(1.0, "running"), (HEARTBEAT_TIMEOUT_S + 5.0, DEAD)]
)
def test_on_another_host_the_heartbeat_age_decides(tmp_path: Path, beat_age_s: float, state: str):
    remote = ProcessId("another-host.example", 4242, 4242, time.time() - 100)
    _record_process(tmp_path / "remote", remote, beat_age_s)
    judged = judge(tmp_path / "remote", _facts(tmp_path / "remote"))
    assert judged.state == state
    # the processes tab says the run's word for its one process
    assert judged.process_state(judged.processes[0], time.time()) == state
    assert judged.control is None
    if state == DEAD:
        assert judged.reason == (
            f"process 0 (pid 4242 on another-host.example): no heartbeat for {beat_age_s:.0f} s "
            f"(heartbeat allowance {HEARTBEAT_TIMEOUT_S:.0f} s); its pid cannot be checked "
            "from this host"
        )
    else:
        assert judged.no_control == (
            "the run is on host another-host.example, not this one: stop it there"
        )


def test_a_multi_process_run_names_the_lost_process(tmp_path: Path):
    me = ProcessId.current()
    run_dir = tmp_path / "two"
    _record_process(run_dir, me)
    lost = write_lost_peer(run_dir, me.host)
    judged = judge(run_dir, _facts(run_dir))
    assert judged.state == DEAD
    assert judged.lost == lost
    assert judged.reason == f"process 1 (pid {lost.pid} on {me.host}) is gone"
    assert [b.id.process for b in judged.processes] == [0, 1]


def test_an_ended_run_reads_its_run_end_status_whatever_its_process(tmp_path: Path):
    run_dir = tmp_path / "done"
    _record_process(run_dir, ProcessId("h", 1, 1, 0.0))
    append_events(run_dir, [event("run_end", time.time(), status="failed", error="boom")])
    judged = judge(run_dir, _facts(run_dir))
    assert (judged.state, judged.reason, judged.no_control) == (
        "failed",
        "boom",
        "the run has ended",
    )


def _wait_until_ended(pid: int, timeout_s: float = 30.0) -> None:
    """Until ``pid`` is gone or a zombie (a SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still runs")


@pytest.mark.slow
def test_a_two_process_run_with_one_process_killed_names_it(corpus_dir: Path, tmp_path: Path):
    opts = small_run(corpus_dir, tmp_path, steps=100_000, run_id="pair", dp=4)
    args = cli_args({**opts, "checkpoint_every": 100_000})
    launcher = subprocess.Popen(
        [sys.executable, "-m", "titan.cli", "launch", "--processes", "2"]
        + ["--devices-per-process", "2", "--platform", "cpu", "--", "train", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    run_dir = tmp_path / "pair"
    try:
        wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] >= 1)
        before = _wait_for_beat_with_step(run_dir)
        survivor, victim = (b.id for b in before.processes)
        # Process 0 is frozen first, so that it cannot notice the loss and end the record: the
        # moment between a node's loss and the survivors' reaction, held still.
        os.kill(survivor.pid, signal.SIGSTOP)
        os.kill(victim.pid, signal.SIGKILL)
        _wait_until_ended(victim.pid)
        judged = judge(run_dir, _facts(run_dir))
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    assert [b.id.process for b in before.processes] == [0, 1] and before.state == "running"
    tail = (run_dir / "events.jsonl").read_text().splitlines()[-3:]
    assert judged.state == DEAD and judged.lost == victim, (judged.describe(), tail)
    name = f"process 1 (pid {victim.pid} on {victim.host})"
    assert judged.reason in (f"{name} is gone", f"{name} has exited")  # reaped or not yet


def test_a_run_dir_with_only_old_logs_reads_failed_with_the_last_error(tmp_path: Path):
    run_dir = tmp_path / "logs-only"
    run_dir.mkdir()
    (run_dir / "stderr.log").write_text("Traceback ...\nValueError: no devices\n")
    old = time.time() - 3600
    os.utime(run_dir / "stderr.log", (old, old))
    judged = judge(run_dir, RecordFacts(), now=old + 3600)
    fresh = judge(run_dir, RecordFacts(), now=old + 5)
    assert judged.state == "failed"
    assert judged.reason == (
        "no run_start: no process recorded and nothing written for 3600 s: ValueError: no devices"
    )
    assert fresh.state == "starting"


def test_a_run_dir_whose_old_events_file_holds_no_event_reads_failed_not_starting(
    tmp_path: Path,
):
    run_dir = tmp_path / "binary"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_bytes(bytes(range(256)) * 20)  # no line is an event
    old = time.time() - 3600
    os.utime(run_dir / "events.jsonl", (old, old))
    [s] = summarize.summarize(tmp_path)
    assert s.status == "failed" and s.bad_lines > 0
    assert judge(run_dir, RecordFacts(), now=old + 5).state == "starting"


def test_a_record_without_a_process_whose_events_are_dated_ahead_still_dies(tmp_path: Path):
    run_dir = tmp_path / "ahead"
    run_dir.mkdir()
    now = time.time()
    append_events(run_dir, [event("run_start", now + 86400.0)])  # a clock a day ahead
    written = now - 3600
    os.utime(run_dir / "events.jsonl", (written, written))
    judged = judge(run_dir, _facts(run_dir), now=now)
    assert (judged.state, judged.last_seen) == (DEAD, written)
    assert judged.reason == "no process recorded and nothing written for 3600 s"


def test_a_record_cut_before_run_start_takes_the_status_its_heartbeats_ended_with(tmp_path: Path):
    run_dir = tmp_path / "cut"
    me = ProcessId.current()
    gone = ProcessId(me.host, me.pid, me.pgid, me.started - 3600.0)  # an earlier process
    (run_dir / PROCESSES_DIR).mkdir(parents=True)
    beat = {**gone.as_dict(), "processes": 1, "step": 8, "beat": time.time(), "status": "completed"}
    write_json_atomic(run_dir / PROCESSES_DIR / "0.json", beat)
    (run_dir / "events.jsonl").write_text('{"schema": 1, "type": "run_st')  # cut short
    judged = judge(run_dir, _facts(run_dir))
    assert judged.state == "completed"
    assert judged.reason == "the record holds no run_end; the heartbeat of process 0 says completed"
    assert judged.control is None
