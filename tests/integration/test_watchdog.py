"""The stall watchdog: allowances per phase (fake clock), its thread, a stall end to end, and
the hang timer that ends a process stuck holding the GIL."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import events, run_in_process, start_subprocess

from titan.analysis.liveness import DEAD, RecordFacts, judge
from titan.checkpoint.checkpointer import Checkpointer
from titan.config import TrainConfig, validate_train_config
from titan.errors import TitanError
from titan.exit_codes import EXIT_STALL
from titan.telemetry.heartbeat import hang_stacks_path, read_beats
from titan.telemetry.watchdog import LONG_PHASE_MIN_S, Watchdog


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watchdog(floor_s: float = 2.0, factor: float = 10.0) -> tuple[Watchdog, FakeClock]:
    clock = FakeClock()
    return Watchdog(floor_s, factor, on_stall=lambda stall: None, clock=clock), clock


def test_compile_and_first_step_ten_floors_long_are_no_stall():
    watchdog, clock = _watchdog(floor_s=2.0)
    watchdog.enter("compile", 0)
    clock.now += 10 * 2.0
    assert watchdog.check() is None
    watchdog.enter("step", 1)  # no step time yet: the first step may still compile
    clock.now += 10 * 2.0
    assert watchdog.check() is None


def test_slow_checkpoint_save_and_restore_are_no_stall():
    watchdog, clock = _watchdog(floor_s=2.0)
    for _ in range(5):
        watchdog.step_done(0.1)
    for phase in ("checkpoint_save", "checkpoint_restore"):
        watchdog.enter(phase, 5)
        clock.now += LONG_PHASE_MIN_S - 1
        assert watchdog.check() is None


def test_step_stalls_after_factor_times_median_or_floor():
    watchdog, clock = _watchdog(floor_s=2.0, factor=10.0)
    for seconds in (0.1, 0.5, 0.5, 9.0):  # median 0.5 s: allowance max(2, 10 x 0.5) = 5 s
        watchdog.step_done(seconds)
    assert watchdog.threshold_s("step") == pytest.approx(5.0)
    watchdog.enter("step", 7)
    clock.now += 4.9
    assert watchdog.check() is None
    clock.now += 0.2
    stall = watchdog.check()
    assert (stall.phase, stall.step) == ("step", 7)
    assert stall.elapsed_s == pytest.approx(5.1) and stall.threshold_s == pytest.approx(5.0)
    stacks = "".join(line for thread in stall.stacks for line in thread["stack"])
    assert "test_step_stalls_after_factor_times_median_or_floor" in stacks
    assert watchdog.check() is None  # reported once per phase entry
    watchdog.enter("step", 8)
    clock.now += 5.1
    assert watchdog.check().step == 8


def test_fast_steps_get_the_floor_and_idle_never_stalls():
    watchdog, clock = _watchdog(floor_s=2.0)
    watchdog.step_done(0.01)
    assert watchdog.threshold_s("data_wait") == 2.0
    watchdog.enter("idle", 3)
    clock.now += 1e6
    assert watchdog.check() is None
    with pytest.raises(ValueError, match="phase"):
        watchdog.threshold_s("lunch")


def test_heartbeat_thread_reports_a_stall_and_stops():
    stalls = []
    seen = threading.Event()
    watchdog = Watchdog(0.2, 10.0, on_stall=lambda s: (stalls.append(s), seen.set()))
    watchdog.step_done(0.001)
    watchdog.enter("step", 1)
    watchdog.start()
    assert seen.wait(timeout=10)
    watchdog.stop()
    assert not watchdog.heartbeat.thread.is_alive()
    assert len(stalls) == 1 and stalls[0].elapsed_s > 0.2


def test_watchdog_options_are_validated():
    with pytest.raises(TitanError, match="--watchdog-abort must be 0 or 1"):
        validate_train_config(TrainConfig.of(watchdog_abort=2))
    with pytest.raises(TitanError, match="--watchdog-floor"):
        validate_train_config(TrainConfig.of(watchdog_floor=0))


@pytest.mark.slow
def test_injected_stall_is_detected_recorded_and_exits_for_a_restart(small_options):
    floor_s = 2.0
    options = {
        **small_options,
        "run_id": "stall",
        "steps": 100,
        "checkpoint_every": 2,
        "watchdog_floor": floor_s,
        "debug_stall_at_step": 3,
        "watchdog_abort": True,
    }
    proc = start_subprocess(options)
    assert proc.wait(timeout=180) == EXIT_STALL, proc.stderr.read()
    run_dir = Path(options["runs_root"]) / "stall"
    (stall,) = events(run_dir, "stall")
    assert (stall["phase"], stall["step"]) == ("step", 3)
    # detected within a heartbeat (floor / 4) of the allowance, with a generous margin
    assert stall["threshold_s"] >= floor_s
    assert stall["threshold_s"] < stall["elapsed_s"] < stall["threshold_s"] + 3.0
    main = next(t for t in stall["stacks"] if t["thread"] == "MainThread")
    assert any("in loop" in line for line in main["stack"])
    assert "in _debug_stall" in main["stack"][-1]
    assert not any(line.lstrip().startswith('File "/') for line in main["stack"])
    end = events(run_dir)[-1]
    assert (end["type"], end["status"], end["reason"]) == ("run_end", "failed", "stall")
    # run_end's step is the last step recorded (the stalled step 3 never finished).
    assert end["step"] == events(run_dir, "step")[-1]["step"] == 2
    checkpointer = Checkpointer(run_dir)
    assert checkpointer.latest_step() == 2
    checkpointer.close()
    code, _ = run_in_process(
        {**options, "steps": 4, "debug_stall_at_step": 0, "watchdog_abort": False}, resume=run_dir
    )
    assert code == 0
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 2
    assert [e["step"] for e in events(run_dir, "step")][-2:] == [3, 4]


HANG_SCRIPT = """
import ctypes, sys
from pathlib import Path
from titan.config import ObservabilityOptions
from titan.telemetry.records import RunRecord
from titan.trainer.processes import Heartbeat
from titan.trainer.loop_hooks.stall_hook import StallHook

