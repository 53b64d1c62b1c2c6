"""The watch of a run's other processes (titan.trainer.peers): which process counts as lost,
and how another process's stall reaches the record, on real heartbeat files and a real record."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import events

from titan.config import ObservabilityOptions
from titan.telemetry.events import Stall
from titan.telemetry.heartbeat import HEARTBEAT_TIMEOUT_S, heartbeat_allowance_s, read_beats
from titan.telemetry.records import RunRecord, write_json_atomic
from titan.trainer.loop_hooks.stall_hook import StallHook
from titan.trainer.peers import PeerWatch, lost_processes
from titan.trainer.processes import PROCESSES_DIR, Heartbeat, MutedRecord


def beat_file(run_dir: Path, process: int, **fields) -> None:
    payload = {"process": process, "host": "node7", "pid": 4242 + process, "pgid": 4242}
    payload |= {"started": time.time() - 100, "processes": 5, "step": 5}
    payload = {**payload, "status": "running", "beat": time.time(), **fields}
    (run_dir / PROCESSES_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / PROCESSES_DIR / f"{process}.json", payload)


def test_a_running_process_silent_past_the_allowance_is_lost(tmp_path):
    """On another host (its pid cannot be checked), by the age of its last beat."""
    now = time.time()
    beat_file(tmp_path, 1, beat=now - 40)
    beat_file(tmp_path, 2, beat=now - 1)
    beat_file(tmp_path, 3, beat=now - 40, status="completed")  # ended: not lost
    beat_file(tmp_path, 0, beat=now - 400)  # this process: never its own peer
    (tmp_path / PROCESSES_DIR / "4.json").write_text("{torn")
    (lost,) = lost_processes(read_beats(tmp_path), now, HEARTBEAT_TIMEOUT_S)
    assert (lost.process, lost.beat.id.host, lost.beat.id.pid, lost.beat.step) == (
        1,
        "node7",
        4243,
        5,
    )
    assert (
        lost.describe() == "lost process 1 (pid 4243 on node7): no heartbeat for 40 s, last step 5"
    )


def test_the_lost_allowance_follows_a_short_watchdog_floor():
    assert heartbeat_allowance_s(300.0) == HEARTBEAT_TIMEOUT_S
    assert heartbeat_allowance_s(5.0) == 5.0
    assert heartbeat_allowance_s(0.1) == 3.0  # never under three beats
    assert heartbeat_allowance_s(None) == HEARTBEAT_TIMEOUT_S  # a record without a floor


def test_another_processes_stall_is_recorded_once_with_its_process(tmp_path):
    record = RunRecord(tmp_path, "run")
    watch = PeerWatch(tmp_path, Heartbeat(tmp_path), record, HEARTBEAT_TIMEOUT_S, on_lost=print)
    stall = {"phase": "step", "elapsed_s": 12.5, "threshold_s": 10.0, "step": 3}
    beat_file(tmp_path, 1, stall=stall)
    watch.check()
    watch.check()
    beat_file(tmp_path, 1, stall={**stall, "step": 4})
    watch.check()
    record.close()
    stalls = events(tmp_path, "stall")
    assert [(s["process"], s["step"], s["phase"]) for s in stalls] == [
        (1, 3, "step"),
        (1, 4, "step"),
    ]
    assert stalls[0]["elapsed_s"] == 12.5 and stalls[0]["threshold_s"] == 10.0


def test_a_lost_peer_is_reported_once(tmp_path):
    found = []
    watch = PeerWatch(tmp_path, Heartbeat(tmp_path), RunRecord(tmp_path, "run"), 5.0, found.append)
    beat_file(tmp_path, 1)
    watch.check()
    assert found == []
    beat_file(tmp_path, 1, beat=time.time() - 6)
    watch.check()
    watch.check()
    assert [[p.process for p in lost] for lost in found] == [[1]]


def test_a_process_of_this_host_that_is_gone_is_lost_at_once(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    beat_file(tmp_path, 1, host=socket.gethostname(), pid=gone.pid)  # beating just now
    (lost,) = lost_processes(read_beats(tmp_path), time.time(), HEARTBEAT_TIMEOUT_S)
    assert lost.process == 1 and "is gone" in lost.describe()


def test_a_peer_that_failed_alone_is_lost_once_its_last_beat_is_past_the_allowance(tmp_path):
    """A save that failed on one host: that process ended failed while this one runs on into a
    collective it would wait in for ever."""
    now = time.time()
    beat_file(tmp_path, 1, beat=now - 40, status="failed")
    beat_file(tmp_path, 2, beat=now - 5, status="failed")  # failing with this one, just now
    beat_file(tmp_path, 3, beat=now - 40, status="stopped")  # a signal: every process stops
    (lost,) = lost_processes(read_beats(tmp_path), now, HEARTBEAT_TIMEOUT_S)
    assert lost.process == 1
    assert lost.describe() == "lost process 1 (pid 4243 on node7): failed 40 s ago, last step 5"


def test_a_peer_inside_a_save_is_named_so_when_lost_and_when_this_process_stalls(tmp_path, capsys):
    heartbeat = Heartbeat(tmp_path)  # process 0: this one
    heartbeat.in_phase("checkpoint_save", 4)
    assert read_beats(tmp_path)[0].saving == 4  # published at once, not at the next beat
    heartbeat.in_phase("data_wait", 5)
    heartbeat.beat(None, force=True)
    assert read_beats(tmp_path)[0].saving is None
    now = time.time()
    beat_file(tmp_path, 1, beat=now - 40, step=4, saving=4)
    (lost,) = lost_processes(read_beats(tmp_path), now, HEARTBEAT_TIMEOUT_S)
    assert lost.describe() == (
        "lost process 1 (pid 4243 on node7): no heartbeat for 40 s, last step 4, inside the "
        "checkpoint save of step 4"
    )
    beat_file(tmp_path, 1, step=4, saving=4)
    hook = StallHook(ObservabilityOptions(watchdog_floor=1.0), MutedRecord(tmp_path, "r"), None)
    hook.on_stall(Stall(phase="step", elapsed_s=6.2, threshold_s=4.0, step=6, stacks=[]))
    assert capsys.readouterr().err == (
        "titan: stall: step 6 has taken 6.2 s (stall allowance 4.0 s); "
        "process 1 (pid 4243 on node7) is inside the checkpoint save of step 4\n"
    )
    save = Stall(phase="checkpoint_save", elapsed_s=31.0, threshold_s=30.0, step=4, stacks=[])
    assert save.where() == "the checkpoint save of step 4"
