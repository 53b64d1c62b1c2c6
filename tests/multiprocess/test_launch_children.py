"""``titan launch``'s children never outlive it; it refuses more processes than the host holds;
inside a SLURM step each child still owns every GPU it is given."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import cli_args, small_run

from titan import cli_command
from titan.cli import main
from titan.launch.local import (
    PROCESSES_PER_CPU,
    Forwarder,
    child_envs,
    max_processes,
    supervise,
)


def test_launch_refuses_more_processes_than_the_host_holds(capsys):
    assert main(["launch", "--processes", str(max_processes() + 1), "--", "train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("titan launch: error: --processes ") and len(err.splitlines()) == 1
    assert f"at most {max_processes()} ({PROCESSES_PER_CPU} per CPU" in err


def _child(*lines: str, code: int = 0, errors: tuple[str, ...] = ()) -> subprocess.Popen:
    """A process that prints ``lines``, then ``errors`` on stderr, and exits with ``code``, piped
    as the launcher pipes."""
    script = (
        f"import sys; [print(x, flush=True) for x in {list(lines)!r}]; "
        f"[print(e, file=sys.stderr) for e in {list(errors)!r}]; sys.exit({code})"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


GLOO = "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"


def test_launch_shows_process_0_without_gloo_lines_and_a_failed_process_last_lines():
    out = io.StringIO()
    code = supervise([_child(GLOO, "step 1/2"), _child(GLOO, "step 1/2")], out, False)
    assert (code, out.getvalue()) == (0, "[0] step 1/2\n")
    out = io.StringIO()
    first = _child("step 1/2")
    first.wait()  # done before the other fails: a failure stops the processes still running
    # gloo's line, whole or cut (its C++ stream is not Python's), is left out of a tail too
    cut = GLOO.split("to ")
    failing = _child(GLOO, "step 1/2", cut[0] + "to ", cut[1], code=2, errors=("titan: bad",))
    err = io.StringIO()
    assert supervise([first, failing], out, False, err=err) == 2
    assert out.getvalue().splitlines() == ["[0] step 1/2", "[1] step 1/2"]
    assert err.getvalue().splitlines() == ["[1] titan: bad"]
    out = io.StringIO()  # --all-logs: every line of every process
    assert supervise([_child(GLOO, "a"), _child(GLOO, "b")], out, True) == 0
    assert sorted(out.getvalue().splitlines()) == sorted(
        [f"[0] {GLOO}", "[0] a", f"[1] {GLOO}", "[1] b"]
    )


def test_a_failure_is_said_before_the_lines_of_the_processes_it_stops():
    stops_on_sigterm = (
        "import signal, sys, time\n"
        "def stop(*_): print('titan: stopped by SIGTERM'); sys.exit(4)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('step 1/2', flush=True)\n"
        "time.sleep(60)\n"
    )
    running = subprocess.Popen(
        [sys.executable, "-c", stops_on_sigterm],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert running.stdout is not None and running.stdout.readline() == "step 1/2\n"
    out = io.StringIO()  # stdout and stderr in one place: the order they come in
    failing = _child(code=2, errors=("titan train: error: bad",))
    assert supervise([running, failing], out, False, err=out) == 2
    assert out.getvalue().splitlines() == [
        "titan launch: process 1 exited 2; stopping the others",
        "[0] titan: stopped by SIGTERM",
        "[1] titan train: error: bad",
    ]


def test_a_stop_received_while_the_children_start_reaches_those_started_after_it():
    def sleeper() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    forwarder = Forwarder()
    with forwarder.installed():
        forwarder.add(sleeper())
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's stop, between two starts
        forwarder.add(sleeper())
    codes = [child.wait(timeout=30) for child in forwarder.children]
    assert codes == [-signal.SIGTERM, -signal.SIGTERM] and forwarder.kill_at


def _children(pid: int, count: int) -> list[psutil.Process]:
    """The launcher's ``count`` children once each runs ``titan train`` (past its exec: a child
    between fork and exec is still a copy of the launcher, before its death signal is set)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = psutil.Process(pid).children()
        with contextlib.suppress(psutil.Error):
            if len(found) == count and all("--process-id" in c.cmdline() for c in found):
                return found
        time.sleep(0.05)
    raise AssertionError(f"launcher {pid} did not start {count} children")


