"""Reading a run's weights for use, not to resume it: ``titan generate`` and ``titan train
--init-from`` read only the parameters of a checkpoint (not the optimizer state), and from a run
dir the newest checkpoint that can be read, saying in one line each newer one that cannot."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from helpers import cli_args, run_in_process, small_run, trainer_of

from titan.checkpoint.checkpointer import CHECKPOINT_DIR, initial_state
from titan.checkpoint.init_from import saved_model
from titan.checkpoint.restoring import Restorer
from titan.cli import main
from titan.errors import TitanError
from titan.generation.loading import load_model
from titan.ops import Ops

PROMPT = "def main("


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """A real 4-step run on one device with checkpoints at steps 2 and 4 (copy it before
    changing it)."""
    root = tmp_path_factory.mktemp("two-checkpoints")
    options = small_run(corpus_dir, root, steps=4, checkpoint_every=2, dp=1, run_id="two")
    code, run_dir = run_in_process(options)
    assert code == 0
    return run_dir


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "copy"))


def chunk_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINT_DIR / str(step) / "chunk_0"


def truncate_arrays(run_dir: Path, step: int) -> None:
    """Cut every array data file of checkpoint ``step`` to its first 100 bytes (a copy that
    stopped short); its metadata stays whole, so only reading the arrays fails."""
    files = list(chunk_dir(run_dir, step).glob("ocdbt.process_*/d/*"))
    assert files
    for path in files:
        path.write_bytes(path.read_bytes()[:100])


def delete_optimizer_state(run_dir: Path, step: int) -> None:
    """Delete every array of the optimizer state (its zarr metadata and chunks) from checkpoint
    ``step``, through tensorstore's OCDBT store: only the parameters remain readable."""
    spec = {"driver": "ocdbt", "base": f"file://{chunk_dir(run_dir, step)}/"}
    store = ts.KvStore.open(spec).result()
    store.delete_range(ts.KvStore.KeyRange(b"opt_state", b"opt_state\xff")).result()
    assert all(key.startswith(b"params.") for key in store.list().result())


def saved_params(run_dir: Path, step: int) -> dict:
    return ocp.StandardCheckpointer().restore(chunk_dir(run_dir, step))["params"]


def assert_same_arrays(tree, expected) -> None:
    assert jax.tree.structure(tree) == jax.tree.structure(expected)
    for leaf, want in zip(jax.tree.leaves(tree), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want))


def the_runs_trainer(run_dir: Path):
    """The one-device trainer of the run's own options (what --init-from of it builds here)."""
    cfg, model = saved_model(run_dir, "RUN_DIR")
    return trainer_of(cfg, model, Ops(jax.default_backend()))


@pytest.mark.slow
def test_generate_falls_back_past_an_unreadable_newest_checkpoint(
    two_checkpoints, tmp_path, capsys
):
    run = copy_run(two_checkpoints, tmp_path)
    truncate_arrays(run, 4)
    args = ["--prompt", PROMPT, "--max-new-tokens", "4"]
    assert main(["generate", str(run), *args]) == 0
    out, err = capsys.readouterr()
    skipped, header = err.splitlines()
    assert skipped.startswith(
        f"titan generate: checkpoint 4 ({run / CHECKPOINT_DIR / '4'}) cannot be read: ValueError: "
    )
    assert skipped.endswith("; using checkpoint 2")
    assert header == f"titan generate: {run} step 2"
    assert (run / CHECKPOINT_DIR / "4").is_dir()  # another run's checkpoints: nothing moves
    assert main(["generate", str(two_checkpoints / CHECKPOINT_DIR / "2"), *args]) == 0
    assert capsys.readouterr().out == out  # the same text as from checkpoint 2 itself


