"""End-to-end training: the loss falls, the record is complete, resume and signals lose nothing."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pty
import re
import select
import shutil
import signal
import sys
import time
import warnings

import pytest
from helpers import cli_args, events, run_in_process, start_subprocess, wait_for_event

from titan.analysis.ettr import analyze
from titan.checkpoint.checkpointer import Checkpointer
from titan.cli import main
from titan.config import TrainConfig
from titan.errors import TitanError
from titan.exit_codes import EXIT_STOPPED
from titan.optimizer import learning_rate_schedule, schedule_text, warmup_note
from titan.telemetry.records import load_events
from titan.trainer.saver import Saver
from titan.trainer.train import resume_options

REQUIRED = {"schema", "type", "time", "run_id"}


@pytest.mark.slow
def test_training_reduces_loss_and_records_the_run(small_options):
    options = {**small_options, "steps": 40, "run_id": "learn", "checkpoint_every": 20}
    code, run_dir = run_in_process(options)
    assert code == 0
    all_events = events(run_dir)
    assert all(REQUIRED <= e.keys() and e["schema"] == 1 for e in all_events)
    assert [e["type"] for e in all_events][:2] == ["run_start", "compile"]
    assert all_events[-1] == {**all_events[-1], "type": "run_end", "status": "completed"}
    steps = events(run_dir, "step")
    assert [e["step"] for e in steps] == list(range(1, 41))
    assert abs(steps[0]["loss"] - math.log(512)) < 0.3
    assert steps[-1]["loss"] < steps[0]["loss"] - 1.5
    assert {e["step"] for e in events(run_dir, "checkpoint")} == {20, 40}
    start = events(run_dir, "run_start")[0]
    native = dict.fromkeys(("attention", "rms_norm", "swiglu"), "native")
    assert start["ops"] == {**native, "rope": "fused", "cross_entropy": "fused"}
    assert start["env"]["packages"]["jax"]
    assert start["model"]["vocab_size"] == 512
    # set-up (corpus, tokenizer, build) came before run_start, and ETTR counts from it
    compiled = events(run_dir, "compile")[0]
    assert start["setup_start"] < compiled["time"] - compiled["seconds"]
    assert start["setup_start"] < start["time"]
    goodput = analyze(load_events(run_dir))
    assert goodput.attempts[0].start == start["setup_start"]
    assert goodput.badput_s["compilation"] >= compiled["seconds"]
    assert min(goodput.badput_s.values()) > -0.05  # clocks apart: step times use perf_counter
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["train"]["optimizer"]["steps"] == 40  # sectioned, as config_to_data writes
    assert (run_dir / "tokenizer.model").stat().st_size > 0


def _step_record(run_dir):
    return {e["step"]: (e["batch_digest"], e["loss"]) for e in events(run_dir, "step")}


@pytest.mark.slow
def test_resume_continues_data_and_loss_exactly(small_options):
    _, whole = run_in_process({**small_options, "run_id": "whole"})
    _, part = run_in_process({**small_options, "run_id": "part", "steps": 3})
    with pytest.raises(TitanError, match="--steps 3 leaves nothing to train: .* at step 3"):
        run_in_process({**small_options, "run_id": "part", "steps": 3}, resume=part)
    (part / "checkpoints" / "9").mkdir()  # made by hand: not a checkpoint, skipped
    code, resumed = run_in_process({**small_options, "run_id": "part", "steps": 6}, resume=part)
    assert code == 0 and resumed == part
    starts = events(part, "run_start")
    assert [s["resumed_from_step"] for s in starts] == [None, 3]
    expected, got = _step_record(whole), _step_record(part)
    assert [got[s][0] for s in range(1, 7)] == [expected[s][0] for s in range(1, 7)]
    assert len({d for d, _ in got.values()}) == 6
    for s in range(1, 7):
        assert got[s][1] == pytest.approx(expected[s][1], rel=1e-5)


@pytest.mark.slow
def test_a_resume_started_elsewhere_reads_the_runs_relative_paths_where_it_started(
    small_options, corpus_dir, tmp_path, monkeypatch, capsys
):
    """``--data data`` (relative) of a run started in ``start/``; ``--resume`` from ``other/``
    works there, says so and continues the run; without the start folder, ``data`` is named."""
    start, other = tmp_path / "start", tmp_path / "other"
    shutil.copytree(corpus_dir, start / "data")
    other.mkdir()
    monkeypatch.chdir(start)
    options = {**small_options, "data": "data", "runs_root": "runs", "steps": 3}
    assert main(["train", *cli_args({**options, "run_id": "r"})]) == 0
    monkeypatch.chdir(other)
    capsys.readouterr()
    assert main(["train", "--resume", "../start/runs/r", "--steps", "6"]) == 0
    assert f"titan: working in {start}, where the run started" in capsys.readouterr().out
    run_dir = start / "runs" / "r"
    assert [e["env"]["cwd"] for e in events(run_dir, "run_start")] == [str(start)] * 2
    assert events(run_dir, "run_end")[-1]["step"] == 6
    moved = tmp_path / "moved"
    start.rename(moved)  # where the run started is gone: the paths are read from here
    os.chdir(other)
    assert main(["train", "--resume", "../moved/runs/r", "--steps", "9"]) == 2
    out, err = capsys.readouterr()
    assert f"titan: the run started in {start}, which is gone" in out
    assert "--data data: no such file or directory" in err


@pytest.mark.slow
def test_a_run_whose_output_reader_goes_away_trains_on_to_its_end(small_options):
    """``titan train ... | head``: stdout and stderr closed by their reader after the first
    step's line; the run goes on, checkpoints and completes (exit 0)."""
    options = {**small_options, "run_id": "piped", "steps": 12, "log_every": 1}
    proc = start_subprocess(options)
    assert proc.stdout is not None and proc.stderr is not None
    while not proc.stdout.readline().startswith("step 1/"):
        pass
    proc.stdout.close()
    proc.stderr.close()
    assert proc.wait(timeout=300) == 0
    run_dir = small_options["runs_root"] + "/piped"
    end = events(run_dir, "run_end")
    assert [(e["status"], e["step"]) for e in end] == [("completed", 12)]
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [3, 6, 9, 12]


