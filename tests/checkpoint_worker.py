"""One process of a two-process pipeline that saves or restores checkpoints, for
``tests/multiprocess/test_checkpoint_protocol.py``; two of them run together,
``JAX_NUM_CPU_DEVICES=2`` each:

    python checkpoint_worker.py save PORT INDEX RUN_DIR
    python checkpoint_worker.py fail-alone PORT INDEX RUN_DIR
    python checkpoint_worker.py restore PORT INDEX RUN_DIR [RUN_DIR ...]

The model is Titan's tiny Llama as an MPMD pipeline of 2 stages, one per process (each stage on
its process's 2 CPU devices), so every chunk is a stage item written by the process that holds
it. The state saved as step ``s`` holds ``s`` in every element of every array, so a restore
shows which step it read; it is placed straight from host memory (nothing to compile).

- ``save``: saves steps 1, 2 and 3 asynchronously, keeping 1 (each commit prunes the step before
  it), then waits for the last one.
- ``fail-alone``: saves as ``save`` does, process 1 failing to write its stage items of step 2,
  and prints each step's error.
- ``restore``: for each run dir, restores the newest committed checkpoint and prints one JSON
  line (``run_dir``, ``step``, ``skipped``: the newer ones that did not restore, ``exact``:
  whether this process's chunks hold that step's values), then saves the next step (the run
  goes on) and waits for it.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
from helpers import trainer_of

from titan.checkpoint.checkpointer import Checkpointer
from titan.checkpoint.stage_store import StageStore
from titan.config import TrainConfig, model_config
from titan.layouts.contract import TrainState
from titan.ops import Ops
from titan.parallel.chunks import chunk_item
from titan.parallel.distributed import LaunchSettings, initialize
from titan.parallel.mesh import remote_array

VOCAB = 512
PIPELINE = {"layout": "mpmd", "pp": 2, "dp": 2, "microbatches": 2}


def pipeline_trainer():
    """The two-stage tiny Llama on this process's devices (or on 4 devices of one process)."""
    cfg = TrainConfig.of(
        preset="tiny", compute_dtype="float32", batch_size=8, seq_len=32, **PIPELINE
    )
    return trainer_of(cfg, model_config(cfg.model.shape, VOCAB), Ops(jax.default_backend()))


def state_at(trainer, step: int) -> TrainState:
    """Step ``step``'s state: ``step`` in every element (handles for other processes' chunks)."""
    items = trainer.abstract_items()
    chunks = []
    for index in range(len(items)):  # model order
        abstract = items[chunk_item(index)]
        place = _filled(step) if _local(abstract) else remote_array
        chunks.append(jax.tree.map(place, abstract))
    return TrainState(step, tuple(chunks))


def holds(state: TrainState, step: int) -> bool:
    """Whether every array of ``state`` that this process holds is ``step`` throughout."""
    local = [leaf for leaf in jax.tree.leaves(state.chunks) if leaf.is_fully_addressable]
    return bool(local) and all(np.all(np.asarray(leaf) == step) for leaf in local)


def _filled(step: int):
    return lambda a: jax.device_put(np.full(a.shape, step, a.dtype), a.sharding)


def _local(abstract) -> bool:
    return all(
        d.process_index == jax.process_index()
        for leaf in jax.tree.leaves(abstract)
        for d in leaf.sharding.device_set
    )


def _save(checkpointer: Checkpointer, trainer, step: int) -> None:
    meta = {"data_position": 0, "num_sequences": 1, "layout": trainer.describe().to_json()}
    for result in checkpointer.save(state_at(trainer, step), meta):
        assert result.error is None, result


def save(trainer, run_dir: Path) -> None:
    checkpointer = Checkpointer(run_dir, keep=1, asynchronous=True)
    for step in (1, 2, 3):
        _save(checkpointer, trainer, step)
    assert all(result.error is None for result in checkpointer.wait())
    checkpointer.close()


def restore(trainer, run_dir: Path) -> None:
    checkpointer = Checkpointer(run_dir, keep=1, asynchronous=True)
    state, _, skipped = checkpointer.restore_latest(trainer)
    found = {
        "run_dir": str(run_dir),
        "step": state.step,
        "skipped": [s.step for s in skipped],
        "exact": holds(state, state.step),
    }
    print(json.dumps(found), flush=True)
    _save(checkpointer, trainer, state.step + 1)
    assert all(result.error is None for result in checkpointer.wait())
    checkpointer.close()


def fail_alone(trainer, run_dir: Path) -> None:
    """Steps 1 to 3 saved as ``save`` does, process 1's stage items of step 2 failing to be
    written (a file too large for its host's limit); prints each step's error (None: committed)
    as one JSON line."""
    if jax.process_index() == 1:
        write = StageStore.save

        def failing(self, step, items):
            if step == 2:
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(run_dir))
            return write(self, step, items)

        StageStore.save = failing
    checkpointer = Checkpointer(run_dir, keep=1, asynchronous=True)
    meta = {"data_position": 0, "num_sequences": 1, "layout": trainer.describe().to_json()}
    results = [r for step in (1, 2, 3) for r in checkpointer.save(state_at(trainer, step), meta)]
    results += checkpointer.wait()
    checkpointer.close()
    print(json.dumps({r.step: r.error for r in results}), flush=True)


MODES = {"save": save, "restore": restore, "fail-alone": fail_alone}


def main(mode: str, port: int, index: int, run_dirs: list[Path]) -> None:
    initialize(LaunchSettings(coordinator=f"127.0.0.1:{port}", num_processes=2, process_id=index))
    trainer = pipeline_trainer()
    for run_dir in run_dirs:
        MODES[mode](trainer, run_dir)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [Path(p) for p in sys.argv[4:]])
