"""``titan launch``'s children never outlive it; it refuses more processes than the host holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from helpers import cli_args, small_run

from titan.cli import main
from titan.launch.local import PROCESSES_PER_CPU, max_processes


def test_launch_refuses_more_processes_than_the_host_holds(capsys):
    assert main(["launch", "--processes", str(max_processes() + 1), "--", "train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("titan launch: error: --processes ") and len(err.splitlines()) == 1
    assert f"at most {max_processes()} ({PROCESSES_PER_CPU} per CPU" in err


def _children(pid: int, count: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = psutil.Process(pid).children()
        if len(found) == count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"launcher {pid} did not start {count} children")


def test_children_die_with_a_killed_launcher(corpus_dir: Path, tmp_path: Path):
    args = cli_args(small_run(corpus_dir, tmp_path, steps=100_000, run_id="orphan", dp=2))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "titan.cli", "launch", "--processes", "2", "--platform", "cpu"]
        + ["--", "train", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children = _children(launcher.pid, 2)
    for child in children:  # held still: no broken pipe or lost peer can end them instead
        child.send_signal(signal.SIGSTOP)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    _, alive = psutil.wait_procs(children, timeout=60)
    for child in alive:
        child.kill()
    assert alive == []