run_dir = Path(sys.argv[1])
record, heartbeat = RunRecord(run_dir, "hang"), Heartbeat(run_dir)
options = ObservabilityOptions(watchdog_floor=1.0, watchdog_abort=sys.argv[2] == "abort")
hook = StallHook(options, record, None)
hook.attach(record, heartbeat, None)
hook.on_start()
for _ in range(3):
    hook.watchdog.step_done(0.01)
hook.on_phase("step", 5)
print("holding", flush=True)
ctypes.PyDLL(None).sleep(120)  # a C call through PyDLL keeps the GIL: no Python thread runs
"""


def _hang(run_dir: Path, abort: bool) -> subprocess.Popen:
    """A process of a run whose step hangs holding the GIL (:data:`HANG_SCRIPT`), once it
    holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HANG_SCRIPT, str(run_dir), "abort" if abort else "record"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
    return proc


def test_a_step_that_hangs_holding_the_gil_ends_within_its_allowance_and_says_why(
    tmp_path: Path,
):
    proc = _hang(tmp_path, abort=True)
    try:
        held = time.monotonic()
        # allowance: max(floor 1 s, 10 x 0.01 s) + heartbeat allowance of a 1 s floor (3 s)
        assert proc.wait(timeout=30) == 1
        assert time.monotonic() - held < 4.0 + 10.0
    finally:
        proc.kill()
        proc.wait()
    stacks = hang_stacks_path(tmp_path, 0).read_text()
    assert stacks.startswith("Timeout (0:00:04)!") and 'File "<string>", line 19' in stacks
    process = read_beats(tmp_path)[0].id
    liveness = judge(tmp_path, RecordFacts(started=True, process=process))
    assert liveness.state == DEAD
    assert liveness.reason == (
        f"{process.name()} is gone after a hang with no Python thread running (the GIL held) "
        "past 0:00:04; every thread's stack is in processes/0.stacks"
    )


def test_without_watchdog_abort_a_hang_holding_the_gil_leaves_its_stacks_and_runs_on(
    tmp_path: Path,
):
    proc = _hang(tmp_path, abort=False)
    try:
        stacks = hang_stacks_path(tmp_path, 0)
        deadline = time.monotonic() + 30
        while not stacks.stat().st_size and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stacks.read_text().startswith("Timeout (0:00:04)!")
        assert proc.poll() is None  # only a stall's record, as --no-watchdog-abort asks
        process = read_beats(tmp_path)[0].id
        time.sleep(1.0)  # the heartbeat, held by the GIL too, past its allowance of 3 s
        facts = RecordFacts(started=True, process=process, allowance_s=3.0)  # a 1 s floor's
        liveness = judge(tmp_path, facts)
        assert liveness.state == "unresponsive"
        assert liveness.reason.endswith(
            "it exists but does not run (stopped or frozen); a hang with no Python thread running "
            "(the GIL held) past 0:00:04; every thread's stack is in processes/0.stacks"
        )
    finally:
        proc.kill()
        proc.wait()


def test_a_stall_the_watchdog_thread_sees_stops_the_hang_timer(tmp_path: Path):
    watchdog, clock = _watchdog(floor_s=2.0)
    with open(tmp_path / "stacks", "w") as stacks:
        watchdog.arm_hang_timer(stacks, 0.5, end=True)
        watchdog.step_done(0.1)
        watchdog.enter("step", 1)  # armed for 2.5 s
        clock.now += 3.0
        assert watchdog.check() is not None  # Python code runs: no hang, the timer is cancelled
        time.sleep(3.0)
        watchdog.stop()
    assert (tmp_path / "stacks").read_text() == ""


def test_a_dump_of_a_process_that_ran_on_is_emptied_at_its_next_phase(tmp_path: Path):
    watchdog = Watchdog(0.1, 10.0, on_stall=lambda stall: None)  # its thread not started
    with open(tmp_path / "stacks", "w") as stacks:
        watchdog.arm_hang_timer(stacks, 0.1, end=False)
        watchdog.step_done(0.001)
        watchdog.enter("step", 1)  # dumps after 0.1 + 0.1 s: as if stopped (SIGSTOP) that long
        time.sleep(1.0)
        assert (tmp_path / "stacks").read_text().startswith("Timeout (0:00:00.200000)!")
        watchdog.enter("data_wait", 2)
        assert (tmp_path / "stacks").read_text() == ""
        watchdog.stop()
