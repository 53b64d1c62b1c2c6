"""Start-up that cannot hurt: a stop signal in any start-up phase is one line and exit 4 with
nothing recorded; a failed resume leaves the record byte-identical; a full disk is one line,
with ``run_end`` written where there is room and never a torn line."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    cli_args,
    events,
    file_tree,
    run_in_process,
    small_run,
    start_subprocess,
    trainer_of,
)

import titan.trainer.train as train_module
from titan.checkpoint.checkpointer import CHECKPOINT_DIR, Checkpointer, SaveSchedule
from titan.cli import main
from titan.config import TrainConfig, model_config
from titan.exit_codes import EXIT_FAILED, EXIT_STOPPED
from titan.ops import Ops
from titan.stopping import FRESH_RUN_PHASES, PHASES
from titan.telemetry.events import RunEnd
from titan.telemetry.heartbeat import BEAT_INTERVAL_S
from titan.telemetry.records import (
    EVENTS_FILE,
    DiskFull,
    RunRecord,
    disk_full,
    write_json_atomic,
)
from titan.trainer.processes import Heartbeat
from titan.trainer.saver import Saver
from titan.trainer.train import failure_to_name


def _stopped(proc: subprocess.Popen, phase: str, fresh: bool = False) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_STOPPED, err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        line for line in err.strip().splitlines() if "stopped by SIGINT" in line
    ]
    named = FRESH_RUN_PHASES.get(phase, PHASES[phase]) if fresh else PHASES[phase]
    assert f"stopped by SIGINT while {named}, before the run started" in err


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_in_each_start_up_phase_is_one_line_exit_4_and_leaves_nothing(
    phase, corpus_dir, tmp_path, monkeypatch
):
    # A cache of its own: the tokenizer is trained and the corpus tokenized in this run.
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    options = small_run(corpus_dir, runs, steps=2, dp=1, run_id="r", debug_signal_in=phase)
    _stopped(start_subprocess(options), phase, fresh=True)
    assert not runs.exists()  # the claimed run dir (and the root it made) is removed again
    # finished token files, or an interrupted tokenization's committed part (resumed next time)
    tokens = tmp_path / "cache" / "tokens"
    kept = (".u32", ".json", ".partial", ".lock")
    assert not tokens.exists() or all(p.suffix in kept for p in tokens.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["tokenizer", "build", "restore", "trace"])
def test_ctrl_c_while_a_resume_starts_leaves_the_record_byte_identical(
    phase, finished_run, tmp_path
):
    run_dir = tmp_path / "done"
    shutil.copytree(finished_run, run_dir)
    before = file_tree(run_dir)
    proc = start_subprocess({}, "--resume", str(run_dir), "--steps", "4", *_debug(phase))
    _stopped(proc, phase)
    assert file_tree(run_dir) == before


def _debug(phase: str) -> list[str]:
    return cli_args({"debug_signal_in": phase})


def test_sigterm_while_the_model_is_built_stops_in_process(small_options, monkeypatch):
    built = train_module.build_run_trainer

    def build_then_signal(*args, **kwargs):
        trainer = built(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return trainer

    monkeypatch.setattr(train_module, "build_run_trainer", build_then_signal)
    handler = signal.getsignal(signal.SIGTERM)
    code, run_dir = run_in_process({**small_options, "run_id": "term"})
    assert code == EXIT_STOPPED
    assert not run_dir.exists()
    assert signal.getsignal(signal.SIGTERM) is handler  # put back


class _SignalOnCollection:
    """Sends SIGTERM to this process when collected: a signal handled inside a finalizer, as
    one landing in JAX's garbage-collection callback is."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_handled_inside_a_finalizer_is_still_one_line_exit_4(
    small_options, monkeypatch, capsys
):
    built = train_module.build_run_trainer

    def build_then_collect(*args, **kwargs):
        _SignalOnCollection()  # collected at once: the stop is raised where nothing catches it
        return built(*args, **kwargs)

    monkeypatch.setattr(train_module, "build_run_trainer", build_then_collect)
    printed: list = []  # what would be printed as "Exception ignored in: ..."
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    code, run_dir = run_in_process({**small_options, "run_id": "term"})
    err = capsys.readouterr().err
    assert code == EXIT_STOPPED and not run_dir.exists()
    assert printed == []
    assert err.splitlines() == [
        "titan train: stopped by SIGTERM while building the model, before the run started: "
        "nothing recorded"
    ]


