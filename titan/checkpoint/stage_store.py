"""Checkpoint items that one process holds alone: the chunks of a pipeline whose stages live on
different processes.

Orbax (and JAX's own array serialization) refuse to write an array that one process holds
whole while several processes run, since in SPMD that would be a race between replicas. A
pipeline stage that belongs to one process is exactly such an array, and no other process can
write it. So each process writes its own stages' items here, with TensorStore (the storage
layer under orbax), one zarr array per leaf:

    <run dir>/stage_checkpoints/<step>/chunk_<c>/<leaf index>/   (zarr)
    <run dir>/stage_checkpoints/<step>/chunk_<c>/leaves.json      (key paths, shapes, dtypes)

``leaves.json`` is written last, so an item without it is incomplete. A step counts only once
orbax commits the checkpoint's ``meta`` (:mod:`titan.checkpoint.checkpointer`), which every process
reaches only after its own items are written (a barrier), and ``meta`` lists the items kept here
(``stage_items``). Items are removed only after a commit every process has seen, and only those
of steps up to it (:mod:`titan.checkpoint.protocol`). Nothing crosses processes to
save: each process writes from its own devices.
Restoring reads an item to host memory and places it; any process can read any item (the run
dir is on a file system they share), so a run resumes on another number of processes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from titan.checkpoint.protocol import leftovers
from titan.errors import CheckpointDamaged, TitanError
from titan.parallel.distributed import process_count, process_index
from titan.parallel.mesh import remote_array
from titan.reading import json_field, read_json

STAGE_CHECKPOINT_DIR = "stage_checkpoints"
LEAVES_FILE = "leaves.json"


def owner(tree: Any) -> int | None:
    """The process that holds every array of ``tree`` alone, with several processes running;
    None when one process runs or the arrays span processes (orbax writes those). Decided
    from the shardings, so every process answers alike."""
    if process_count() == 1:
        return None
    shardings = [leaf.sharding for leaf in jax.tree.leaves(tree)]
    processes = {d.process_index for s in shardings for d in s.device_set}
    return processes.pop() if len(processes) == 1 else None


def check_dtype(step: int, item: str, leaf: str, saved: Any, wanted: Any) -> None:
    """Refuse to restore an array whose saved dtype is not the one asked for (a restore never
    casts: the Python API would otherwise change a checkpoint's precision without a word).

    Raises:
        TitanError: ``saved`` differs from ``wanted`` (one line naming the item, the leaf and
            both dtypes).
    """
    if jax.numpy.dtype(saved) != jax.numpy.dtype(wanted):
        raise TitanError(
            f"checkpoint {step}: {item} {leaf} was saved as {jax.numpy.dtype(saved)}, the model "
            f"asks for {jax.numpy.dtype(wanted)} (a restore never casts: --param-dtype "
            f"{jax.numpy.dtype(saved)} reads it)"
        )


def _zarr(path: Path, shape: tuple[int, ...] = (), dtype: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}
    if dtype is not None:  # TensorStore's dtype names cover bfloat16 (numpy's do not)
        spec.update(dtype=jax.numpy.dtype(dtype).name, metadata={"shape": list(shape)})
    return spec


class StageStore:
    """The per-process items of a run's checkpoints (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.directory = (Path(run_dir) / STAGE_CHECKPOINT_DIR).absolute()

    def item_dir(self, step: int, name: str) -> Path:
        return self.directory / str(step) / name

    def save(self, step: int, items: dict[str, Any]) -> list[str]:
        """Write this process's items among ``items`` (name -> tree of arrays) for ``step``.

        Returns:
            The names of all items kept here, by whichever process (the same on every process).
        """
        kept = {name: owner(tree) for name, tree in items.items()}
        kept = {name: who for name, who in kept.items() if who is not None}
        for name, who in kept.items():
            if who == process_index():
                self._write(self.item_dir(step, name), items[name])
        return sorted(kept)

    def _write(self, directory: Path, tree: Any) -> None:
        shutil.rmtree(directory, ignore_errors=True)  # left by a save that did not commit
        directory.mkdir(parents=True)
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        futures, listing = [], []
        for index, (path, leaf) in enumerate(leaves):
            value = np.asarray(jax.device_get(leaf))
            store = ts.open(
                _zarr(directory / str(index), value.shape, value.dtype), create=True
            ).result()
            futures.append(store.write(value))
            listing.append({"path": jax.tree_util.keystr(path), "shape": list(value.shape)})
        for future in futures:
            future.result()
        (directory / LEAVES_FILE).write_text(json.dumps(listing))

    def restore(self, step: int, name: str, abstract: Any) -> Any:
        """Item ``name`` of ``step``, placed like ``abstract`` (a tree of
        ``jax.ShapeDtypeStruct`` carrying shardings; leaves on other processes' devices become
        handles, :func:`titan.parallel.mesh.remote_array`).

        Raises:
            CheckpointDamaged: the item is missing or incomplete.
            TitanError: it does not match ``abstract`` (a leaf's shape or dtype:
                :func:`check_dtype`).
        """
        directory = self.item_dir(step, name)
        listing_file = directory / LEAVES_FILE
        if not listing_file.is_file():
            raise CheckpointDamaged(f"checkpoint {step}: {directory} is missing or incomplete")
        entries = read_json(listing_file, f"checkpoint {step}", expect=list)
        where = f"checkpoint {step} {listing_file}"
        listing = {json_field(entry, "path", str, where): i for i, entry in enumerate(entries)}
        leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        placed = []
        for path, leaf in leaves:
            key = jax.tree_util.keystr(path)
            if key not in listing:
                raise TitanError(f"checkpoint {step}: {name} has no array {key}")
            store = ts.open(_zarr(directory / str(listing[key]))).result()  # metadata only
            check_dtype(step, name, key, store.dtype.name, leaf.dtype)  # on every process alike
            if not any(d.process_index == process_index() for d in leaf.sharding.device_set):
                placed.append(remote_array(leaf))
                continue
            value = store.read().result()
            if value.shape != leaf.shape:
                raise TitanError(
                    f"checkpoint {step}: {name} {key} has shape {value.shape}, not {leaf.shape}"
                )
            placed.append(jax.device_put(np.asarray(value), leaf.sharding))
        return jax.tree_util.tree_unflatten(treedef, placed)

    def move(self, step: int, target: Path) -> None:
        """Move the items of ``step`` (when it has any) to ``target``."""
        if (self.directory / str(step)).is_dir():
            (self.directory / str(step)).rename(target)

    def prune(self, kept_steps: list[int], upto: int | None) -> None:
        """Remove (process 0) the items of the steps up to ``upto`` (any step: None) that are
        not among ``kept_steps``, the committed checkpoints; a higher step's items may be
        another process's save in progress (:mod:`titan.checkpoint.protocol`)."""
        if process_index() != 0 or not self.directory.is_dir():
            return
        for step_dir in leftovers(self.directory.iterdir(), upto, set(kept_steps)):
            shutil.rmtree(step_dir, ignore_errors=True)
