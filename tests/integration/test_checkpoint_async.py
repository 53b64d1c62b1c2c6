"""Checkpoints: async saves hold exactly their step's state, failed saves never count, retention
keeps what it promises, time-based saves trigger, and a corrupt latest checkpoint falls back."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import (
    events,
    fail_checkpoint,
    file_tree,
    run_in_process,
    start_subprocess,
    trainer_of,
)

from titan.checkpoint.checkpointer import CHECKPOINT_DIR, Checkpointer, SaveSchedule, steps_to_prune
from titan.checkpoint.snapshot import bytes_per_device, snapshot_fits
from titan.cli import main
from titan.config import TrainConfig, model_config
from titan.errors import TitanError, error_line
from titan.exit_codes import EXIT_FAILED, EXIT_STOPPED, EXIT_USAGE
from titan.ops import Ops

VOCAB = 512


def _batch(seed: int, rows: int = 8, seq_len: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (rows, seq_len + 1), dtype=np.int32)
    return {"tokens": tokens, "segment_ids": np.ones((rows, seq_len), np.int32)}


def _leaves_bytes(tree) -> list[tuple[tuple, str, bytes]]:
    return [(a.shape, str(a.dtype), np.asarray(a).tobytes()) for a in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_async_save_holds_step_n_although_step_n_plus_1_donates_its_buffers(tmp_path):
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", batch_size=8, seq_len=32)
    # On whatever backend JAX has: CI runs it on CPU, and it is also run on a GPU (where a
    # donated buffer is reused at once) by bench/gpu_checks.sh.
    trainer = trainer_of(cfg, model_config(cfg.model.shape, VOCAB), Ops(jax.default_backend()))
    trainer.trace()
    trainer.compile()
    state, _ = trainer.step(trainer.init_state(seed=0), _batch(1))
    expected = _leaves_bytes(jax.device_get(state.items()))
    meta = {"data_position": 8, "num_sequences": 100, "layout": trainer.describe().to_json()}

    synchronous = Checkpointer(tmp_path / "sync")
    (result,) = synchronous.save(state, meta)
    assert (result.step, result.error) == (1, None)
    asynchronous = Checkpointer(tmp_path / "async", asynchronous=True)
    assert asynchronous.save(state, meta) == []  # in flight: settles later
    # Step 2 donates step 1's buffers while the save is being written. (On a GPU they are
    # reused at once; on CPU orbax's host copy is a zero-copy view, which XLA keeps alive by
    # not reusing the buffer. Either way the checkpoint must hold step 1.)
    following, _ = trainer.step(state, _batch(2))
    assert _leaves_bytes(jax.device_get(following.items())) != expected
    if jax.default_backend() != "cpu":  # the GPU run: step 2 really took step 1's buffers
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.items()))
    for leaf in jax.tree.leaves(state.items()):  # nothing of step 1 is needed on the device
        if not leaf.is_deleted():
            leaf.delete()
    (result,) = asynchronous.wait()
    assert (result.step, result.error) == (1, None)
    assert result.commit_s >= result.blocking_s > 0

    for checkpointer in (asynchronous, synchronous):
        restored, _ = checkpointer.restore(1, trainer)
        assert restored.step == 1
        assert _leaves_bytes(jax.device_get(restored.items())) == expected
        checkpointer.close()


@pytest.mark.slow
def test_failed_async_save_is_recorded_and_never_committed(small_options, monkeypatch):
    fail_checkpoint(monkeypatch, 4, errno.EIO)
    options = {**small_options, "run_id": "failed", "checkpoint_every": 2, "checkpoint_async": True}
    code, run_dir = run_in_process(options)
    assert code == 0
    (failed,) = events(run_dir, "checkpoint_failed")
    assert failed["step"] == 4 and os.strerror(errno.EIO) in failed["error"]
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [2, 6]
    assert all(e["asynchronous"] for e in events(run_dir, "checkpoint"))
    # the run's last save is waited for: committed before run_end
    kinds = [e["type"] for e in events(run_dir)]
    assert kinds.index("run_end") > max(i for i, k in enumerate(kinds) if k == "checkpoint")
    checkpointer = Checkpointer(run_dir)
    assert checkpointer.committed_steps() == [2, 6]
    checkpointer.close()


@pytest.mark.slow
def test_a_run_whose_last_save_fails_ends_failed_naming_the_last_committed_checkpoint(
    small_options, monkeypatch, capsys, caplog
):
    fail_checkpoint(monkeypatch, 6, errno.EIO)  # the run's last step: no end to resume from
    # the first of them to run: a read-only mount
    fail_checkpoint(monkeypatch, 6, errno.EROFS, at="create")
    options = {**small_options, "run_id": "last", "checkpoint_every": 2, "checkpoint_async": True}
    code, run_dir = run_in_process(options)
    assert code == EXIT_FAILED
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("titan train: error: the checkpoint of step 6, the run's last, failed (")
    assert err.endswith("); the last committed checkpoint is step 4")
    end = events(run_dir)[-1]
    assert (end["type"], end["status"], end["step"]) == ("run_end", "failed", 6)
    checkpointer = Checkpointer(run_dir)
    assert checkpointer.committed_steps() == [2, 4]
    checkpointer.close()


@pytest.mark.slow
def test_an_async_save_that_finds_the_disk_full_ends_the_run_keeping_the_last_checkpoint(
    small_options, monkeypatch, capsys
):
    fail_checkpoint(monkeypatch, 4, errno.ENOSPC)
    options = {**small_options, "run_id": "full", "checkpoint_every": 2, "checkpoint_async": True}
    code, run_dir = run_in_process(options)
    assert code == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"titan train: error: disk full (ENOSPC): cannot write {run_dir}/checkpoints/4"]
    (failed,) = events(run_dir, "checkpoint_failed")
    end = events(run_dir)[-1]
    assert failed["step"] == 4 and (end["type"], end["status"]) == ("run_end", "failed")
    assert end["step"] == max(e["step"] for e in events(run_dir, "step"))  # the last step done
    checkpointer = Checkpointer(run_dir)
    committed = checkpointer.committed_steps()
    checkpointer.close()
    # 6 may have been started before 4's failure came back from its thread; 4 never counts
    assert committed in ([2], [2, 6])
    assert not list((run_dir / CHECKPOINT_DIR).glob("4.orbax-checkpoint-tmp*"))  # nor lingers


@pytest.mark.parametrize(
    ("committed", "keep", "keep_every", "pruned"),
    [
        ([1, 2, 3, 4, 5], 3, 0, [1, 2]),
        ([1, 2, 3, 4, 5, 6, 7], 2, 3, [1, 2, 4, 5]),
        ([10, 20], 3, 0, []),
        ([5, 10, 15], 1, 10, [5]),
    ],
)
def test_retention_keeps_the_newest_and_every_kth(committed, keep, keep_every, pruned):
    assert steps_to_prune(committed, keep, keep_every) == pruned


def test_time_based_saves_trigger_after_the_interval():
    now = [100.0]
    schedule = SaveSchedule(every_steps=1000, every_s=30.0, processes=1, clock=lambda: now[0])
    assert not schedule.due(1)
    now[0] = 129.9
    assert not schedule.due(2)
    now[0] = 130.0
    assert schedule.due(3)
    schedule.restart()
    assert not schedule.due(4)
    assert schedule.due(1000)  # the step interval still applies
    assert not SaveSchedule(1000, 0.0, 1, clock=lambda: 1e9).due(5)  # 0: steps only


def test_time_based_saves_refuse_several_processes():
    with pytest.raises(TitanError, match="--checkpoint-every-s runs with one process, not 2"):
        SaveSchedule(every_steps=100, every_s=60.0, processes=2)


def test_time_based_saves_on_several_processes_are_refused_before_the_join(
    monkeypatch, tmp_path, capsys
):
    def join(launch):  # the run's processes would wait here for each other
        raise AssertionError("joined")

    monkeypatch.setattr("titan.trainer.train.initialize", join)
    launch = ["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "0"]
    options = ["--checkpoint-every-s", "60", "--runs-root", str(tmp_path)]
    assert main(["train", *options, *launch]) == EXIT_USAGE
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "--checkpoint-every-s runs with one process, not 2 (their clocks would pick different "
            "steps); use --checkpoint-every"
        )
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_time_based_saves_and_retention_in_a_run(small_options):
    options = {
        **small_options,
        "run_id": "timed",
        "steps": 7,
        "checkpoint_every": 1000,
        "checkpoint_every_s": 1e-9,  # due after every step
        "checkpoint_keep": 2,
        "checkpoint_keep_every": 3,
    }
    code, run_dir = run_in_process(options)
    assert code == 0
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [1, 2, 3, 4, 5, 6, 7]
    folders = {p.name for p in (run_dir / CHECKPOINT_DIR).iterdir()}
    assert folders == {"3", "6", "7"}


def _corrupt(checkpoint: Path) -> None:
    """Overwrite every array file of the checkpoint's chunk with zeros (same sizes)."""
    files = [p for p in (checkpoint / "chunk_0").rglob("*") if p.is_file()]
    assert files
    for path in files:
        path.write_bytes(b"\0" * path.stat().st_size)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(small_options, capfd):
    options = {**small_options, "run_id": "corrupt", "steps": 4, "checkpoint_every": 2}
    code, run_dir = run_in_process(options)
    assert code == 0
    first = {e["step"]: e["batch_digest"] for e in events(run_dir, "step")}
    _corrupt(run_dir / CHECKPOINT_DIR / "4")
    capfd.readouterr()

    code, _ = run_in_process({**options, "steps": 6}, resume=run_dir)
    assert code == 0
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if "cannot be restored" in line] == [
        next(line for line in err.splitlines() if line.startswith("titan: checkpoint 4 cannot"))
    ]
    start = events(run_dir, "run_start")[-1]
    assert start["resumed_from_step"] == 2
    kinds = [e["type"] for e in events(run_dir)]
    assert kinds[kinds.index("run_start", 1) + 1] == "checkpoint_unrestorable"
    (skipped,) = events(run_dir, "checkpoint_unrestorable")
    assert skipped["step"] == 4 and skipped["error"]
    redone = [e for e in events(run_dir, "step") if e["time"] > start["time"]]
    assert [e["step"] for e in redone] == [3, 4, 5, 6]
    assert [e["batch_digest"] for e in redone[:2]] == [first[3], first[4]]
    assert (run_dir / "unrestorable_checkpoints" / "4" / "chunk_0").is_dir()
    checkpointer = Checkpointer(run_dir)
    assert checkpointer.committed_steps()[-1] == 6
    checkpointer.close()