def test_ctrl_c_before_the_trainer_is_imported_is_one_line_exit_4(tmp_path, monkeypatch, capsys):
    def interrupted_import(*args):  # as if Ctrl-C came while JAX is being imported
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("the signal was not handled")

    monkeypatch.setattr(train_module, "train_from_cli", interrupted_import)
    handler = signal.getsignal(signal.SIGINT)
    assert main(["train", "--runs-root", str(tmp_path / "runs")]) == EXIT_STOPPED
    err = capsys.readouterr().err
    assert err == (
        "titan train: stopped by SIGINT while starting, before the run started: nothing recorded\n"
    )
    assert signal.getsignal(signal.SIGINT) is handler
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_resume_refused_while_tracing_leaves_config_json_and_resumes_after(
    finished_run, tmp_path, capsys
):
    run_dir = tmp_path / "done"
    shutil.copytree(finished_run, run_dir)
    before = file_tree(run_dir)
    argv = ["train", "--resume", str(run_dir), "--steps", "3"]
    assert main([*argv, "--ops", "swiglu=pallas"]) == 2  # found only while tracing
    err = capsys.readouterr().err
    assert "ffn dim 688 must be a multiple of 128" in err and err.count("\n") == 1
    assert file_tree(run_dir) == before
    assert main(argv) == 0  # the refused --ops was not saved
    starts = events(run_dir, "run_start")
    assert [s["resumed_from_step"] for s in starts] == [None, 2]
    assert [e["type"] for e in events(run_dir)].count("run_end") == 2


@pytest.mark.slow
def test_a_resume_through_a_link_to_the_run_dir_continues_the_run_it_names(finished_run, tmp_path):
    run_dir = tmp_path / "runs" / "done"
    shutil.copytree(finished_run, run_dir)
    (tmp_path / "link").symlink_to(run_dir)
    assert main(["train", "--resume", str(tmp_path / "link"), "--steps", "3"]) == 0
    starts = events(run_dir, "run_start")
    assert [s["run_id"] for s in starts] == ["done", "done"]
    assert events(run_dir, "checkpoint")[-1]["path"] == str(run_dir / "checkpoints" / "3")


