"""Checkpoints: per-chunk orbax items, plus the loader position and the layout that wrote them.

A checkpoint ``<run dir>/checkpoints/<step>/`` holds one item per model chunk, ``chunk_<c>``
(its parameters and optimizer state, orbax ``StandardSave``: one chunk for SPMD, one per
pipeline stage and virtual stage for MPMD) and ``meta`` (JSON: data position, the layout with
its chunks' layer ranges). Orbax writes everything into a temporary folder and renames it once
every item has been written, so a checkpoint is visible only when all stages have committed it,
and a crash mid-save leaves the previous one as the latest.

Restoring onto the same chunks (any mesh inside them) restores each array straight into its
new sharding. Restoring onto other chunks (another ``pp``, virtual stages, or SPMD from MPMD
and back) reads the items to host memory, joins the layer stacks in model order along the model
family's layer axis, cuts them at the new chunk boundaries and places them on the new devices
(:func:`titan.parallel.chunks.join_layers`, :func:`titan.parallel.chunks.cut_layers`).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from titan.errors import TitanError
from titan.models.adapters.base import ModelAdapter
from titan.parallel.chunks import Chunk, chunks_from_ranges, cut_layers, join_layers
from titan.parallel.mesh import host_mesh
from titan.trainer_state import ChunkState, Trainer, TrainState, chunk_item

CHECKPOINT_DIR = "checkpoints"
KEEP = 3


def _layout_name(layout: dict[str, Any]) -> str:
    if layout["layout"] == "spmd":
        return f"spmd {layout['mesh']}"
    return f"mpmd pp={layout['pp']} v={layout['virtual_stages']} stage mesh {layout['stage_mesh']}"


def reshard_items(
    saved: dict[str, ChunkState],
    saved_chunks: list[Chunk],
    target: dict[str, ChunkState],
    target_chunks: list[Chunk],
    adapter: ModelAdapter,
) -> dict[str, ChunkState]:
    """Re-cut host checkpoint items at new chunk boundaries and place them per ``target``.

    Args:
        saved: ``chunk_<c>`` -> tree of host arrays, in the saved layout.
        target: ``chunk_<c>`` -> tree of ``jax.ShapeDtypeStruct`` with shardings.
        adapter: the model family (which arrays stack layers, along which axis).

    Raises:
        TitanError: an array of the target has no counterpart in the checkpoint.
    """
    stacked, axis = adapter.is_layer_stacked, adapter.layer_axis
    joined = join_layers([saved[chunk_item(c.index)] for c in saved_chunks], stacked, axis)
    return {
        chunk_item(c.index): cut_layers(joined, target[chunk_item(c.index)], c, stacked, axis)
        for c in target_chunks
    }


_DISK_FULL = os.strerror(errno.ENOSPC)


def _drop_disk_full(record: logging.LogRecord) -> bool:
    """absl log filter: orbax logs a failed write (with its traceback) from each of its threads
    before the save raises it; a full disk is said once, in one line, by the trainer."""
    return _DISK_FULL not in record.getMessage()


def _drop_closed_loop(unraisable: Any, previous: Callable[[Any], None]) -> None:
    """``sys.unraisablehook``: when a save fails, tensorstore's callbacks for the writes still in
    flight reach the event loop orbax has closed already (``RuntimeError: Event loop is
    closed``, one traceback per write); those are dropped, everything else passed on."""
    err = unraisable.exc_value
    if not (isinstance(err, RuntimeError) and str(err) == "Event loop is closed"):
        previous(unraisable)


def _quiet_failed_save_echoes() -> None:
    """Install :func:`_drop_disk_full` and :func:`_drop_closed_loop` (once per process)."""
    absl = logging.getLogger("absl")
    if _drop_disk_full not in absl.filters:
        absl.addFilter(_drop_disk_full)
        sys.unraisablehook = functools.partial(_drop_closed_loop, previous=sys.unraisablehook)


class Checkpointer:
    """Saves and restores a run's checkpoints (synchronously: a save has committed on return)."""

    def __init__(self, run_dir: Path) -> None:
        logging.getLogger("absl").setLevel(logging.WARNING)
        _quiet_failed_save_echoes()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=KEEP, create=True, enable_async_checkpointing=False
        )
        self.directory = (Path(run_dir) / CHECKPOINT_DIR).absolute()
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """Step of the newest committed checkpoint, or None. A step directory without the
        ``meta`` item (made by hand, or left by something other than a finished save) is not a
        checkpoint and is skipped."""
        steps = [s for s in self._manager.all_steps() if (self.path(s) / "meta").is_dir()]
        return max(steps, default=None)

    def save(self, state: TrainState, meta: dict[str, Any]) -> float:
        """Save ``state``'s chunks and ``meta`` as checkpoint ``state.step``. Returns seconds."""
        start = time.perf_counter()
        step = state.step
        args = {name: ocp.args.StandardSave(tree) for name, tree in state.items().items()}
        self._manager.save(
            step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **args), force=True
        )
        self._manager.wait_until_finished()
        return time.perf_counter() - start

    def restore(self, step: int, trainer: Trainer) -> tuple[TrainState, dict[str, Any]]:
        """Restore checkpoint ``step`` into ``trainer``'s layout (resharding as needed).

        Returns:
            (train state, meta).

        Raises:
            TitanError: the checkpoint cannot be mapped onto the trainer's model (names both
                layouts).
        """
        meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = meta["meta"]
        current = trainer.describe()
        try:
            if meta["layout"]["chunks"] == current["chunks"]:
                items = self._restore_items(step, trainer.abstract_items())
            else:
                items = self._restore_resharded(step, meta, trainer)
        except (ValueError, KeyError, TitanError) as err:
            raise TitanError(
                f"checkpoint {step} written by {_layout_name(meta['layout'])} cannot be restored "
                f"onto {_layout_name(current)}: {str(err).splitlines()[0]}"
            ) from None
        return TrainState.from_items(items, step), meta

    def _restore_items(self, step: int, abstract: dict[str, Any]) -> dict[str, Any]:
        args = {name: ocp.args.StandardRestore(tree) for name, tree in abstract.items()}
        return dict(self._manager.restore(step, args=ocp.args.Composite(**args)))

    def _restore_resharded(self, step: int, meta: dict[str, Any], trainer: Trainer) -> dict:
        saved_chunks = chunks_from_ranges(meta["layout"]["chunks"])
        saved = self._restore_items(step, trainer.abstract_items(saved_chunks, host_mesh()))
        return reshard_items(
            saved, saved_chunks, trainer.abstract_items(), trainer.chunks, trainer.adapter
        )

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def close(self) -> None:
        self._manager.close()