@pytest.mark.slow
def test_resume_with_more_steps_keeps_the_schedule_and_continues_at_the_minimum(
    small_options, capsys
):
    options = {**small_options, "run_id": "extend", "steps": 4, "warmup_steps": 1, "lr": 1e-3}
    options["checkpoint_every"] = 4
    _, run_dir = run_in_process(options)
    assert main(["train", "--resume", str(run_dir), "--steps", "7"]) == 0
    err = capsys.readouterr().err
    assert (
        "titan: resuming from step 4: to step 7; learning rate: cosine to 1.00e-04 after step 4, "
        "then constant (--decay-steps sets where the decay ends)"
    ) in err
    lrs = [e["lr"] for e in events(run_dir, "step")]
    assert lrs[:2] == pytest.approx([0.0, 1e-3])  # the one warmup step, then the peak
    assert lrs[1] > lrs[2] > lrs[3] > 1e-4  # the cosine of the first 4 steps, unchanged
    assert lrs[4:] == pytest.approx([1e-4] * 3)  # steps 5 to 7 at --min-lr-ratio x --lr
    saved = json.loads((run_dir / "config.json").read_text())["train"]["optimizer"]
    assert (saved["steps"], saved["decay_steps"]) == (7, 4)


@pytest.mark.parametrize(
    ("explicit", "decay_steps"),
    [({"steps": 30}, 20), ({"steps": 30, "decay_steps": 30}, 30), ({"steps": 10}, 20)],
)
def test_resume_keeps_the_decay_length_unless_decay_steps_is_given(tmp_path, explicit, decay_steps):
    resumed = _resumed_optimizer(tmp_path, TrainConfig.of(steps=20), explicit)
    assert resumed.decay_steps == decay_steps


