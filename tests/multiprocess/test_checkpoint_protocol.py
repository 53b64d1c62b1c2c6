"""The checkpoint protocol across processes (:mod:`titan.checkpoint.protocol`): a process
killed at any phase of a save leaves the newest committed step restorable on one and on two
processes; pruning never deletes what another process is saving; a failed save leaves no
temporary folder; a restore never casts to another dtype.

The two-process runs are ``tests/checkpoint_worker.py`` (a two-stage pipeline, one stage per
process, 2 CPU devices each) started here; a killed run's survivor is then killed too, as a
launcher or scheduler would.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest
from checkpoint_worker import holds, pipeline_trainer
from helpers import fail_checkpoint, trainer_of

from titan.checkpoint.checkpointer import Checkpointer
from titan.checkpoint.protocol import FAULT_ENV, PHASES, TMP_DIR_SUFFIX, fault_point
from titan.checkpoint.stage_store import LEAVES_FILE, STAGE_CHECKPOINT_DIR, StageStore
from titan.config import TrainConfig, model_config
from titan.errors import TitanError
from titan.launch.local import child_envs, free_port
from titan.layouts.contract import TrainState
from titan.ops import Ops

WORKER = Path(__file__).parents[1] / "checkpoint_worker.py"
TIMEOUT_S = 600  # a two-process run on a loaded CI machine
KILLED_STEP = 2
# Newest committed step after a kill at the start of a phase of step 2's save (steps 1, 2, 3;
# keep 1): step 2 commits only once both processes are past the items barrier and orbax's commit.
NEWEST = {"write": 1, "barrier": 1, "commit": 1, "seen": 2, "prune": 2}


def _workers(mode: str, run_dirs: list[Path], log: Path, env: dict[str, str]) -> list:
    """The two worker processes of ``mode`` over ``run_dirs``, their output into ``log.<i>``."""
    port, envs = free_port(), child_envs(2, 2, "cpu", {**os.environ, **env})
    procs = []
    for index in range(2):
        with open(f"{log}.{index}", "w") as out:
            command = [sys.executable, str(WORKER), mode, str(port), str(index), *run_dirs]
            procs.append(
                subprocess.Popen(
                    list(map(str, command)), env=envs[index], stdout=out, stderr=subprocess.STDOUT
                )
            )
    return procs


def _finish(procs: list, log: Path) -> None:
    for index, proc in enumerate(procs):
        assert proc.wait(timeout=TIMEOUT_S) == 0, Path(f"{log}.{index}").read_text()[-3000:]


def _killed_save(run_dir: Path, phase: str, victim: int) -> None:
    """Steps 1 to 3 saved by two processes, ``victim`` killed at ``phase`` of step 2, then the
    survivor killed too."""
    log = run_dir.parent / f"{run_dir.name}.log"
    procs = _workers("save", [run_dir], log, {FAULT_ENV: f"{phase}:{victim}:{KILLED_STEP}"})
    killed = procs[victim].wait(timeout=TIMEOUT_S)
    assert killed == -signal.SIGKILL, Path(f"{log}.{victim}").read_text()[-3000:]
    procs[1 - victim].kill()
    procs[1 - victim].wait(timeout=TIMEOUT_S)


def _restored_on_one(run_dir: Path, trainer) -> dict:
    checkpointer = Checkpointer(run_dir)
    try:
        state, _, skipped = checkpointer.restore_latest(trainer)
    finally:
        checkpointer.close()
    return {
        "step": state.step,
        "skipped": [s.step for s in skipped],
        "exact": holds(state, state.step),
    }


def _restored_on_two(run_dirs: list[Path], log: Path) -> dict[str, list[dict]]:
    """Each run dir restored by two processes (which then save the next step)."""
    procs = _workers("restore", run_dirs, log, {})
    _finish(procs, log)
    found: dict[str, list[dict]] = {}
    for index in range(2):
        for line in Path(f"{log}.{index}").read_text().splitlines():
            if line.startswith('{"run_dir"'):
                row = json.loads(line)
                found.setdefault(row.pop("run_dir"), []).append(row)
    return found


def _leftovers(run_dir: Path) -> list[str]:
    """Temporary folders, and stage items of steps that are not committed checkpoints."""
    checkpoints = run_dir / "checkpoints"
    committed = {p.name for p in checkpoints.iterdir() if (p / "meta").is_dir()}
    temporary = [p.name for p in checkpoints.iterdir() if TMP_DIR_SUFFIX in p.name]
    stages = run_dir / STAGE_CHECKPOINT_DIR
    orphans = [p.name for p in stages.iterdir() if p.name not in committed]
    return sorted(temporary + orphans)


@dataclass(frozen=True)
class KillRow:
    newest: int  # the newest committed step after the kill
    on_one: dict  # its restore on one process
    on_two: list[dict]  # its restore on two processes, each one's view
    leftovers: list[str]  # after the two processes' next save


@pytest.fixture(scope="module")
def kill_table(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], KillRow]:
    """Every phase x each process killed: the state it leaves and its restores."""
    root = tmp_path_factory.mktemp("killed")
    runs = {(phase, victim): root / f"{phase}-{victim}" for phase in PHASES for victim in (0, 1)}
    for (phase, victim), run_dir in runs.items():
        _killed_save(run_dir, phase, victim)
    trainer = pipeline_trainer()  # 4 of this process's CPU devices
    newest, on_one = {}, {}
    for case, run_dir in runs.items():
        checkpointer = Checkpointer(run_dir)
        newest[case] = checkpointer.latest_step()
        checkpointer.close()
        copy = root / f"{run_dir.name}-one"
        shutil.copytree(run_dir, copy)  # the two-process restore goes on saving in run_dir
        on_one[case] = _restored_on_one(copy, trainer)
    on_two = _restored_on_two(list(runs.values()), root / "restore.log")
    return {
        case: KillRow(newest[case], on_one[case], on_two[str(run_dir)], _leftovers(run_dir))
        for case, run_dir in runs.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("phase", PHASES)
def test_a_process_killed_at_any_phase_leaves_the_newest_step_restorable_on_one_and_two(
    kill_table, phase, victim
):
    row = kill_table[(phase, victim)]
    expected = {"step": NEWEST[phase], "skipped": [], "exact": True}
    assert row.newest == NEWEST[phase]
    assert row.on_one == expected
    assert row.on_two == [expected, expected]
    assert row.leftovers == []  # what the killed save left went at the next run's first save


@pytest.mark.slow
def test_a_slow_prune_on_process_0_never_commits_a_step_without_its_stage_items(tmp_path):
    """The failure this protocol fixes: process 0 pruning, at the start of a save, the stage
    items process 1 had already written for that step (it committed with chunk_0 only)."""
    run_dir = tmp_path / "slow"
    log = tmp_path / "slow.log"
    _finish(_workers("save", [run_dir], log, {FAULT_ENV: "prune:0:*:3"}), log)
    committed = Checkpointer(run_dir).committed_steps()
    assert committed == [3]
    for chunk in ("chunk_0", "chunk_1"):
        assert (run_dir / STAGE_CHECKPOINT_DIR / "3" / chunk / LEAVES_FILE).is_file()
    assert _restored_on_one(run_dir, pipeline_trainer()) == {
        "step": 3,
        "skipped": [],
        "exact": True,
    }


def _tiny_trainer(param_dtype: str = "float32"):
    cfg = TrainConfig.of(
        preset="tiny", compute_dtype="float32", param_dtype=param_dtype, batch_size=8, seq_len=32
    )
    return trainer_of(cfg, model_config(cfg.model.shape, 512), Ops(jax.default_backend()))


def _meta(trainer) -> dict:
    return {"data_position": 0, "num_sequences": 1, "layout": trainer.describe().to_json()}


@pytest.mark.slow
def test_leftovers_go_at_the_first_save_and_then_only_up_to_the_step_all_processes_saw(tmp_path):
    trainer = _tiny_trainer()
    state = trainer.init_state(seed=0)
    checkpointer = Checkpointer(tmp_path, keep=1)
    # What an earlier run's killed save of step 5 left.
    earlier = [checkpointer.directory / f"5{TMP_DIR_SUFFIX}", tmp_path / STAGE_CHECKPOINT_DIR / "5"]
    for folder in earlier:
        folder.mkdir(parents=True)
    (first,) = checkpointer.save(TrainState(1, state.chunks), _meta(trainer))
    assert first.error is None
    assert not any(folder.exists() for folder in earlier)
    # Another process's save of step 3 in progress, and a save of step 1 that never committed.
    peer_items = tmp_path / STAGE_CHECKPOINT_DIR / "3" / "chunk_1"
    peer_items.mkdir(parents=True)
    peer_orbax = checkpointer.directory / f"3{TMP_DIR_SUFFIX}"
    peer_orbax.mkdir()
    stale = checkpointer.directory / f"1{TMP_DIR_SUFFIX}-0"
    stale.mkdir()
    (second,) = checkpointer.save(TrainState(2, state.chunks), _meta(trainer))
    checkpointer.close()
    assert second.error is None
    assert checkpointer.committed_steps() == [2]  # step 1 pruned once 2 committed
    assert peer_items.is_dir() and peer_orbax.is_dir()
    assert not stale.exists()


@pytest.mark.slow
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_failed_save_leaves_no_temporary_folder(tmp_path, monkeypatch, asynchronous):
    fail_checkpoint(monkeypatch, 2, errno.ENOSPC)
    trainer = _tiny_trainer()
    state = trainer.init_state(seed=0)
    checkpointer = Checkpointer(tmp_path, asynchronous=asynchronous)
    results = [
        *checkpointer.save(TrainState(1, state.chunks), _meta(trainer)),
        *checkpointer.save(TrainState(2, state.chunks), _meta(trainer)),
        *checkpointer.wait(),
    ]
    checkpointer.close()
    assert [(r.step, r.disk_full) for r in results] == [(1, False), (2, True)]
    assert sorted(p.name for p in checkpointer.directory.iterdir()) == ["1"]


@pytest.mark.slow
def test_restore_refuses_an_array_saved_in_another_dtype(tmp_path):
    saved_by = _tiny_trainer("float32")
    state = saved_by.init_state(seed=0)
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(TrainState(1, state.chunks), _meta(saved_by))
    restored_by = _tiny_trainer("bfloat16")
    with pytest.raises(TitanError) as err:
        checkpointer.restore(1, restored_by)
    checkpointer.close()
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert "chunk_0 opt_state.0.mu.embed was saved as float32, the model asks for bfloat16" in (
        message
    )


def test_stage_items_refuse_another_dtype_too(tmp_path):
    store = StageStore(tmp_path)
    tree = {"w": jax.numpy.ones((4, 2), jax.numpy.float32)}
    store._write(store.item_dir(1, "chunk_1"), tree)  # as the process holding chunk_1 would
    wanted = {"w": jax.ShapeDtypeStruct((4, 2), jax.numpy.bfloat16, sharding=tree["w"].sharding)}
    with pytest.raises(TitanError, match=r"chunk_1 \['w'\] was saved as float32, .* bfloat16"):
        store.restore(1, "chunk_1", wanted)
    same = {"w": jax.ShapeDtypeStruct((4, 2), jax.numpy.float32, sharding=tree["w"].sharding)}
    assert np.array_equal(np.asarray(store.restore(1, "chunk_1", same)["w"]), np.ones((4, 2)))


def test_a_malformed_fault_point_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "flush:0:2")
    with pytest.raises(TitanError, match=f"^{FAULT_ENV}=flush:0:2: expected PHASE:PROCESS"):
        fault_point("write", 2)
    monkeypatch.setenv(FAULT_ENV, "write:1:2")  # another process: nothing happens here
    fault_point("write", 2)


def test_stage_items_that_fail_on_one_process_fail_that_save_on_both_and_the_next_commits(
    tmp_path,
):
    run_dir, log = tmp_path / "run", tmp_path / "fail-alone.log"
    _finish(_workers("fail-alone", [run_dir], log, {}), log)
    errors = [json.loads(Path(f"{log}.{i}").read_text().splitlines()[-1]) for i in range(2)]
    assert [e["1"] for e in errors] == [None, None] and [e["3"] for e in errors] == [None, None]
    assert errors[0]["2"] == "another process could not write its stage items"
    assert "File too large" in errors[1]["2"]
    assert Checkpointer(run_dir).committed_steps() == [3]
