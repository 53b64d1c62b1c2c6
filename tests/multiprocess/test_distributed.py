"""One run across several processes (JAX's distributed runtime, gloo on CPU): the same losses,
batches and record as one process with the same devices; one stop; resume on another number
of processes.

The runs start through ``titan launch`` (2 processes x 2 CPU devices); the one-process runs they
are compared with run in this process on 4 of the test session's 8 CPU devices.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_args, events, run_in_process, small_run, wait_for_event

from titan.errors import TitanError
from titan.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_STALL, EXIT_STOPPED, worst_exit_code
from titan.launch.aborts import AbortText
from titan.launch.local import child_envs, exit_code, free_port, supervise
from titan.parallel.distributed import LaunchSettings, initialize

STEPS = 8
# Gradients summed across processes (gloo) and inside one process add in another order.
RTOL = 1e-5


def launch(options: dict, processes: int = 2, devices: int = 2) -> subprocess.Popen:
    """``titan launch --processes N --devices-per-process D -- train OPTIONS``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "titan.cli",
            "launch",
            "--processes",
            str(processes),
            "--devices-per-process",
            str(devices),
            "--platform",
            "cpu",
            "--",
            "train",
            *cli_args(options),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def heartbeats(run_dir: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in (run_dir / "processes").glob("*.json")}


def step_values(run_dir: Path) -> list[tuple[int, float, float, str]]:
    return [
        (e["step"], e["loss"], e["grad_norm"], e["batch_digest"]) for e in events(run_dir, "step")
    ]


def assert_same_steps(got: list, want: list) -> None:
    assert [s[0] for s in got] == [s[0] for s in want]
    assert [s[3] for s in got] == [s[3] for s in want]  # batch digests: exactly the same data
    for (_, loss, norm, _), (_, want_loss, want_norm, _) in zip(got, want, strict=True):
        assert loss == pytest.approx(want_loss, rel=RTOL)
        assert norm == pytest.approx(want_norm, rel=RTOL)