@pytest.mark.slow
def test_step_folders_without_meta_are_set_aside_and_a_vanished_newest_is_said(
    small_options, capfd, caplog
):
    options = {**small_options, "run_id": "cut", "steps": 6, "checkpoint_every": 2}
    code, run_dir = run_in_process({**options, "checkpoint_keep": 3})
    assert code == 0
    folders = run_dir / CHECKPOINT_DIR
    for step in (2, 6):  # a copy of the run dir cut short: meta is orbax's last item
        shutil.rmtree(folders / str(step) / "meta")
    (folders / "2" / "_CHECKPOINT_METADATA").unlink()  # orbax's own file too
    capfd.readouterr()
    code, _ = run_in_process({**options, "steps": 8, "checkpoint_keep": 2}, resume=run_dir)
    assert code == 0  # step 6 saved again, not "step already exists"
    err = capfd.readouterr().err
    echoes = [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
    assert not echoes  # orbax's echo of what Titan says
    for step in (2, 6):
        assert f"titan: checkpoint {step} cannot be restored (" in err and "holds no meta" in err
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 4
    assert sorted(e["step"] for e in events(run_dir, "checkpoint_unrestorable")) == [2, 6]
    assert {p.name for p in (run_dir / "unrestorable_checkpoints").iterdir()} == {"2", "6"}
    assert sorted(p.name for p in folders.iterdir()) == ["6", "8"]  # retention counts again
    shutil.rmtree(folders / "8")
    code, _ = run_in_process({**options, "steps": 9}, resume=run_dir)
    assert code == 0
    err = capfd.readouterr().err
    assert "the run's record names checkpoint 8, newer than any in" in err
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 6


@pytest.mark.slow
def test_a_truncated_array_file_is_one_line_naming_the_array_and_the_file(small_options):
    """orbax wraps tensorstore's read error (which names the array and the file) in one that
    dumps the store's spec over many lines, and raises it again from each read still going
    when their coroutines are collected: the resume says the root error, once, in one line."""
    options = {**small_options, "run_id": "truncated", "steps": 2, "checkpoint_every": 2}
    code, run_dir = run_in_process(options)
    assert code == 0
    data = [p for p in (run_dir / CHECKPOINT_DIR / "2" / "chunk_0").rglob("d/*") if p.is_file()]
    for path in data:
        path.write_bytes(path.read_bytes()[:100])
    resume = {k: v for k, v in options.items() if k not in ("run_id", "runs_root")}
    proc = start_subprocess({**resume, "steps": 4}, "--resume", str(run_dir))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_USAGE, err
    (line,) = [line for line in err.splitlines() if line.startswith("titan train: error:")]
    assert f"checkpoint 2 ({run_dir / CHECKPOINT_DIR / '2'}) cannot be read: ValueError:" in line
    assert "OCDBT database" in line and "TensorStore details" not in line
    assert "Traceback" not in err and "Exception ignored" not in err, err


class _Device:
    def __init__(self, limit: int, peak: int):
        self.stats = {"bytes_limit": limit, "peak_bytes_in_use": peak}

    def memory_stats(self):
        return self.stats


class _Shard:
    def __init__(self, device: _Device, nbytes: int):
        self.device, self.data = device, np.zeros(nbytes, np.uint8)


class _Leaf:
    def __init__(self, *shards: _Shard):
        self.addressable_shards = list(shards)


def test_a_device_snapshot_is_taken_only_where_it_fits_beside_the_peak():
    roomy, full = _Device(limit=1000, peak=500), _Device(limit=1000, peak=800)
    assert bytes_per_device([_Leaf(_Shard(roomy, 100)), _Leaf(_Shard(roomy, 50))]) == {roomy: 150}
    assert snapshot_fits([_Leaf(_Shard(roomy, 400))])  # 500 + 400 <= 950
    assert not snapshot_fits([_Leaf(_Shard(roomy, 460))])  # 960 > 950: the 5% margin
    assert not snapshot_fits([_Leaf(_Shard(roomy, 100), _Shard(full, 200))])  # one too full
    assert snapshot_fits({"x": jax.numpy.ones(4)})  # XLA:CPU reports no statistics


@pytest.mark.slow
def test_one_process_async_saves_prune_off_the_loop_thread(tmp_path, monkeypatch):
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", batch_size=8, seq_len=32)
    trainer = trainer_of(cfg, model_config(cfg.model.shape, VOCAB), Ops(jax.default_backend()))
    trainer.trace()
    trainer.compile()
    state = trainer.init_state(seed=0)
    meta = {"data_position": 8, "num_sequences": 100, "layout": trainer.describe().to_json()}
    checkpointer = Checkpointer(tmp_path, keep=1, asynchronous=True)
    deleted_on = _slow_deletes(checkpointer, monkeypatch)
    for batch in (1, 2, 3):
        state, _ = trainer.step(state, _batch(batch))
        checkpointer.save(state, meta)
    (result,) = checkpointer.wait()
    assert (result.step, result.error) == (3, None)
    assert deleted_on == [(1, "titan-save-2"), (2, "titan-save-3")]
    assert checkpointer.committed_steps() == [3]
    # the loop waited for the pruning of 2 too; the commit of 3 came before it
    assert result.blocking_s > result.commit_s + 0.5 * PRUNE_S
    checkpointer.close()

    synchronous = Checkpointer(tmp_path / "sync", keep=1)
    deleted_on = _slow_deletes(synchronous, monkeypatch)
    results = [
        synchronous.save(state, meta),
        synchronous.save(trainer.step(state, _batch(4))[0], meta),
    ]
    (first,), (second,) = results
    assert deleted_on == [(3, threading.current_thread().name)]  # the loop's thread prunes
    assert second.blocking_s >= second.commit_s + PRUNE_S > first.blocking_s - first.commit_s
    synchronous.close()


@pytest.mark.slow
@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_a_failed_pruning_leaves_the_new_checkpoint_committed(tmp_path, asynchronous, capfd):
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", batch_size=8, seq_len=32)
    trainer = trainer_of(cfg, model_config(cfg.model.shape, VOCAB), Ops(jax.default_backend()))
    state = trainer.init_state(seed=0)
    meta = {"data_position": 8, "num_sequences": 100, "layout": trainer.describe().to_json()}
    checkpointer = Checkpointer(tmp_path, keep=1, asynchronous=asynchronous)

    delete = checkpointer.folder.manager.delete

    def failing_delete(step: int) -> None:  # checkpoint 1 cannot be deleted, others can
        if step == 1:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(checkpointer.path(step)))
        delete(step)

    saved = [*checkpointer.save(dataclasses.replace(state, step=1), meta), *checkpointer.wait()]
    assert [(r.step, r.error) for r in saved] == [(1, None)]
    checkpointer.folder.manager.delete = failing_delete  # type: ignore[method-assign]
    for step in (2, 3, 4):
        saved = [
            *checkpointer.save(dataclasses.replace(state, step=step), meta),
            *checkpointer.wait(),
        ]
        assert [(r.step, r.error) for r in saved] == [(step, None)]
    assert checkpointer.committed_steps() == [1, 4]  # 1 is kept; it stops no other deletion
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [  # once, naming the checkpoint
        "titan: deleting checkpoint 1 failed, kept: PermissionError: [Errno 13] Permission "
        f"denied: '{checkpointer.path(1)}'"
    ]
    checkpointer.close()


