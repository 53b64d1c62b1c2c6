"""Checkpoints: per-chunk orbax items, plus the loader position and the layout that wrote them.

A checkpoint ``<run dir>/checkpoints/<step>/`` holds one item per model chunk, ``chunk_<c>``
(its parameters and optimizer state, orbax ``StandardSave``: one chunk for SPMD, one per
pipeline stage and virtual stage for MPMD) and ``meta`` (JSON: data position, the layout with
its chunks' layer ranges). Orbax writes everything into a temporary folder and renames it once
every item has been written, so a checkpoint is visible only when all stages have committed it,
and a crash mid-save leaves the previous one as the latest.

Under a pipeline whose stages live on different processes, each stage's chunks are held by one
process, which writes them itself (:mod:`titan.checkpoint.stage_store`, outside orbax, which
refuses such arrays); ``meta`` names them (``stage_items``) and is committed by orbax only after
every process has written its own, so the step still counts only once all have. The order of a
save across processes (write, barrier, commit, seen, prune) is
:mod:`titan.checkpoint.protocol`.

Saves are asynchronous by default (``--checkpoint-async``, orbax's async ``CheckpointManager``).
With one process, :meth:`Checkpointer.save` copies the state on its devices when they have room
(:mod:`titan.checkpoint.snapshot`) and returns once the copy is dispatched; a background thread
hands the copy to orbax, waits for the commit and prunes, so neither the copy to host memory nor
deleting old checkpoints holds the loop. Otherwise (several processes, or no room) it returns once
every array of the state has been copied to host memory (orbax's blocking part), so the next step
may donate the device buffers, and a background thread writes and commits the copy. A save is
committed when its step folder (renamed from orbax's temporary folder) holds ``meta``;
:class:`titan.checkpoint.saving.SaveResult` says whether it was, and only committed saves are kept,
pruned or restored. Saves are ordered: a save first waits for the previous one to settle. Retention
(:func:`titan.checkpoint.retention.steps_to_prune`): the ``--checkpoint-keep`` newest committed
checkpoints, and every step that is a multiple of ``--checkpoint-keep-every``. Pruning happens only
between saves, once every process has seen the last one committed, on every process alike (orbax's
delete is collective; with one process and a copy on the device, on the background thread once the
save has committed), and never touches a step above it. A save that fails leaves nothing behind: its
temporary folder and stage items are removed once nobody can still write them
(:meth:`titan.checkpoint.retention.Retention.remove_leftovers`).

Restoring (:meth:`Checkpointer.restore_latest`, onto any layout: :mod:`titan.checkpoint.restoring`)
takes the newest committed checkpoint that restores;
a corrupt one is reported (:class:`titan.checkpoint.restoring.Unrestorable`) and the one before it
is tried. What needs only the weights (``titan generate``, ``--init-from``) restores only the
parameters, not the optimizer state (:meth:`Checkpointer.restore_params`), of the newest checkpoint
that can be read likewise (:meth:`Checkpointer.restore_params_newest`). With one process a save
keeps the digests of each chunk and of its parameters alone in its meta
(:data:`titan.checkpoint.finite_check.DIGESTS`,
:data:`titan.checkpoint.finite_check.PARAMS_DIGESTS`): each reader compares what it read with the
one that covers it, and a checkpoint that differs is corrupt.

:class:`Checkpointer` is the one object the rest of Titan uses; it is made of the run's
checkpoints folder (:class:`titan.checkpoint.folder.CheckpointFolder`), its saves
(:class:`titan.checkpoint.saving.SaveSequence`, through the phases of
:mod:`titan.checkpoint.protocol`), its retention (:class:`titan.checkpoint.retention.Retention`)
and its restores (:class:`titan.checkpoint.restoring.Restorer`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from titan.checkpoint.folder import CheckpointFolder
from titan.checkpoint.init_from import checkpoint_location
from titan.checkpoint.restoring import Restorer, Unrestorable, params_only
from titan.checkpoint.retention import Retention, steps_to_prune
from titan.checkpoint.saving import SaveResult, SaveSchedule, SaveSequence, check_save_clock
from titan.errors import TitanError
from titan.inert import inert
from titan.layouts.contract import ChunkState, Trainer, TrainState
from titan.out_paths import CHECKPOINT_DIR
from titan.parallel.chunks import Chunk, chunk_item
from titan.parallel.distributed import process_index
from titan.parallel.mesh import DeviceMesh, remote_array

__all__ = [  # the names the callers of the checkpoints import from here
    "CHECKPOINT_DIR",
    "Checkpointer",
    "SaveResult",
    "SaveSchedule",
    "Unrestorable",
    "check_save_clock",
    "fresh_optimizer_state",
    "initial_state",
    "open_checkpoint",
    "params_only",
    "steps_to_prune",
]
T = TypeVar("T")


class Checkpointer:
    """Saves and restores a run's checkpoints: the façade of its folder, saves, retention and
    restores (each method is theirs).

    Args:
        run_dir: the run dir (checkpoints go to ``<run dir>/checkpoints``).
        keep: how many of the newest committed checkpoints to keep (``--checkpoint-keep``).
        keep_every: also keep every step that is a multiple of this, forever (0: none;
            ``--checkpoint-keep-every``); a checkpoint saved as one stays when a resume
            changes the option (:data:`titan.checkpoint.retention.MILESTONE`).
        asynchronous: write in a background thread (``--checkpoint-async``).
    """

    def __init__(
        self, run_dir: Path, keep: int = 3, keep_every: int = 0, asynchronous: bool = False
    ) -> None:
        self.folder = CheckpointFolder(run_dir, asynchronous)
        self.directory, self.asynchronous = self.folder.directory, asynchronous
        self._saves = SaveSequence(
            self.folder, Retention(self.folder, keep, keep_every), asynchronous
        )
        self._restorer = Restorer(self.folder)

    def save(self, state: TrainState, meta: dict[str, Any]) -> list[SaveResult]:
        """:meth:`titan.checkpoint.saving.SaveSequence.save`."""
        return self._saves.save(state, meta)

    def results(self) -> list[SaveResult]:
        """:meth:`titan.checkpoint.saving.SaveSequence.results`."""
        return self._saves.results()

    def wait(self) -> list[SaveResult]:
        """:meth:`titan.checkpoint.saving.SaveSequence.wait`."""
        return self._saves.wait()

    def settle(self) -> list[SaveResult]:
        """:meth:`titan.checkpoint.saving.SaveSequence.settle`."""
        return self._saves.settle()

    def committed_steps(self) -> list[int]:
        """:meth:`titan.checkpoint.folder.CheckpointFolder.committed_steps`."""
        return self.folder.committed_steps()

    def latest_step(self) -> int | None:
        """:meth:`titan.checkpoint.folder.CheckpointFolder.latest_step`."""
        return self.folder.latest_step()

    def path(self, step: int) -> Path:
        """:meth:`titan.checkpoint.folder.CheckpointFolder.path`."""
        return self.folder.path(step)

    def restore_latest(
        self,
        trainer: Trainer,
        verify: Callable[[int, TrainState, dict[str, Any]], None] | None = None,
    ) -> tuple[TrainState, dict[str, Any], list[Unrestorable]] | None:
        """:meth:`titan.checkpoint.restoring.Restorer.restore_latest`."""
        return self._restorer.restore_latest(trainer, verify)

    def uncommitted(self) -> list[Unrestorable]:
        """:meth:`titan.checkpoint.restoring.Restorer.uncommitted`."""
        return self._restorer.uncommitted()

    def set_aside(self, steps: list[int]) -> None:
        """:meth:`titan.checkpoint.restoring.Restorer.set_aside`."""
        self._restorer.set_aside(steps)

    def check_committed(self, step: int | None) -> None:
        """:meth:`titan.checkpoint.restoring.Restorer.check_committed`."""
        self._restorer.check_committed(step)

    def restore(self, step: int, trainer: Trainer) -> tuple[TrainState, dict[str, Any]]:
        """:meth:`titan.checkpoint.restoring.Restorer.restore`."""
        return self._restorer.restore(step, trainer)

    def restore_params(self, step: int, trainer: Trainer) -> list[Any]:
        """:meth:`titan.checkpoint.restoring.Restorer.restore_params`."""
        return self._restorer.restore_params(step, trainer)

    def restore_params_newest(self, trainer: Trainer) -> tuple[list[Any], int, list[Unrestorable]]:
        """:meth:`titan.checkpoint.restoring.Restorer.restore_params_newest`."""
        return self._restorer.restore_params_newest(trainer)

    def read_params(
        self, step: int | None, trainer: Trainer
    ) -> tuple[list[Any], int, list[Unrestorable]]:
        """:meth:`titan.checkpoint.restoring.Restorer.read_params`."""
        return self._restorer.read_params(step, trainer)

    def read_newest(self, read: Callable[[int], T]) -> tuple[T, int, list[Unrestorable]]:
        """:meth:`titan.checkpoint.restoring.Restorer.read_newest`."""
        return self._restorer.read_newest(read)

    def restore_host(
        self,
        step: int,
        abstract: Callable[[list[Chunk], DeviceMesh], dict[str, Any]],
        partial: bool = False,
    ) -> tuple[dict[str, Any], list[Chunk], dict[str, Any]]:
        """:meth:`titan.checkpoint.restoring.Restorer.restore_host`."""
        return self._restorer.restore_host(step, abstract, partial)

    def close(self) -> None:
        """Wait for a save still in flight (its outcome is dropped: after a crash nothing records
        it) and close orbax's manager."""
        self._saves.settle()
        self.folder.manager.close()