@pytest.fixture(scope="module")
def options(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A small run on 4 devices (data parallel), its checkpoints only at the end."""
    runs_root = tmp_path_factory.mktemp("runs")
    return small_run(
        corpus_dir, runs_root, steps=STEPS, warmup_steps=2, checkpoint_every=1000, dp=4
    )


@pytest.fixture(scope="module")
def one_process(options: dict) -> Path:
    """The run as one process with 4 devices."""
    code, run_dir = run_in_process({**options, "run_id": "one"})
    assert code == 0
    return run_dir


@pytest.fixture(scope="module")
def two_processes(options: dict) -> Path:
    """The run as 2 processes with 2 devices each."""
    proc = launch({**options, "run_id": "two"})
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    return Path(options["runs_root"]) / "two"


@pytest.mark.slow
def test_two_processes_train_like_one_with_the_same_devices(two_processes, one_process):
    assert len(events(two_processes, "step")) == STEPS
    assert_same_steps(step_values(two_processes), step_values(one_process))


@pytest.mark.slow
def test_two_processes_keep_one_record_and_a_heartbeat_each(two_processes):
    record = events(two_processes)
    steps = [e["step"] for e in record if e["type"] == "step"]
    assert steps == list(range(1, STEPS + 1))  # one event per step, not one per process
    (start,) = [e for e in record if e["type"] == "run_start"]
    assert start["processes"] == 2 and start["layout"]["devices"] == 4
    assert {e["run_id"] for e in record} == {"two"}
    (end,) = [e for e in record if e["type"] == "run_end"]
    assert end["status"] == "completed"
    beats = heartbeats(two_processes)
    assert sorted(beats) == [0, 1]
    assert len({b["pid"] for b in beats.values()}) == 2
    for index, beat in beats.items():
        assert beat["process"] == index and beat["processes"] == 2
        assert beat["step"] == STEPS and beat["status"] == "completed"
        assert beat["started"] <= beat["beat"] <= time.time()


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_after_the_same_step_and_resumes_on_one(
    options, one_process
):
    run_dir = Path(options["runs_root"]) / "stopped"
    proc = launch({**options, "run_id": "stopped", "exit_zero_on_stop": True})
    wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] == 1)
    os.kill(heartbeats(run_dir)[1]["pid"], signal.SIGTERM)  # process 1 only
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output

    (end,) = events(run_dir, "run_end")
    assert end["status"] == "stopped" and 1 <= end["step"] < STEPS
    (checkpoint,) = events(run_dir, "checkpoint")
    assert checkpoint["step"] == end["step"] == events(run_dir, "step")[-1]["step"]
    beats = heartbeats(run_dir)
    assert [beats[i]["status"] for i in (0, 1)] == ["stopped", "stopped"]
    assert beats[0]["step"] == beats[1]["step"] == end["step"]

    code, _ = run_in_process({**options, "run_id": "stopped"}, resume=run_dir)
    assert code == 0
    starts = events(run_dir, "run_start")
    assert [s["processes"] for s in starts] == [2, 1]
    assert starts[-1]["resumed_from_step"] == end["step"]
    assert_same_steps(step_values(run_dir), step_values(one_process))


@pytest.mark.slow
def test_a_resume_onto_fewer_processes_ignores_the_heartbeats_of_the_earlier_ones(
    options, two_processes, tmp_path
):
    run_dir = Path(options["runs_root"]) / "fewer"
    shutil.copytree(two_processes, run_dir)
    for index, status in ((2, "running"), (3, "failed")):  # a crashed 4-process attempt's
        beat = {**heartbeats(run_dir)[1], "process": index, "processes": 4, "status": status}
        # above Linux's largest pid (2**22): no such process
        beat["pid"], beat["beat"] = 2**22 + index, time.time() - 600
        (run_dir / "processes" / f"{index}.json").write_text(json.dumps(beat))
    proc = launch({"resume": str(run_dir), "steps": STEPS + 2})
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output  # not "lost process 2 ... is gone" (exit 1)
    assert sorted(heartbeats(run_dir)) == [0, 1]
    assert events(run_dir, "run_end")[-1]["status"] == "completed"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-processes", "2", "--process-id", "0"], "without --coordinator"),
        (["--coordinator", "127.0.0.1:1", "--num-processes", "0"], "--num-processes 0"),
        (["--num-processes", "2", "--process-id", "2"], "--process-id 2 is out of range"),
        (["--distributed", "off", "--num-processes", "2"], "--distributed off"),
        (["--coordinator", "127.0.0.1:99999", "--num-processes", "2"], "port must be 1 to"),
        (
            [
                "--coordinator",
                "nosuchhost.invalid:1234",
                "--num-processes",
                "2",
                "--process-id",
                "1",
            ],
            "--coordinator nosuchhost.invalid:1234: cannot reach nosuchhost.invalid",
        ),
    ],
)
def test_bad_launch_settings_are_a_one_line_error(tmp_path, flags, message):
    proc = subprocess.run(
        [sys.executable, "-m", "titan.cli", "train", "--runs-root", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_taken_coordinator_port_is_refused_before_joining(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0"]
        proc = subprocess.run(
            [sys.executable, "-m", "titan.cli", "train", "--runs-root", str(tmp_path), *flags],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"port {port} is in use on this host" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_others_to_join_stops_at_once_in_one_line(tmp_path):
    flags = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "titan.cli", "train", "--runs-root", str(tmp_path), *flags]
        + ["--process-id", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    joining = proc.stderr.readline()
    time.sleep(2)  # well inside JAX's native wait for process 1
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert "process 0 joining 2 processes" in joining
    assert proc.returncode == EXIT_STOPPED and time.monotonic() - start < 30
    # one line: not the coordination service's errors as the interpreter shut it down
    assert err.splitlines() == [
        "titan train: stopped by SIGTERM while starting, before the run started: nothing recorded"
    ]
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_processes_started_with_other_options_all_stop_naming_them(corpus_dir, tmp_path):
    port = free_port()
    options = small_run(corpus_dir, tmp_path, steps=2, run_id="mixed", dp=2)
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "titan.cli", "train", *cli_args(options)]
            + ["--lr", lr, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
            + ["--process-id", str(index)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index, lr in enumerate(["0.003", "0.3"])
    ]
    errors = [proc.communicate(timeout=180)[1].strip().splitlines()[-1] for proc in procs]
    assert [proc.returncode for proc in procs] == [2, 2], errors
    assert "another process of this run was started with other options" in errors[0]
    assert "process 1 was started with other options than process 0: --lr 0.3 here, " in errors[1]
    assert not (tmp_path / "mixed").exists()


@pytest.mark.slow
def test_a_process_that_refuses_its_inputs_stops_the_others_before_they_wait(corpus_dir, tmp_path):
    # --data names a folder that process 0's working directory holds and process 1's lacks
    # (one node without the file): process 1 refuses it, process 0 stops too, at once (not
    # after JAX's 300 s wait in the tokenizer's broadcast).
    port = free_port()
    options = {**small_run(corpus_dir, tmp_path, steps=2, run_id="split", dp=2), "data": "corpus"}
    places = [tmp_path / "node0", tmp_path / "node1"]
    for place in places:
        place.mkdir()
    (places[0] / "corpus").symlink_to(corpus_dir)
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "titan.cli", "train", *cli_args(options)]
            + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
            + ["--process-id", str(index)],
            cwd=place,
            env={**env, "PYTHONPATH": os.pathsep.join(sys.path)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index, place in enumerate(places)
    ]
    try:
        errors = [proc.communicate(timeout=120)[1].strip().splitlines()[-1] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [2, 2], errors
    assert "process 1 of the run refused to start (its own output says why)" in errors[0]
    assert "--data corpus: no such file or directory" in errors[1], errors
    assert not (tmp_path / "split").exists()


def test_one_process_without_a_cluster_initialises_nothing():
    assert initialize(LaunchSettings()) == 1
    assert initialize(LaunchSettings(num_processes=1, process_id=0)) == 1
    with pytest.raises(TitanError, match="expected HOST:PORT"):
        initialize(LaunchSettings(coordinator="127.0.0.1:", num_processes=2, process_id=0))


def test_launch_splits_devices_per_process():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_foo=1"}
    cpu = child_envs(2, 2, "cpu", env)
    assert [e["JAX_NUM_CPU_DEVICES"] for e in cpu] == ["2", "2"]
    assert [e["XLA_FLAGS"] for e in cpu] == ["--xla_foo=1", "--xla_foo=1"]
    gpu = child_envs(2, None, "gpu", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in gpu] == ["0,1", "2,3"]
    with pytest.raises(TitanError, match="needs 6 GPUs, 4 visible"):
        child_envs(2, 3, "gpu", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert [exit_code(c) for c in (0, 2, -15)] == [0, 2, 143]


def test_launch_ranks_a_failure_over_a_stop_over_completion():
    assert worst_exit_code([EXIT_OK, EXIT_OK]) == EXIT_OK
    assert worst_exit_code([EXIT_OK, EXIT_STOPPED]) == EXIT_STOPPED
    assert worst_exit_code([EXIT_STOPPED, EXIT_FAILED]) == EXIT_FAILED
    assert worst_exit_code([EXIT_STALL, EXIT_STOPPED, 143]) == 143


@pytest.mark.slow
def test_a_one_process_pipeline_run_resumes_as_spmd_on_two_processes(options, one_process):
    # A schedule of STEPS steps from the start (a resume keeps the first run's decay length).
    pipeline = {"layout": "mpmd", "pp": 2, "dp": 2, "steps": 3, "decay_steps": STEPS}
    code, run_dir = run_in_process({**options, **pipeline, "run_id": "grow"})
    assert code == 0
    proc = launch({"resume": run_dir, "steps": STEPS, "layout": "spmd", "pp": 1, "dp": 4})
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    starts = events(run_dir, "run_start")
    assert [(s["processes"], s["resumed_from_step"]) for s in starts] == [(1, None), (2, 3)]
    assert_same_steps(step_values(run_dir), step_values(one_process))


@pytest.mark.slow
def test_launch_exits_with_the_worst_childs_code(tmp_path):
    proc = launch({"data": str(tmp_path / "missing"), "runs_root": str(tmp_path / "runs")})
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    # The first child to find the bad --data says so; the launcher then stops the other at once,
    # which may or may not have reached the check itself.
    said = {line[:3] for line in output.splitlines() if "no such file" in line}
    assert said and said <= {"[0]", "[1]"}


@pytest.mark.slow
def test_a_pipeline_with_a_stage_per_process_trains_checkpoints_and_resumes_anywhere(
    options, one_process
):
    """pp=2 with each stage on its own process: 1F1B for 3 steps, then resumed on 2 processes
    as interleaved 1F1B (other chunks: re-cut) to the end, and, from a copy of the first part,
    on one process with the same chunks; every step equals the one-process SPMD run."""
    # A schedule of STEPS steps from the start (a resume keeps the first run's decay length).
    pipeline = {"layout": "mpmd", "pp": 2, "dp": 2, "microbatches": 2, "decay_steps": STEPS}
    run_dir = Path(options["runs_root"]) / "stages"
    proc = launch({**options, **pipeline, "steps": 3, "schedule": "1f1b", "run_id": "stages"})
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    items = sorted(p.name for p in (run_dir / "stage_checkpoints" / "3").iterdir())
    assert items == ["chunk_0", "chunk_1"]  # each written by its own process
    copy = Path(options["runs_root"]) / "stages-copy"
    shutil.copytree(run_dir, copy)

    interleaved = {**pipeline, "schedule": "interleaved-1f1b", "virtual_stages": 2}
    proc = launch({"resume": run_dir, "steps": STEPS, **interleaved})
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    starts = events(run_dir, "run_start")
    assert [(s["processes"], s["resumed_from_step"]) for s in starts] == [(2, None), (2, 3)]
    assert [s["layout"]["schedule"] for s in starts] == ["1f1b", "interleaved-1f1b"]
    assert_same_steps(step_values(run_dir), step_values(one_process))

    code, _ = run_in_process({**options, **pipeline, "run_id": "stages-copy"}, resume=copy)
    assert code == 0
    assert [s["processes"] for s in events(copy, "run_start")] == [2, 1]
    assert_same_steps(step_values(copy), step_values(one_process))


@pytest.mark.slow
def test_a_process_killed_with_sigkill_ends_the_run_naming_it(options):
    run_dir = Path(options["runs_root"]) / "killed"
    proc = launch({**options, "run_id": "killed", "steps": 500, "watchdog_floor": 5})
    wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] == 2)
    victim = heartbeats(run_dir)[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output
    (end,) = events(run_dir, "run_end")
    assert end["status"] == "failed" and end["reason"] == "lost_process"
    assert f"lost process 1 (pid {victim} on " in end["error"]
    assert heartbeats(run_dir)[0]["status"] == "failed"
    assert "lost process 1" in output


# The stress runs: 2 processes x 2 devices, a small model (every layout's collectives, little
# compute), 50 steps; every process issues the step's collectives and the stop agreement's in
# the same order, or gloo aborts one of them (a mismatch, as the stop agreement over one device
# per process met FSDP's collectives in about 2 of 3 runs of 20 steps).
STRESS_STEPS = 50
STRESS_MODEL = "d_model=64,n_layers=2,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512"
STRESS_LAYOUTS = {
    "fsdp2-tp2": {"dp": 1, "fsdp": 2, "tp": 2},
    "pp2-stage-per-process": {"layout": "mpmd", "pp": 2, "dp": 2, "microbatches": 2},
}
NONFINITE_STEP = 23
STRESS_VARIANTS = {
    "steps": {"checkpoint_every": 1000},
    # async saves every 5 steps (each with its finite-weights check across the processes) and
    # one poisoned batch, which the guard skips
    "checkpoints-nonfinite": {
        "checkpoint_every": 5,
        "checkpoint_async": True,
        "debug_nonfinite_at_step": NONFINITE_STEP,
    },
}
ABORT_TEXT = ("terminate called", "what():", "enforce fail", "Fatal Python error")


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(STRESS_VARIANTS))
@pytest.mark.parametrize("layout", list(STRESS_LAYOUTS))
def test_two_processes_run_fifty_steps_without_a_collective_mismatch(
    corpus_dir, tmp_path, layout, variant
):
    options = small_run(
        corpus_dir,
        tmp_path,
        run_id="stress",
        steps=STRESS_STEPS,
        warmup_steps=2,
        model=STRESS_MODEL,
        **STRESS_LAYOUTS[layout],
        **STRESS_VARIANTS[variant],
    )
    proc = launch(options)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    assert not [line for line in output.splitlines() if any(t in line for t in ABORT_TEXT)]
    run_dir = tmp_path / "stress"
    (end,) = events(run_dir, "run_end")
    assert (end["status"], end["step"]) == ("completed", STRESS_STEPS)
    steps = events(run_dir, "step")
    assert [s["step"] for s in steps] == list(range(1, STRESS_STEPS + 1))
    skipped = [s["step"] for s in steps if s.get("skipped")]
    saved = [c["step"] for c in events(run_dir, "checkpoint")]
    if variant == "steps":
        assert (skipped, saved) == ([], [STRESS_STEPS])
    else:
        assert skipped == [NONFINITE_STEP]
        assert saved == list(range(5, STRESS_STEPS + 1, 5))
        assert not events(run_dir, "checkpoint_failed")
    assert [b["status"] for b in heartbeats(run_dir).values()] == ["completed", "completed"]


GLOO_ABORT = (
    "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
    "  what():  [enforce fail at external/gloo/gloo/transport/tcp/pair.cc:459] "
    "op.preamble.length <= op.nbytes. 16384 vs 4. Received data size doesn't match expected "
    "size. Is there a distributed collective mismatch in your code?\n"
)


# A child that would run on, ended by SIGTERM (whatever disposition it inherited).
SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_DFL); time.sleep(120)"


def test_a_child_aborted_in_native_code_is_one_line_and_the_worst_code(capfd):
    """A child that prints gloo's abort text (libstdc++'s terminate handler) and dies of a real
    SIGABRT, beside one that would run on: the launcher stops the other, shows none of the
    abort text, says the death in one line with the exception's message, and exits 134."""
    aborting = (
        "import os, sys; print('step 1', flush=True); "
        f"sys.stderr.write({GLOO_ABORT!r}); sys.stderr.flush(); os.abort()"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code in (SLEEPER, aborting)
    ]
    code = supervise(children, sys.stdout, all_logs=True)
    captured = capfd.readouterr()
    lines = captured.out.splitlines() + captured.err.splitlines()
    assert code == 128 + signal.SIGABRT
    assert "[1] step 1" in captured.out.splitlines()
    assert not [line for line in lines if any(t in line for t in ABORT_TEXT[:2])]
    (died,) = [line for line in captured.err.splitlines() if "died of" in line]
    assert died == (
        f"titan launch: process 1 (pid {children[1].pid}) died of SIGABRT: gloo::EnforceNotMet: "
        "[enforce fail at external/gloo/gloo/transport/tcp/pair.cc:459] op.preamble.length <= "
        "op.nbytes. 16384 vs 4. Received data size doesn't match expected size. Is there a "
        "distributed collective mismatch in your code?"
    )
    assert children[0].returncode == -signal.SIGTERM  # stopped by the launcher: said nowhere