PRUNE_S = 0.5  # how long each deletion is made to take


def _slow_deletes(checkpointer: Checkpointer, monkeypatch) -> list[tuple[int, str]]:
    """Make ``checkpointer``'s deletions take :data:`PRUNE_S` longer; returns the list of the
    steps deleted and the threads that deleted them, as they happen."""
    deleted_on: list[tuple[int, str]] = []
    delete = checkpointer.folder.manager.delete

    def slow_delete(step: int) -> None:
        deleted_on.append((step, threading.current_thread().name))
        time.sleep(PRUNE_S)
        delete(step)

    monkeypatch.setattr(checkpointer.folder.manager, "delete", slow_delete)
    return deleted_on


def test_an_error_line_leaves_out_the_spec_tensorstore_appends():
    """orbax's read errors carry tensorstore's JSON spec (kilobytes) after the message."""
    spec = ' [tensorstore_spec=\'{"driver":"zarr","kvstore":{"path":"/r/checkpoints/20"}}\']'
    err = ValueError(f'NOT_FOUND: Error opening "zarr" driver{spec}\nsource location: x.cc')
    assert error_line(err) == 'ValueError: NOT_FOUND: Error opening "zarr" driver'
    assert error_line(OSError()) == "OSError"


@pytest.mark.slow
def test_checkpoints_kept_for_ever_stay_when_a_resume_changes_the_interval(small_options):
    options = {
        **small_options,
        "run_id": "milestones",
        "steps": 8,
        "checkpoint_every": 2,
        "checkpoint_keep": 1,
        "checkpoint_keep_every": 4,
    }
    code, run_dir = run_in_process(options)
    assert code == 0
    checkpointer = Checkpointer(run_dir)
    assert checkpointer.committed_steps() == [4, 8]
    checkpointer.close()
    resumed = {**options, "steps": 12, "checkpoint_keep_every": 5}
    code, _ = run_in_process(resumed, resume=run_dir)
    assert code == 0
    checkpointer = Checkpointer(run_dir)
    assert checkpointer.committed_steps() == [4, 8, 10, 12]  # 4 and 8 kept under the old K
    checkpointer.close()