def open_checkpoint(run_dir: Path, step: int | None, flag: str) -> tuple[Checkpointer, int]:
    """The checkpoints of ``run_dir`` (read only: nothing is created) and the step to read:
    ``step``, else the newest committed one.

    Raises:
        TitanError: no ``checkpoints/`` there, or no committed checkpoint ``step``.
    """
    if not (run_dir / CHECKPOINT_DIR).is_dir():
        raise TitanError(f"{flag} {run_dir}: no {CHECKPOINT_DIR}/ there")
    checkpointer = Checkpointer(run_dir)
    steps = checkpointer.committed_steps()
    chosen = steps[-1] if step is None and steps else step
    if chosen not in steps:
        checkpointer.close()
        if chosen is None:
            raise TitanError(f"{flag} {run_dir}: no committed checkpoint yet")
        have = ", ".join(map(str, steps)) or "none"
        raise TitanError(f"{flag} {run_dir}: no committed checkpoint {chosen} (committed: {have})")
    return checkpointer, chosen


def initial_state(trainer: Trainer, seed: int, init_from: str = "") -> TrainState:
    """The state a new run starts from: ``trainer.init_state(seed)``; with ``init_from``
    (``--init-from``, :func:`titan.checkpoint.init_from.checkpoint_location`), that checkpoint's
    parameters (its optimizer state is not read: :meth:`Checkpointer.restore_params`), restored
    onto the trainer's chunks and shardings whatever layout wrote them, at step 0 with a fresh
    optimizer state (:func:`fresh_optimizer_state`); nothing is initialised at random. A run dir
    gives its newest checkpoint that can be read: each newer one that cannot is said in one line
    on stderr.

    Raises:
        TitanError: no such committed checkpoint, none that can be read, or it does not fit
            the trainer's model.
    """
    if not init_from:
        return trainer.init_state(seed)
    run_dir, step = checkpoint_location(init_from)
    checkpointer, _ = open_checkpoint(run_dir, step, "--init-from")
    try:
        params, chosen, skipped = checkpointer.read_params(step, trainer)
    except TitanError as err:
        raise TitanError(f"--init-from {init_from}: {err}") from None
    finally:
        checkpointer.close()
    for unreadable in skipped:
        line = (
            f"titan: --init-from {init_from}: {unreadable.error}; starting from checkpoint {chosen}"
        )
        print(inert(line), file=sys.stderr, flush=True)
    abstract = trainer.abstract_items()
    chunks = [
        ChunkState(
            params=p, opt_state=fresh_optimizer_state(abstract[chunk_item(c.index)]["opt_state"])
        )
        for c, p in zip(trainer.chunks, params, strict=True)
    ]
    return TrainState(0, tuple(chunks))


def fresh_optimizer_state(abstract: Any) -> Any:
    """AdamW's initial state, created in the shardings of ``abstract`` (its tree of
    ``jax.ShapeDtypeStruct``): every leaf zero (optax's ``scale_by_adam`` starts its step count
    and both moments at 0, the schedule's count at 0, weight decay and the mask hold no arrays).
    A chunk that this process holds no shard of (a pipeline stage of another process) gets
    handles (:func:`titan.parallel.mesh.remote_array`), as :meth:`Trainer.init_state` gives it."""
    leaves = jax.tree.leaves(abstract)
    if not any(d.process_index == process_index() for x in leaves for d in x.sharding.device_set):
        return jax.tree.map(remote_array, abstract)
    shardings = jax.tree.map(lambda leaf: leaf.sharding, abstract)
    zeros = jax.jit(
        lambda: jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), abstract),
        out_shardings=shardings,
    )
    return zeros()