def _resumed_optimizer(tmp_path, saved: TrainConfig, explicit: dict):
    (tmp_path / "config.json").write_text(
        json.dumps({"train": dataclasses.asdict(saved), "model": {}})
    )
    (tmp_path / "tokenizer.model").write_bytes(b"")
    return resume_options(tmp_path, explicit).optimizer


@pytest.mark.parametrize(
    ("explicit", "warmup_steps"),
    [({"steps": 24, "decay_steps": 200}, 20), ({"steps": 24}, 30), ({"steps": 10}, 30)],
)
def test_a_new_decay_length_keeps_the_warmup_the_old_length_cut(tmp_path, explicit, warmup_steps):
    # 20 steps of a 30-step warmup: the rate rose over those 20 steps, on every resume
    resumed = _resumed_optimizer(tmp_path, TrainConfig.of(steps=20, warmup_steps=30), explicit)
    assert resumed.warmup_steps == warmup_steps
    assert resumed.schedule_steps()[1] == 20


def test_a_new_decay_length_never_drops_back_into_the_warmup(tmp_path):
    saved = TrainConfig.of(steps=20, warmup_steps=30)
    resumed = _resumed_optimizer(tmp_path, saved, {"steps": 24, "decay_steps": 200})
    rates = [float(learning_rate_schedule(resumed)(n)) for n in range(17, 24)]
    assert rates[:4] == [float(learning_rate_schedule(saved.optimizer)(n)) for n in range(17, 21)]
    assert max(rates) == rates[3] == pytest.approx(saved.optimizer.lr)  # the peak, then decay
    assert rates[3:] == sorted(rates[3:], reverse=True)


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_stops(small_options):
    options = {**small_options, "run_id": "sig", "steps": 100000, "checkpoint_every": 1000}
    options["exit_zero_on_stop"] = True  # exit 0, not EXIT_STOPPED
    proc = start_subprocess(options)
    run_dir = small_options_run_dir(options)
    wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] >= 2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    end = events(run_dir)[-1]
    assert end["type"] == "run_end" and end["status"] == "stopped"
    assert end["signal"] == "SIGTERM"
    checkpoints = events(run_dir, "checkpoint")
    assert checkpoints[-1]["step"] == end["step"] == events(run_dir, "step")[-1]["step"]


@pytest.mark.slow
def test_a_signal_during_the_last_save_leaves_the_run_completed(small_options, monkeypatch):
    wait = Saver.wait

    def signalled_wait(saver):  # the last save, after every step: SIGTERM now
        os.kill(os.getpid(), signal.SIGTERM)
        wait(saver)

    monkeypatch.setattr(Saver, "wait", signalled_wait)
    code, run_dir = run_in_process({**small_options, "run_id": "late", "steps": 4})
    assert code == 0
    end = events(run_dir)[-1]
    assert (end["type"], end["status"], end["step"]) == ("run_end", "completed", 4)
    assert end["signal"] == "SIGTERM" and events(run_dir, "checkpoint")[-1]["step"] == 4


@pytest.mark.slow
def test_terminal_hangup_checkpoints_and_stops_cleanly(small_options):
    # The SSH session (a pseudo-terminal here) that started the run goes away: SIGHUP, and the
    # terminal the progress bar writes to is gone.
    options = {**small_options, "run_id": "hangup", "steps": 100000, "checkpoint_every": 1000}
    options["exit_zero_on_stop"] = True  # exit 0, not EXIT_STOPPED
    run_dir = small_options_run_dir(options)
    with warnings.catch_warnings():  # the child only calls execv: no JAX thread is needed there
        warnings.simplefilter("ignore", RuntimeWarning)
        pid, terminal = pty.fork()
    if pid == 0:
        argv = [sys.executable, "-m", "titan.cli", "train", *cli_args(options)]
        os.execv(sys.executable, argv)
    deadline = time.monotonic() + 240
    while not [e for e in _events_if_any(run_dir) if e["type"] == "step" and e["step"] >= 2]:
        assert time.monotonic() < deadline, "no step 2"
        if select.select([terminal], [], [], 0.2)[0]:  # keep the terminal's buffer drained
            os.read(terminal, 65536)
    os.close(terminal)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    end = events(run_dir)[-1]
    assert (end["type"], end["status"], end["signal"]) == ("run_end", "stopped", "SIGHUP")
    assert events(run_dir, "checkpoint")[-1]["step"] == end["step"]