@pytest.mark.slow
@pytest.mark.parametrize("onto", [{}, {"layout": "mpmd", "pp": 2}], ids=["same", "recut"])
def test_a_checkpoint_whose_arrays_no_longer_match_their_digest_is_set_aside(
    small_options, capsys, onto
):
    options = {**small_options, "run_id": "rot", "steps": 4, "checkpoint_every": 2}
    code, run_dir = run_in_process(options)
    assert code == 0
    meta_file = run_dir / CHECKPOINT_DIR / "4" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert [isinstance(d, int) for d in meta["digests"]] == [True]
    # the arrays as a flipped bit on disk leaves them: unlike the digest taken at the save
    meta["digests"][0] ^= 1 << 20
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    code, _ = run_in_process({**options, "steps": 6, **onto}, resume=run_dir)
    assert code == 0
    err = capsys.readouterr().err
    assert "titan: checkpoint 4 cannot be restored (" in err
    assert "checkpoint 4: chunk 0 does not match the digest saved with it" in err
    assert "cannot be restored onto" not in err  # damage, not a layout that does not map
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 2
    assert (run_dir / "unrestorable_checkpoints" / "4").is_dir()


@pytest.mark.slow
def test_a_resume_where_no_checkpoint_restores_says_each_was_tried(small_options):
    options = {**small_options, "run_id": "all-rot", "steps": 4, "checkpoint_every": 2}
    code, run_dir = run_in_process(options)
    assert code == 0
    for step in (2, 4):
        meta_file = run_dir / CHECKPOINT_DIR / str(step) / "meta" / "metadata"
        meta = json.loads(meta_file.read_text())
        meta["digests"][0] ^= 1 << 20
        meta_file.write_text(json.dumps(meta))
    before = file_tree(run_dir)
    with pytest.raises(TitanError) as raised:
        run_in_process({**options, "steps": 6}, resume=run_dir)
    assert str(raised.value).startswith(
        "--resume: none of the 2 committed checkpoints can be restored (the newest: "
        "checkpoint 4: chunk 0 does not match the digest saved with it "
    ), str(raised.value)
    assert file_tree(run_dir) == before