def _launch_two(corpus_dir: Path, tmp_path: Path, run_id: str) -> subprocess.Popen:
    """``titan launch`` of a 2-process CPU run that would run for a long time."""
    args = cli_args(small_run(corpus_dir, tmp_path, steps=100_000, run_id=run_id, dp=2))
    return subprocess.Popen(
        [sys.executable, "-m", "titan.cli", "launch", "--processes", "2", "--platform", "cpu"]
        + ["--", "train", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_children_die_with_a_killed_launcher(corpus_dir: Path, tmp_path: Path):
    launcher = _launch_two(corpus_dir, tmp_path, "orphan")
    children = _children(launcher.pid, 2)
    for child in children:  # held still: no broken pipe or lost peer can end them instead
        child.send_signal(signal.SIGSTOP)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    _, alive = psutil.wait_procs(children, timeout=60)
    for child in alive:
        child.kill()
    assert alive == []


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has its own SIGTERM handler (``SigCgt`` of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:"))[7:], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.slow
def test_a_second_stop_signal_kills_children_that_do_not_stop(corpus_dir: Path, tmp_path: Path):
    launcher = _launch_two(corpus_dir, tmp_path, "deaf")
    children = _children(launcher.pid, 2)
    for child in children:  # deaf to SIGTERM, as a child blocked in a native call is
        child.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while not _catches_sigterm(launcher.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    code = None
    try:
        # The first is forwarded (the stopped children cannot act on it), a second one SIGKILLs
        # them: signals are sent until the launcher ends, as two sent at once may arrive as one.
        for _ in range(20):
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = launcher.wait(timeout=3)
                break
    finally:
        _, alive = psutil.wait_procs(children, timeout=5)
        for child in alive:
            child.kill()
        launcher.kill()
    # 137: killed at the second signal; 143: a child not yet past its start-up's signal handler
    # ended by the first (the worst code of those that ended by themselves)
    assert alive == [] and code in (128 + signal.SIGKILL, 128 + signal.SIGTERM), code


@pytest.mark.parametrize("shadow", ["titan/__init__.py", "titan.py"])
def test_children_run_the_installed_titan_from_a_directory_that_shadows_it(
    shadow, tmp_path, monkeypatch
):
    (tmp_path / shadow).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / shadow).write_text("raise SystemExit('the shadow was imported')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    monkeypatch.chdir(tmp_path)  # where the launcher runs, and its children
    done = subprocess.run(cli_command("--version"), capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("titan ")


def _devices_jax_gives(env: dict[str, str], process: int, monkeypatch) -> list[str]:
    """The GPUs a child with ``env`` may use once ``jax.distributed.initialize`` has run with the
    launcher's flags: its ``CUDA_VISIBLE_DEVICES`` narrowed to the ``local_device_ids`` JAX takes
    from ``JAX_LOCAL_DEVICE_IDS`` or its cluster detection (JAX's own code, stopped before it
    connects)."""
    from jax._src import distributed

    class Joined(Exception):
        pass

    for name in [n for n in os.environ if n.startswith(("SLURM_", "JAX_", "CUDA_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    chosen: dict[str, str] = {}

    class Config:
        def update(self, name: str, value: str) -> None:
            chosen[name] = value

    def connect(*args, **kwargs):
        raise Joined

    monkeypatch.setattr(distributed, "config", Config())
    monkeypatch.setattr(distributed._jax, "get_distributed_runtime_service", connect)
    monkeypatch.setattr(distributed._jax, "get_distributed_runtime_client", connect)
    with contextlib.suppress(Joined):
        distributed.State().initialize("127.0.0.1:1234", 2, process)
    gpus = env["CUDA_VISIBLE_DEVICES"].split(",")
    ids = chosen.get("jax_cuda_visible_devices")
    return (
        [gpus[int(i)] if int(i) < len(gpus) else f"none ({i})" for i in ids.split(",")]
        if ids
        else gpus
    )


@pytest.mark.parametrize("local_id", ["0", "3"])
def test_children_inside_a_slurm_step_own_every_gpu_they_are_given(monkeypatch, local_id):
    step = {  # an `srun --pty bash` step of one task on a node of 4 GPUs
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "node7",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": local_id,
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "PATH": os.environ["PATH"],
    }
    envs = child_envs(2, None, "gpu", step)
    owned = [_devices_jax_gives(env, i, monkeypatch) for i, env in enumerate(envs)]
    assert owned == [["0", "1"], ["2", "3"]]
    assert not [n for env in envs for n in env if n.startswith("SLURM_")]


def test_launch_writes_the_childrens_errors_and_its_own_to_stderr(tmp_path):
    proc = subprocess.run(
        [*cli_command("launch", "--processes", "2", "--platform", "cpu", "--all-logs"), "--"]
        + ["train", "--bogus-flag", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "error" not in proc.stdout, proc.stdout
    err = proc.stderr.splitlines()
    assert [line for line in err if "unrecognized arguments: --bogus-flag 1" in line]
    # each child that said it is named; the first to exit stops the other, which may say
    # nothing of its own before it is stopped
    assert {line[:3] for line in err if "unrecognized arguments" in line} <= {"[0]", "[1]"}
    assert "titan launch" not in proc.stdout  # the launcher's own lines, when any, go to stderr
