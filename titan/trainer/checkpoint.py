"""Checkpoints: per-chunk orbax items, plus the loader position and the layout that wrote them.

A checkpoint ``<run dir>/checkpoints/<step>/`` holds one item per model chunk, ``chunk_<c>``
(its parameters and optimizer state, orbax ``StandardSave``: one chunk for SPMD, one per
pipeline stage and virtual stage for MPMD) and ``meta`` (JSON: data position, the layout with
its chunks' layer ranges). Orbax writes everything into a temporary folder and renames it once
every item has been written, so a checkpoint is visible only when all stages have committed it,
and a crash mid-save leaves the previous one as the latest.

Restoring onto the same chunks (any mesh inside them) restores each array straight into its
new sharding. Restoring onto other chunks (another ``pp``, virtual stages, or SPMD from MPMD
and back) reads the items to host memory, joins the layer stacks in model order, cuts them at
the new chunk boundaries and places them on the new devices.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from titan.errors import TitanError
from titan.parallel.sharding import MESH_AXES
from titan.trainer.layout import Chunk, MeshLayout

CHECKPOINT_DIR = "checkpoints"
KEEP = 3


def _layout_name(layout: dict[str, Any]) -> str:
    if layout["layout"] == "spmd":
        return f"spmd {layout['mesh']}"
    return f"mpmd pp={layout['pp']} v={layout['virtual_stages']} stage mesh {layout['stage_mesh']}"


def _is_layer_stack(path: tuple) -> bool:
    return any(getattr(key, "key", None) == "layers" for key in path)


def reshard_items(
    saved: dict[str, Any],
    saved_chunks: list[Chunk],
    target: dict[str, Any],
    target_chunks: list[Chunk],
) -> dict[str, Any]:
    """Re-cut host checkpoint items at new chunk boundaries and place them per ``target``.

    Args:
        saved: ``chunk_<c>`` -> tree of host arrays, in the saved layout.
        target: ``chunk_<c>`` -> tree of ``jax.ShapeDtypeStruct`` with shardings.

    Raises:
        TitanError: an array of the target has no counterpart in the checkpoint.
    """
    pieces: dict[str, list[np.ndarray]] = {}
    for chunk in saved_chunks:
        leaves = jax.tree_util.tree_flatten_with_path(saved[f"chunk_{chunk.index}"])[0]
        for path, leaf in leaves:
            pieces.setdefault(jax.tree_util.keystr(path), []).append(np.asarray(leaf))
    items = {}
    for chunk in target_chunks:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(target[f"chunk_{chunk.index}"])
        placed = []
        for path, leaf in leaves:
            name = jax.tree_util.keystr(path)
            if name not in pieces:
                raise TitanError(f"checkpoint has no array {name} for chunk {chunk.index}")
            if _is_layer_stack(path):
                value = np.concatenate(pieces[name])[chunk.start : chunk.end]
            else:
                value = pieces[name][0]
            placed.append(jax.device_put(value.astype(leaf.dtype), leaf.sharding))
        items[f"chunk_{chunk.index}"] = jax.tree_util.tree_unflatten(treedef, placed)
    return items


class Checkpointer:
    """Saves and restores a run's checkpoints (synchronously: a save has committed on return)."""

    def __init__(self, run_dir: Path) -> None:
        logging.getLogger("absl").setLevel(logging.WARNING)
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

    def save(self, step: int, items: dict[str, Any], meta: dict[str, Any]) -> float:
        """Save the per-chunk ``items`` and ``meta`` as checkpoint ``step``. Returns seconds."""
        start = time.perf_counter()
        args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
        self._manager.save(
            step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **args), force=True
        )
        self._manager.wait_until_finished()
        return time.perf_counter() - start

    def restore(self, step: int, trainer: Any) -> tuple[Any, dict[str, Any]]:
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
        return trainer.state_from_items(items, step), meta

    def _restore_items(self, step: int, abstract: dict[str, Any]) -> dict[str, Any]:
        args = {name: ocp.args.StandardRestore(tree) for name, tree in abstract.items()}
        return dict(self._manager.restore(step, args=ocp.args.Composite(**args)))

    def _restore_resharded(self, step: int, meta: dict[str, Any], trainer: Any) -> dict:
        from titan.trainer.adapters import abstract_items_for_chunks

        ranges = meta["layout"]["chunks"]
        saved_chunks = [
            Chunk(c, 0, start, end, c == 0, c == len(ranges) - 1)
            for c, (start, end) in enumerate(ranges)
        ]
        host = MeshLayout(Mesh(np.array(jax.devices("cpu")[:1]).reshape(1, 1, 1), MESH_AXES))
        saved = self._restore_items(step, abstract_items_for_chunks(trainer, saved_chunks, host))
        return reshard_items(saved, saved_chunks, trainer.abstract_items(), trainer.chunks)

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def close(self) -> None:
        self._manager.close()