PARAMS_READERS = {  # (run dir, data, out) -> argv
    "generate": lambda run, data, out: ["generate", run, "--prompt", "def"],
    "export hf": lambda run, data, out: ["export", "hf", run, "--out", out],
    "init-from": lambda run, data, out: [
        *["train", "--init-from", run, "--data", data, "--runs-root", out, "--steps", "1"]
    ],
    "init-from recut": lambda run, data, out: [
        *["train", "--init-from", run, "--data", data, "--runs-root", out, "--steps", "1"],
        *["--layout", "mpmd", "--pp", "2"],
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("reader", list(PARAMS_READERS))
def test_a_reader_of_the_parameters_alone_checks_them_against_their_digest(
    finished_run, corpus_dir, tmp_path, capsys, reader
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    meta_file = run_dir / CHECKPOINT_DIR / "2" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert len(meta["params_digests"]) == len(meta["digests"]) == 1
    meta["params_digests"][0] ^= 1 << 7  # as the parameters' files changed since the save
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(PARAMS_READERS[reader](str(run_dir), str(corpus_dir), str(out))) == 2
    err = capsys.readouterr().err
    assert "checkpoint 2: the parameters of chunk 0 do not match the digest saved with them" in err
    assert "cannot be restored onto" not in err  # damage, not a layout that does not map
    assert not out.exists() or not any(out.iterdir())  # no export, no run made


@pytest.mark.slow
def test_a_stop_before_the_first_step_ends_stopped_with_nothing_to_save(small_options, monkeypatch):
    from titan.trainer import train

    run = train._Run.run

    def signalled_run(self, *args):
        os.kill(os.getpid(), signal.SIGTERM)  # after run_start, before step 1 (its compile)
        return run(self, *args)

    monkeypatch.setattr(train._Run, "run", signalled_run)
    code, run_dir = run_in_process({**small_options, "run_id": "early-stop"})
    assert code == EXIT_STOPPED
    assert events(run_dir, "step") == [] and events(run_dir, "checkpoint") == []
    end = events(run_dir)[-1]
    assert (end["type"], end["status"], end["step"]) == ("run_end", "stopped", 0)


def test_a_checkpoint_set_aside_takes_its_stage_items_with_it(tmp_path):
    checkpoints, stages = tmp_path / CHECKPOINT_DIR, tmp_path / "stage_checkpoints"
    (checkpoints / "15" / "meta").mkdir(parents=True)
    (stages / "15" / "chunk_1").mkdir(parents=True)
    (stages / "15" / "chunk_0" / "leaves.json").parent.mkdir()
    (stages / "15" / "chunk_0" / "leaves.json").write_text("[]")
    (stages / "12" / "chunk_0").mkdir(parents=True)  # another step's: stays
    checkpointer = Checkpointer(tmp_path)
    checkpointer.set_aside([15])
    aside = tmp_path / "unrestorable_checkpoints" / "15"
    assert (aside / "meta").is_dir()
    assert (aside / "stage_checkpoints" / "chunk_0" / "leaves.json").read_text() == "[]"
    assert sorted(p.name for p in stages.iterdir()) == ["12"]
    checkpointer.close()