@pytest.mark.slow
def test_two_runs_of_one_id_started_together_one_runs_and_the_other_is_refused(small_options):
    options = {**small_options, "run_id": "race", "steps": 100000, "checkpoint_every": 1000}
    run_dir = small_options_run_dir(options)
    procs = {seed: start_subprocess({**options, "seed": seed}) for seed in (1, 2)}
    deadline = time.monotonic() + 240
    while all(p.poll() is None for p in procs.values()):
        assert time.monotonic() < deadline, "neither run was refused"
        time.sleep(0.1)
    (lost,) = [seed for seed, p in procs.items() if p.returncode is not None]
    (won,) = set(procs) - {lost}
    _, err = procs[lost].communicate()
    assert procs[lost].returncode == 2
    # the holder's pid is named once it has written it (a refusal in the same instant has none)
    assert err.count("\n") == 1 and re.search(r"race is in use by a live run( \(pid \d+\))?:", err)
    wait_for_event(run_dir, lambda e: e["type"] == "step" and e["step"] >= 2)
    with pytest.raises(TitanError, match="in use by a live run .*: stop it before --resume"):
        run_in_process(options, resume=run_dir)
    procs[won].send_signal(signal.SIGTERM)
    assert procs[won].wait(timeout=120) == EXIT_STOPPED
    record = events(run_dir)
    assert [e["config"]["seed"] for e in record if e["type"] == "run_start"] == [won]
    steps = [e["step"] for e in record if e["type"] == "step"]
    assert steps == list(range(1, len(steps) + 1))
    assert (record[-1]["type"], record[-1]["status"]) == ("run_end", "stopped")
    assert json.loads((run_dir / "config.json").read_text())["train"]["run"]["seed"] == won
    assert not (run_dir / "run.lock").exists()


def _events_if_any(run_dir) -> list[dict]:
    return events(run_dir) if (run_dir / "events.jsonl").exists() else []


@pytest.mark.slow
def test_killed_run_resumes_from_last_committed_checkpoint(small_options):
    # A constant learning rate after warmup: the redone steps get the first attempt's rates
    # although the resume gives another --steps (the cosine's horizon).
    options = {**small_options, "run_id": "killed", "steps": 100000, "checkpoint_every": 2}
    options["min_lr_ratio"] = 1.0
    proc = start_subprocess(options)
    run_dir = small_options_run_dir(options)
    wait_for_event(run_dir, lambda e: e["type"] == "checkpoint" and e["step"] >= 4)
    proc.kill()
    proc.wait(timeout=60)
    before = _step_record(run_dir)
    # The newest committed one: its event may be missing when the kill came between the commit
    # and the event (an async save commits in the background), never the other way round.
    checkpointer = Checkpointer(run_dir)
    last_checkpoint = checkpointer.latest_step()
    checkpointer.close()
    assert last_checkpoint >= max(e["step"] for e in events(run_dir, "checkpoint"))
    target = max(before) + 2
    code, _ = run_in_process({**options, "steps": target}, resume=run_dir)
    assert code == 0
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == last_checkpoint
    redone = [e for e in events(run_dir, "step")][len(before) :]
    assert redone[0]["step"] == last_checkpoint + 1
    for event in redone:
        if event["step"] in before:
            assert event["batch_digest"] == before[event["step"]][0]
            assert event["loss"] == pytest.approx(before[event["step"]][1], rel=1e-5)
    assert events(run_dir)[-1]["status"] == "completed"


def small_options_run_dir(options):
    from pathlib import Path

    return Path(options["runs_root"]) / options["run_id"]