def test_an_xla_check_failure_is_taken_off_the_terminal_with_its_message():
    abort = AbortText()
    shown = [
        line
        for line in [
            "step 3/20  loss 5.1\n",
            "F1202 01:46:03.123456   16414 cpu_client.cc:1234] Check failed: ok Bad collective\n",
            "*** Check failure stack trace: ***\n",
            "    @     0x7f3a2c1d4e5f  (unknown)\n",
            "Fatal Python error: Aborted\n",
            "Thread 0x00007f3a (most recent call first):\n",
        ]
        if not abort.take(line)
    ]
    assert shown == ["step 3/20  loss 5.1\n"]
    assert abort.death_line(1, 42, -signal.SIGABRT) == (
        "titan launch: process 1 (pid 42) died of SIGABRT: Check failed: ok Bad collective\n"
    )
    assert abort.death_line(1, 42, 1) is None


@pytest.mark.slow
def test_the_stop_agreement_runs_after_a_step_whose_collectives_cross_the_processes():
    """200 steps of FSDP-like collectives across 2 processes, each followed by the stop
    agreement (tests/fixtures/stop_agreement_beside_step.py); with the reduce over one device
    per process gloo aborted every such run."""
    script = Path(__file__).parents[1] / "fixtures" / "stop_agreement_beside_step.py"
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(port), str(index), "200"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index, env in enumerate(child_envs(2, 2, "cpu", dict(os.environ)))
    ]
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert [out.splitlines()[-1] for out in outputs] == ["ok 0", "ok 1"]