@pytest.mark.slow
def test_generate_names_the_unreadable_checkpoint_or_folder_in_one_line(
    two_checkpoints, tmp_path, capsys
):
    run = copy_run(two_checkpoints, tmp_path)
    truncate_arrays(run, 4)
    assert main(["generate", str(run), "--prompt", PROMPT, "--step", "4"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    checkpoint = run / CHECKPOINT_DIR / "4"
    assert line.startswith(f"titan generate: error: checkpoint 4 ({checkpoint}) cannot be read: ")
    assert "OCDBT database" in line and "TensorStore details" not in line
    truncate_arrays(run, 2)
    assert main(["generate", str(run), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    assert line.startswith(
        f"titan generate: error: {run / CHECKPOINT_DIR}: none of the 2 committed checkpoints can "
        f"be read (the newest: checkpoint 4 ({checkpoint}) cannot be read: ValueError: "
    )


@pytest.mark.slow
def test_generate_and_init_from_read_the_parameters_not_the_optimizer_state(
    two_checkpoints, tmp_path
):
    run = copy_run(two_checkpoints, tmp_path)
    delete_optimizer_state(run, 4)
    expected = saved_params(two_checkpoints, 4)
    loaded = load_model(str(run))
    assert (loaded.step, loaded.unreadable) == (4, ())
    assert_same_arrays(loaded.params, expected)  # float32 run: no cast
    trainer = the_runs_trainer(run)
    state = initial_state(trainer, seed=0, init_from=str(run))
    (chunk,) = state.chunks
    assert state.step == 0
    assert_same_arrays(chunk["params"], expected)
    # AdamW's initial state, in the trainer's shardings: what a fresh run starts with
    fresh = trainer.init_state(seed=0).chunks[0]["opt_state"]
    assert_same_arrays(chunk["opt_state"], fresh)
    shardings = [leaf.sharding for leaf in jax.tree.leaves(chunk["opt_state"])]
    assert shardings == [leaf.sharding for leaf in jax.tree.leaves(fresh)]


@pytest.mark.slow
def test_init_from_a_run_dir_starts_from_its_newest_readable_checkpoint(
    two_checkpoints, tmp_path, capsys
):
    run = copy_run(two_checkpoints, tmp_path)
    truncate_arrays(run, 4)
    trainer = the_runs_trainer(run)
    state = initial_state(trainer, seed=0, init_from=str(run))
    assert_same_arrays(state.chunks[0]["params"], saved_params(two_checkpoints, 2))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"titan: --init-from {run}: checkpoint 4 ({run / CHECKPOINT_DIR / '4'}) cannot be read: "
    )
    assert line.endswith("; starting from checkpoint 2")
    truncate_arrays(run, 2)
    with pytest.raises(TitanError) as err:
        initial_state(trainer, seed=0, init_from=str(run))
    assert str(err.value).startswith(
        f"--init-from {run}: {run / CHECKPOINT_DIR}: none of the 2 committed checkpoints can be "
        "read (the newest: checkpoint 4"
    )


@pytest.mark.slow
def test_train_init_from_with_no_readable_checkpoint_is_one_line_and_exit_2(
    two_checkpoints, corpus_dir, tmp_path, capsys
):
    run = copy_run(two_checkpoints, tmp_path)
    for step in (2, 4):
        truncate_arrays(run, step)
    options = small_run(corpus_dir, tmp_path / "runs", steps=1, dp=1, run_id="from")
    assert main(["train", *cli_args(options), "--init-from", str(run)]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("titan train: error: ")]
    assert f"--init-from {run}: {run / CHECKPOINT_DIR}: none of the 2 committed" in line
    assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.slow
def test_a_checkpoint_deleted_while_it_is_read_gives_the_one_committed_since(
    two_checkpoints, tmp_path, monkeypatch
):
    """``titan generate`` of a live run: its retention deletes the checkpoint being read and
    commits a newer one; the folder is listed again and the newer one read (not refused as
    having no checkpoint)."""
    run_dir = copy_run(two_checkpoints, tmp_path)
    checkpoints = run_dir / CHECKPOINT_DIR
    real = Restorer.restore_params
    raced: list[int] = []

    def racing(self, step, trainer):
        if not raced:  # the run deletes what was listed, then commits step 9
            raced.append(step)
            newest = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
            (checkpoints / str(newest)).rename(checkpoints / "9")
            for old in checkpoints.iterdir():
                if old.name != "9":
                    shutil.rmtree(old)
            raise FileNotFoundError(f"{checkpoints / str(step)}: gone")
        return real(self, step, trainer)

    monkeypatch.setattr(Restorer, "restore_params", racing)
    loaded = load_model(str(run_dir))
    assert (loaded.step, loaded.unreadable) == (9, ())


@pytest.mark.slow
def test_a_checkpoint_deleted_while_orbax_lists_the_folder_is_listed_again(
    two_checkpoints, tmp_path, monkeypatch
):
    run_dir = copy_run(two_checkpoints, tmp_path)
    real = ocp.CheckpointManager.reload
    calls: list[int] = []

    def racing(self):  # the first listings find a step that is gone before its stat
        calls.append(1)
        if len(calls) <= 2:
            raise FileNotFoundError(f"{run_dir / CHECKPOINT_DIR / '2'}: gone")
        return real(self)

    monkeypatch.setattr(ocp.CheckpointManager, "reload", racing)
    loaded = load_model(str(run_dir))
    assert (loaded.step, len(calls)) == (4, 3)