@pytest.mark.parametrize(
    ("explicit", "profile_steps"),
    [({"steps": 100}, "5:100"), ({"steps": 4}, ""), ({"steps": 100, "profile_steps": ""}, "")],
)
def test_resume_cuts_the_saved_profile_range_to_a_lowered_steps(tmp_path, explicit, profile_steps):
    saved = TrainConfig.of(steps=200, profile_steps="5:150")
    (tmp_path / "config.json").write_text(
        json.dumps({"train": dataclasses.asdict(saved), "model": {}})
    )
    (tmp_path / "tokenizer.model").write_bytes(b"")
    cfg = resume_options(tmp_path, explicit)
    assert (cfg.optimizer.steps, cfg.record()["profile_steps"]) == (
        explicit["steps"],
        profile_steps,
    )


@pytest.mark.parametrize(
    ("explicit", "expected"),
    [
        # onto SPMD: the saved pipeline options fall back to their defaults, --microbatches stays
        ({"layout": "spmd", "fsdp": 2, "tp": 2}, (1, 1, "1f1b", (), 2)),
        # an option given on this command line is kept (and checked as given)
        ({"layout": "spmd", "microbatches": 1}, (1, 1, "1f1b", (), 1)),
        # the pipeline stays as saved when the layout does
        ({"steps": 4}, (2, 2, "interleaved-1f1b", (1, 1, 1, 1), 2)),
        # a schedule of one chunk per stage: the virtual stages (and their layers) fall back
        ({"schedule": "gpipe"}, (2, 1, "gpipe", (), 2)),
        ({"schedule": "zero-bubble", "stage_layers": (1, 3)}, (2, 1, "zero-bubble", (1, 3), 2)),
    ],
)
def test_resume_onto_spmd_resets_the_saved_pipeline_options(tmp_path, explicit, expected):
    saved = TrainConfig.of(
        layout="mpmd",
        pp=2,
        dp=1,
        microbatches=2,
        schedule="interleaved-1f1b",
        virtual_stages=2,
        stage_layers=(1, 1, 1, 1),
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"train": dataclasses.asdict(saved), "model": {}})
    )
    (tmp_path / "tokenizer.model").write_bytes(b"")
    p = resume_options(tmp_path, explicit).parallel
    assert (p.pp, p.virtual_stages, p.schedule, p.stage_layers, p.microbatches) == expected
    with pytest.raises(TitanError, match="^--pp needs --layout mpmd$"):
        resume_options(tmp_path, {"layout": "spmd", "pp": 2})


def test_resume_of_an_spmd_run_onto_mpmd_takes_the_pipeline_options_given(tmp_path):
    saved = TrainConfig.of(dp=1, microbatches=2)
    (tmp_path / "config.json").write_text(
        json.dumps({"train": dataclasses.asdict(saved), "model": {}})
    )
    (tmp_path / "tokenizer.model").write_bytes(b"")
    p = resume_options(tmp_path, {"layout": "mpmd", "pp": 2}).parallel
    assert (p.layout, p.pp, p.microbatches, p.schedule) == ("mpmd", 2, 2, "1f1b")


def test_a_warmup_as_long_as_the_schedule_is_said_and_described_as_the_rate_runs():
    opt = TrainConfig.of(steps=4, warmup_steps=10, lr=1e-3).optimizer
    rates = [float(learning_rate_schedule(opt)(step)) for step in range(7)]
    assert rates == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-4, 1e-4])
    assert warmup_note(opt) == (
        "--warmup-steps 10 is not below the schedule's 4 steps (--decay-steps, else --steps): "
        "learning rate: linear warmup to 1.00e-03 after step 4, the last step: no decay"
    )
    past = TrainConfig.of(steps=6, decay_steps=4, warmup_steps=4, lr=1e-3).optimizer
    assert schedule_text(past) == (  # the rates above
        "learning rate: linear warmup to 1.00e-03 after step 4, then 1.00e-04 after step 5: "
        "no decay"
    )
    assert warmup_note(TrainConfig.of(steps=5, warmup_steps=4).optimizer) is None
    assert schedule_text(TrainConfig.of(steps=90, decay_steps=50).optimizer) == (
        "learning rate: cosine to 3.00e-04 after step 50, then constant"
    )