@pytest.mark.slow
def test_a_provider_forced_for_an_op_the_model_never_calls_is_said_to_have_no_effect(
    finished_run, tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "done"
    shutil.copytree(finished_run, run_dir)
    monkeypatch.setenv("TITAN_OPS", "patch_embed=native")
    argv = ["train", "--resume", str(run_dir), "--steps", "3"]
    assert main([*argv, "--ops", "modulate=native,attention=native"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "has no effect" in line]
    assert said == [
        "titan: patch_embed=native (--ops, TITAN_OPS) has no effect: the model calls no "
        "patch_embed",
        "titan: modulate=native (--ops, TITAN_OPS) has no effect: the model calls no modulate",
    ]
    assert events(run_dir, "run_start")[-1]["ops"]["attention"] == "native"


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` (skips the test where mounting is not allowed)."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 4096)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x")
    return filler


def test_a_full_disk_never_leaves_a_torn_line_and_the_record_continues_after(tmp_path):
    with _tmpfs(tmp_path / "disk", "64k") as disk:
        record = RunRecord(disk, "full")
        record.emit(RunEnd(status="stopped", step=1))
        written = (disk / EVENTS_FILE).read_bytes()
        filler = _fill(disk)
        long_end = RunEnd(status="failed", step=2, error="x" * 20000)  # crosses pages
        with pytest.raises(OSError) as caught:
            record.emit(long_end)
        assert caught.value.errno == errno.ENOSPC
        assert (disk / EVENTS_FILE).read_bytes() == written  # cut back: no torn line
        assert disk_full(caught.value) == f"disk full (ENOSPC): cannot write {disk / EVENTS_FILE}"
        filler.unlink()
        record.emit(long_end)
        record.close()
        assert [e["step"] for e in events(disk)] == [1, 2]


@pytest.mark.slow
def test_a_disk_that_fills_during_a_checkpoint_is_one_line_with_run_end(corpus_dir, tmp_path):
    with _tmpfs(tmp_path / "disk", "1m") as disk:
        options = small_run(corpus_dir, disk, steps=50, checkpoint_every=5, dp=1, run_id="full")
        proc = start_subprocess(options)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == EXIT_FAILED
        assert err.strip().splitlines() == [err.strip()], err  # one line
        assert "titan train: error: disk full (ENOSPC): cannot write " in err
        assert "/full/checkpoints/5" in err
        raw = (disk / "full" / EVENTS_FILE).read_bytes()
        assert raw.endswith(b"\n")
        end = events(disk / "full")[-1]
        assert (end["type"], end["status"]) == ("run_end", "failed")
        assert end["error"].startswith("disk full (ENOSPC)")


@pytest.mark.slow
def test_a_full_disk_met_while_a_save_is_in_flight_names_the_save(tmp_path):
    # The race the test above can lose under load: the loop's record finds the disk full
    # while the async save that filled it is still writing.
    cfg = TrainConfig.of(preset="tiny", batch_size=8, seq_len=32)
    trainer = trainer_of(cfg, model_config(cfg.model.shape, 512), Ops("cpu"))
    state = trainer.init_state(seed=0)
    meta = {"data_position": 0, "num_sequences": 8, "layout": trainer.describe().to_json()}
    with _tmpfs(tmp_path / "disk", "256k") as disk:
        run_dir = disk / "run"
        checkpointer = Checkpointer(run_dir, asynchronous=True)
        record = RunRecord(run_dir, "run")
        schedule = SaveSchedule(every_steps=1, every_s=0, processes=1)
        saver = Saver(checkpointer, schedule, record, trainer, None, lambda *_: None)  # type: ignore[arg-type]
        assert checkpointer.save(state, meta) == []  # in flight
        record_error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir / EVENTS_FILE))
        named = failure_to_name(record_error, saver)
        assert isinstance(named, DiskFull) and str(run_dir / CHECKPOINT_DIR / "0") in str(named)
        assert str(named).startswith("disk full (ENOSPC): cannot write ")
        assert not (run_dir / CHECKPOINT_DIR / "0").exists()  # its leftovers are gone
        (failed,) = events(run_dir)  # recorded, in the room its leftovers left
        assert (failed["type"], failed["step"], failed["error"]) == (
            "checkpoint_failed",
            0,
            str(named),
        )
        # a save's own full disk, an error of another kind, nothing in flight: named as they are
        for err in (DiskFull("disk full (ENOSPC): cannot write x"), RuntimeError("not the disk")):
            assert failure_to_name(err, saver) is err
        assert failure_to_name(record_error, saver) is record_error
        record.close()
        checkpointer.close()


def test_the_heartbeat_thread_outlives_a_full_disk(tmp_path):
    with _tmpfs(tmp_path / "disk", "64k") as disk:
        heartbeat = Heartbeat(disk)
        heartbeat.start()
        try:
            filler = _fill(disk)
            with pytest.raises(OSError):  # the loop's beats meet the full disk
                heartbeat.beat(1, force=True)
            time.sleep(2 * BEAT_INTERVAL_S)  # the thread's beats are skipped, quietly
            filler.unlink()
            before = json.loads(heartbeat.path.read_text())["beat"]
            deadline = time.monotonic() + 10 * BEAT_INTERVAL_S
            while json.loads(heartbeat.path.read_text())["beat"] == before:
                assert time.monotonic() < deadline, "the heartbeat thread stopped beating"
                time.sleep(0.1)
        finally:
            heartbeat.stop()


def test_disk_full_is_found_through_wrapping_errors():
    inner = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/r/config.json")
    try:
        try:
            raise inner
        except OSError as err:
            raise RuntimeError("save failed") from err
    except RuntimeError as outer:
        assert disk_full(outer) == "disk full (ENOSPC): cannot write /runs/r/config.json"
    assert disk_full(ValueError('Failed writing: "/a/b": No space left on device')) == (
        "disk full (ENOSPC): cannot write /a/b"
    )
    assert disk_full(OSError(errno.EIO, "Input/output error")) is None


def test_a_json_file_that_meets_a_full_disk_is_named_and_left_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text("{}")

    def full(self, *args, **kwargs):  # a write that found the disk full names no file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as caught:
        write_json_atomic(path, {"a": 1})
    assert disk_full(caught.value) == f"disk full (ENOSPC): cannot write {path}.tmp"
    assert path.read_bytes() == b"{}" and sorted(tmp_path.iterdir()) == [path]
