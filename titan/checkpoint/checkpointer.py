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

Restoring onto the same chunks (any mesh inside them) restores each array straight into its
new sharding. Restoring onto other chunks (another ``pp``, virtual stages, or SPMD from MPMD
and back) reads the items to host memory, joins the layer stacks in model order along the model
family's layer axis, cuts them at the new chunk boundaries and places them on the new devices
(:func:`titan.parallel.chunks.join_layers`, :func:`titan.parallel.chunks.cut_layers`).

Saves are asynchronous by default (``--checkpoint-async``, orbax's async
``CheckpointManager``). With one process, :meth:`Checkpointer.save` copies the state on its
devices when they have room (:mod:`titan.checkpoint.snapshot`) and returns once the copy is
dispatched; a background thread hands the copy to orbax, waits for the commit and prunes, so
neither the copy to host memory nor deleting old checkpoints holds the loop. Otherwise (several
processes, or no room) it returns once every array of the state has been copied to host memory
(orbax's blocking part), so the next step may donate the device buffers, and a background thread
writes and commits the copy. A save is committed when its step folder
(renamed from orbax's temporary folder) holds ``meta``; :class:`SaveResult` says whether it was,
and only committed saves are kept, pruned or restored. Saves are ordered: a save first waits for
the previous one to settle. Retention (:func:`steps_to_prune`): the ``--checkpoint-keep``
newest committed checkpoints, and every step that is a multiple of ``--checkpoint-keep-every``.
Pruning happens only between saves, once every process has seen the last one committed, on
every process alike (orbax's delete is collective; with one process and a copy on the device,
on the background thread once the save has committed), and never touches a step above it. A save
that fails leaves nothing behind: its temporary folder and stage items are removed once nobody
can still write them (:meth:`Checkpointer.remove_leftovers`).

Restoring (:meth:`Checkpointer.restore_latest`) takes the newest committed checkpoint that
restores; a corrupt one is reported (:class:`Unrestorable`) and the one before it is tried.
What needs only the weights (``titan generate``, ``--init-from``) restores only the parameters,
not the optimizer state (:meth:`Checkpointer.restore_params`), of the newest checkpoint that can
be read likewise (:meth:`Checkpointer.restore_params_newest`). With one process a save keeps
the digests of each chunk and of its parameters alone in its meta
(:data:`titan.checkpoint.finite_check.DIGESTS`,
:data:`titan.checkpoint.finite_check.PARAMS_DIGESTS`): each reader compares what it read with
the one that covers it, and a checkpoint that differs is corrupt.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import tensorstore as ts

from titan.checkpoint.finite_check import DIGESTS, PARAMS_DIGESTS, check_digests, read_digests
from titan.checkpoint.init_from import checkpoint_location
from titan.checkpoint.protocol import fault_point, leftovers
from titan.checkpoint.snapshot import device_snapshot, snapshot_fits
from titan.checkpoint.stage_store import STAGE_CHECKPOINT_DIR, StageStore, check_dtype
from titan.errors import CheckpointDamaged, TitanError, error_line, first_line, root_cause
from titan.inert import inert
from titan.layouts.contract import ChunkState, Trainer, TrainState
from titan.models.adapters.base import ModelAdapter
from titan.out_paths import CHECKPOINT_DIR
from titan.parallel.chunks import Chunk, chunk_item, chunks_from_ranges, cut_layers, join_layers
from titan.parallel.distributed import (
    barrier,
    on_every_process,
    process_count,
    process_index,
)
from titan.parallel.mesh import DeviceMesh, host_mesh, remote_array
from titan.reading import read_json
from titan.telemetry.records import DISK_FULL, disk_full

UNRESTORABLE_DIR = "unrestorable_checkpoints"  # where restore_latest moves the ones it skipped
T = TypeVar("T")


def _restore_args(tree: Any, partial: bool) -> ocp.args.CheckpointArgs:
    """orbax's restore arguments of one item placed like ``tree`` (``jax.ShapeDtypeStruct``
    leaves carrying shardings). Each array is cast to its dtype, so its saved dtype is checked
    before (:meth:`Checkpointer._check_dtypes`). ``partial``: ``tree`` is part of the item and
    the rest of its arrays is not read."""
    if not partial:
        return ocp.args.StandardRestore(tree)
    restore_args = jax.tree.map(
        lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding, global_shape=leaf.shape), tree
    )
    return ocp.args.PyTreeRestore(tree, restore_args=restore_args, partial_restore=True)


def params_only(abstract: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``abstract`` (:meth:`Trainer.abstract_items`, or a function like it) cut to each item's
    ``params``: what a partial restore reads (:meth:`Checkpointer.restore_params`,
    :meth:`Checkpointer.restore_host` with ``partial``), leaving the optimizer state unread."""

    def cut(*args: Any) -> dict[str, Any]:
        return {name: {"params": item["params"]} for name, item in abstract(*args).items()}

    return cut


def _saved_dtypes(item: Path, names: Iterable[str]) -> dict[str, Any]:
    """The saved dtype of each array ``names`` of the orbax item at ``item``, read from its zarr
    metadata alone (no array data, and no other array's metadata: a partial restore needs
    nothing else of the item).

    Raises:
        TitanError: the item's ``_METADATA`` cannot be read.
        ValueError: an array is missing or its metadata cannot be read (tensorstore's error).
    """
    layout = read_json(item / "_METADATA", "checkpoint")
    driver = "zarr3" if layout.get("use_zarr3") else "zarr"
    dtypes = {}
    for name in names:
        if layout.get("use_ocdbt", True):
            spec = {"kvstore": {"driver": "ocdbt", "base": f"file://{item}/"}, "path": name}
        else:
            spec = {"kvstore": {"driver": "file", "path": str(item / name)}}
        array = ts.open({"driver": driver, **spec}, open=True).result()
        dtypes[name] = array.dtype.numpy_dtype
    return dtypes


def _leaf_dtypes(tree: Any) -> dict[str, Any]:
    """orbax's leaf name (:func:`_key_name`) -> dtype, of each leaf of ``tree``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(map(_key_name, path)): leaf.dtype for path, leaf in leaves}


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


# orbax's echoes of a failed save: the async save's, its finalize thread's (once from the thread,
# once from the wait), and its signalling thread's (orbax.checkpoint._src.futures)
_SAVE_FAILURES = (
    "in background save thread",
    "Save Finalize thread (save_finalize) failed",
    "_SignalingThread.run() raised an exception",
)


# orbax's log line for a checkpoint's unreadable metadata, logged before the read raises
_BAD_METADATA = "Failed to json parse Metadata file"
# orbax's log line for a step folder without its own metadata file (a folder made by hand, or
# a copy cut short): the step is set aside or skipped, and Titan's own line says so
_NO_METADATA = "Metadata file does not exist"
# orbax's error for one array of a failed read, raised again by each of its reads still going
_ARRAY_READ_FAILURE = "Encountered error while reading array index"


def _drop_echoed_log(record: logging.LogRecord) -> bool:
    """absl log filter: orbax logs a failed write (with its traceback) from each of its threads
    before the save raises it, and an async save's failure once more from its thread; a full
    disk is said once, in one line, by the trainer, and any failed save in a
    ``checkpoint_failed`` event and one line. Likewise a checkpoint's unreadable metadata,
    which the restore's error says, and a step folder without orbax's metadata file."""
    message = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        message += f" {record.exc_info[1]!r}"
    echoes = (_DISK_FULL, *_SAVE_FAILURES, _BAD_METADATA, _NO_METADATA)
    return not any(echo in message for echo in echoes)


def _drop_echoed_unraisable(unraisable: Any, previous: Callable[[Any], None]) -> None:
    """``sys.unraisablehook``: when a save fails, tensorstore's callbacks for the writes still in
    flight reach the event loop orbax has closed already (``RuntimeError: Event loop is
    closed``, one traceback per write); when a restore fails, its other array reads end with
    orbax's error once more, each when its coroutine is collected. Those are dropped (the save
    or the restore says its failure), everything else passed on."""
    err = unraisable.exc_value
    closed = isinstance(err, RuntimeError) and str(err) == "Event loop is closed"
    if not (closed or str(err).startswith(_ARRAY_READ_FAILURE)):
        previous(unraisable)


def _quiet_echoes() -> None:
    """Install :func:`_drop_echoed_log` (on absl's and asyncio's loggers) and
    :func:`_drop_echoed_unraisable` (once per process)."""
    absl = logging.getLogger("absl")
    if _drop_echoed_log not in absl.filters:
        absl.addFilter(_drop_echoed_log)
        # orbax's write tasks that fail after the save gave up: "Task exception was never
        # retrieved", from asyncio's own logger
        logging.getLogger("asyncio").addFilter(_drop_echoed_log)
        sys.unraisablehook = functools.partial(_drop_echoed_unraisable, previous=sys.unraisablehook)


@dataclass(frozen=True)
class SaveResult:
    """How one save ended.

    Attributes:
        step: the step saved.
        blocking_s: seconds the training loop waited in :meth:`Checkpointer.save` (and, for
            the last save, in :meth:`Checkpointer.wait`): the previous save settling, then
            the copy to host memory; the whole save and the pruning after it when
            synchronous.
        commit_s: seconds from the start of the save until it committed or failed (the
            pruning after a commit is not part of it).
        error: None when committed, else why not (one line).
    """

    step: int
    blocking_s: float
    commit_s: float
    error: str | None = None

    @property
    def disk_full(self) -> bool:
        """Whether the save failed on a full disk (the run then ends: nothing more fits)."""
        return self.error is not None and self.error.startswith(DISK_FULL)


@dataclass(frozen=True)
class Unrestorable:
    """A checkpoint that could not be restored (corrupt, written by an incompatible layout, or
    a step folder without ``meta``); the restore went on with an older one."""

    step: int
    error: str


MILESTONE = "milestone"
"""The meta field that marks a checkpoint saved at a multiple of ``--checkpoint-keep-every``:
pruning never deletes it (:meth:`Checkpointer._prune`), whatever the option is later."""
# Checkpoints that a newest-first read may see deleted under it (a live run's retention) before
# it gives up: each time the folder is listed afresh and the newest committed one tried.
VANISHED_TRIES = 10


def steps_to_prune(committed: list[int], keep: int, keep_every: int) -> list[int]:
    """The committed steps to delete: all but the ``keep`` newest and (``keep_every`` > 0)
    the multiples of ``keep_every``, oldest first."""
    newest = set(sorted(committed)[-keep:])
    return [
        s for s in sorted(committed) if s not in newest and not (keep_every and s % keep_every == 0)
    ]


def _save_error(err: BaseException) -> str:
    """Why a save failed, one line: :func:`titan.telemetry.records.disk_full`'s line for a
    full disk (:attr:`SaveResult.disk_full`), else the error's first line."""
    return disk_full(err) or error_line(err)


def _key_name(key: Any) -> str:
    """One key of a tree path as orbax names it in a leaf's name (``opt_state.0.mu.embed``)."""
    for field in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey
        if hasattr(key, field):
            return str(getattr(key, field))
    return str(key)


def check_save_clock(every_s: float, processes: int) -> None:
    """Refuse ``--checkpoint-every-s`` (``every_s`` > 0) with several ``processes``: each would
    read its own clock and they could pick different steps (``--checkpoint-every`` steps agree
    by construction).

    Raises:
        TitanError: naming both.
    """
    if every_s and processes > 1:
        raise TitanError(
            f"--checkpoint-every-s runs with one process, not {processes} (their clocks "
            "would pick different steps); use --checkpoint-every"
        )


class SaveSchedule:
    """When the loop saves: after every ``every_steps``-th step and, with ``every_s`` > 0, after
    the first step that ends ``every_s`` seconds or more after the last save (or the loop's
    start).

    Raises:
        TitanError: as :func:`check_save_clock`.
    """

    def __init__(
        self,
        every_steps: int,
        every_s: float,
        processes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_save_clock(every_s, processes)
        self.every_steps, self.every_s, self._clock = every_steps, every_s, clock
        self._last = clock()

    def due(self, step: int) -> bool:
        """Whether to save after ``step``."""
        if step % self.every_steps == 0:
            return True
        return bool(self.every_s) and self._clock() - self._last >= self.every_s

    def restart(self) -> None:
        """The time-based interval starts again now (at the loop's start and after a save)."""
        self._last = self._clock()


def _consume_failed_save(manager: ocp.CheckpointManager) -> None:
    """Orbax raises a failed save once per thread, on its next wait or save: consume it on the
    calling thread (the thread that waited for that save has recorded it)."""
    try:
        manager.wait_until_finished()
    except Exception:  # noqa: BLE001, S110 - recorded by the save's own thread
        pass


class _PendingSave:
    """An async save in flight: a thread runs ``finish`` (which waits for orbax to write, and
    returns None once committed, else why not), then, once committed, ``after`` (pruning: not
    part of the save's ``commit_s``, but waited for with it)."""

    def __init__(
        self,
        finish: Callable[[], str | None],
        step: int,
        start: float,
        blocking_s: float,
        after: Callable[[], None] | None = None,
    ):
        self.step, self.start, self.blocking_s = step, start, blocking_s
        self.prunes = after is not None  # the ``prune`` phase is its own
        self.result: SaveResult | None = None
        self._thread = threading.Thread(
            target=self._wait, args=(finish, after), name=f"titan-save-{step}", daemon=True
        )
        self._thread.start()

    def _wait(self, finish: Callable[[], str | None], after: Callable[[], None] | None) -> None:
        try:
            error = finish()
        except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
            error = _save_error(err)
        commit_s = time.perf_counter() - self.start
        if error is None and after is not None:
            after()  # pruning: it says its own failures, the save committed
        self.result = SaveResult(self.step, self.blocking_s, commit_s, error)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> SaveResult:
        self._thread.join()
        assert self.result is not None  # _wait sets it
        return self.result


class Checkpointer:
    """Saves and restores a run's checkpoints.

    Args:
        run_dir: the run dir (checkpoints go to ``<run dir>/checkpoints``).
        keep: how many of the newest committed checkpoints to keep (``--checkpoint-keep``).
        keep_every: also keep every step that is a multiple of this, forever (0: none;
            ``--checkpoint-keep-every``); a checkpoint saved as one stays when a resume
            changes the option (:data:`MILESTONE`).
        asynchronous: write in a background thread (``--checkpoint-async``).
    """

    def __init__(
        self, run_dir: Path, keep: int = 3, keep_every: int = 0, asynchronous: bool = False
    ) -> None:
        logging.getLogger("absl").setLevel(logging.WARNING)
        _quiet_echoes()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=asynchronous
        )
        self.directory = (Path(run_dir) / CHECKPOINT_DIR).absolute()
        self.keep, self.keep_every, self.asynchronous = keep, keep_every, asynchronous
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._stages = StageStore(run_dir)
        self._pending: _PendingSave | None = None
        self._settled: SaveResult | None = None  # the last save settled, not yet concluded
        self._saved = False  # whether this checkpointer has saved yet
        self._undeletable: set[int] = set()  # steps whose deletion failed, told once each
        # one process, asynchronous: saves from a copy on the device, written and pruned by a
        # background thread (orbax's saves and deletes are collective across processes)
        self._snapshots = asynchronous and jax.process_count() == 1

    def _save_snapshot(
        self, step: int, snapshot: dict[str, Any], meta: dict[str, Any], start: float
    ) -> list[SaveResult]:
        """Save ``snapshot`` (:func:`titan.checkpoint.snapshot.device_snapshot` of the state's
        items) as checkpoint ``step`` from a background thread, which hands it to orbax (whose
        copy to host memory then holds no loop), waits for the commit and prunes. The loop
        waits only for the copy's dispatch. Returns the saves settled here (none)."""
        begun = time.perf_counter()  # the commit's start: after the previous save settled
        meta = {**meta, "stage_items": []}
        args = {name: ocp.args.StandardSave(tree) for name, tree in snapshot.items()}
        composite = ocp.args.Composite(meta=ocp.args.JsonSave(meta), **args)

        def write() -> str | None:
            _consume_failed_save(self._manager)  # an earlier failure, already recorded
            try:
                self._manager.save(step, args=composite, force=True)
            except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
                self.finish_orbax_save(step)
                return _save_error(err)
            return self.finish_orbax_save(step)

        def prune() -> None:  # the new checkpoint is committed: older ones may go
            self._prune(step, self._doomed([s for s in self.committed_steps() if s <= step]))

        self._pending = _PendingSave(write, step, begun, time.perf_counter() - start, prune)
        return []

    def committed_steps(self) -> list[int]:
        """Steps of the committed checkpoints, oldest first. A step directory without the
        ``meta`` item (made by hand, or left by something other than a finished save) is not a
        checkpoint and is skipped."""
        return sorted(s for s in self._manager.all_steps() if self._is_committed(s))

    def latest_step(self) -> int | None:
        """Step of the newest committed checkpoint, or None."""
        return max(self.committed_steps(), default=None)

    def _is_committed(self, step: int) -> bool:
        return (self.path(step) / "meta").is_dir()

    def save(self, state: TrainState, meta: dict[str, Any]) -> list[SaveResult]:
        """Save ``state``'s chunks and ``meta`` as checkpoint ``state.step``.

        Goes through the phases of :mod:`titan.checkpoint.protocol`: first settles the
        previous save and, once every process has seen it committed, prunes; then writes this
        process's stage items, waits for every process's, and commits. Synchronous: returns
        once the save has committed (and been pruned after) or failed. Asynchronous: returns
        once the state has been copied to host memory (the caller may then donate its
        buffers), or, with one process and room on its devices, once a copy of the state on the
        devices is dispatched (a background thread writes, commits and prunes); the result
        comes from :meth:`results` or :meth:`wait`.

        Returns:
            The saves that settled during the call (the previous one; this one when synchronous).
            A failed save is a result with ``error``, never an exception.
        """
        start = time.perf_counter()
        settled = self._settle()
        self._conclude()
        meta = {**meta, MILESTONE: bool(self.keep_every and state.step % self.keep_every == 0)}
        if not self._saved:  # what an earlier run's failed or killed saves left
            self.remove_leftovers(None)
            barrier("titan:checkpoint-leftovers")
            self._saved = True
        step, items = state.step, state.items()
        if self._snapshots and snapshot_fits(items):
            return [*settled, *self._save_snapshot(step, device_snapshot(items), meta, start)]
        fault_point("write", step)
        try:
            stage_items, error = self._stages.save(step, items), None  # now, whatever the mode
        except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
            stage_items, error = [], _save_error(err)
        fault_point("barrier", step)
        if not on_every_process(error is None):  # every process's own items, before the commit
            error = error or "another process could not write its stage items"
            elapsed = time.perf_counter() - start
            return [*settled, self._settle_as(SaveResult(step, elapsed, elapsed, error))]
        fault_point("commit", step)
        args = {
            name: ocp.args.StandardSave(tree)
            for name, tree in items.items()
            if name not in stage_items
        }
        meta = {**meta, "stage_items": stage_items}
        composite = ocp.args.Composite(meta=ocp.args.JsonSave(meta), **args)
        save_start = time.perf_counter()
        try:
            self._manager.save(step, args=composite, force=True)
        except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
            self.finish_orbax_save(step)
            elapsed = time.perf_counter() - start
            return [*settled, self._settle_as(SaveResult(step, elapsed, elapsed, _save_error(err)))]
        if self.asynchronous:
            finish = functools.partial(self.finish_orbax_save, step)
            self._pending = _PendingSave(finish, step, save_start, time.perf_counter() - start)
            return settled
        error = self.finish_orbax_save(step)
        result = self._settle_as(SaveResult(step, 0.0, time.perf_counter() - save_start, error))
        self._conclude()  # the loop waits for the pruning too
        return [*settled, replace(result, blocking_s=time.perf_counter() - start)]

    def finish_orbax_save(self, step: int) -> str | None:
        """Wait for orbax's save of ``step`` to finish (on the calling thread). Returns None when
        it committed, else why not."""
        try:
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - reported in the result
            return _save_error(err)
        if not self._is_committed(step):
            return f"checkpoint {step} was not committed (no {self.path(step) / 'meta'})"
        return None

    def results(self) -> list[SaveResult]:
        """The saves settled since the last call, without waiting."""
        if self._pending is not None and self._pending.done():
            return self._settle()
        return []

    def wait(self) -> list[SaveResult]:
        """Wait for the save in flight, prune once every process has seen it committed (the
        waiting and the pruning count as the save's blocking), and return the saves settled
        since the last call."""
        start = time.perf_counter()
        settled = self._settle()
        self._conclude()
        waited = time.perf_counter() - start
        return [replace(r, blocking_s=r.blocking_s + waited) for r in settled]

    def settle(self) -> list[SaveResult]:
        """Wait for the save in flight, for a run that is failing: no barrier and no pruning
        follow (the other processes may be gone). A failed save's leftovers go, as ever.
        Returns the save settled (none when no save was in flight)."""
        return self._settle()

    def _settle(self) -> list[SaveResult]:
        if self._pending is None:
            return []
        pending, self._pending = self._pending, None
        result = pending.join()
        _consume_failed_save(self._manager)
        return [self._settle_as(result, pruned=pending.prunes)]

    def _settle_as(self, result: SaveResult, pruned: bool = False) -> SaveResult:
        """Hold ``result`` for :meth:`_conclude` (unless its own thread ``pruned`` already); a
        failed save's leftovers go at once when this is the only process (nobody else may
        still write them)."""
        self._settled = None if pruned else result
        if result.error is not None and process_count() == 1:
            self.remove_leftovers(result.step)
        return result

    def _conclude(self) -> None:
        """The ``seen`` and ``prune`` phases after the save settled last, if it committed:
        every process has seen it (a barrier), then process 0 prunes up to its step."""
        result, self._settled = self._settled, None
        if result is None or result.error is not None:
            return
        # Listed before the barrier: past it, process 0 may already be deleting some.
        doomed = self._doomed([s for s in self.committed_steps() if s <= result.step])
        fault_point("seen", result.step)
        barrier(f"titan:checkpoint-seen:{result.step}")
        fault_point("prune", result.step)
        self._prune(result.step, doomed)

    def _doomed(self, committed: list[int]) -> list[int]:
        """The steps of ``committed`` that retention deletes: :func:`steps_to_prune`'s, less the
        milestones (:meth:`_milestone`)."""
        pruned = steps_to_prune(committed, self.keep, self.keep_every)
        return [step for step in pruned if not self._milestone(step)]

    def _prune(self, upto: int, doomed: list[int]) -> None:
        """Delete the ``doomed`` steps (:meth:`_doomed`, listed up to ``upto`` before the
        processes met: the same list on every process, as orbax's delete is collective; its
        folder goes first, which uncommits the step, then its stage items), and the leftovers
        of saves up to ``upto`` that never committed. A failure is one line on stderr (once
        per step), never the save's, and stops no other deletion: a later pruning tries the
        step again."""
        for step in doomed:
            try:
                self._manager.delete(step)
            except Exception as err:  # noqa: BLE001 - the new checkpoint is committed all the same
                self._report_undeletable(step, err)
        try:
            self.remove_leftovers(upto)
        except Exception as err:  # noqa: BLE001
            line = f"titan: removing unfinished saves up to {upto} failed: {error_line(err)}"
            print(inert(line), file=sys.stderr, flush=True)

    def _report_undeletable(self, step: int, err: Exception) -> None:
        """One line on stderr the first time checkpoint ``step`` cannot be deleted."""
        if step not in self._undeletable:
            self._undeletable.add(step)
            line = f"titan: deleting checkpoint {step} failed, kept: {error_line(err)}"
            print(inert(line), file=sys.stderr, flush=True)

    def remove_leftovers(self, upto: int | None) -> None:
        """Remove (process 0) orbax's temporary folders and the stage items of steps up to
        ``upto`` (any step: None) that are not committed checkpoints: what saves that failed or
        were killed left (:func:`titan.checkpoint.protocol.leftovers`). Only where
        nobody is saving those steps: after a commit of ``upto`` that every process has seen,
        after a failed save of the only process, or before this checkpointer's first save (only
        the run that holds the run dir saves)."""
        if process_index() == 0:
            for folder in leftovers(self.directory.iterdir(), upto, None):
                shutil.rmtree(folder, ignore_errors=True)
        self._stages.prune(self.committed_steps(), upto)

    def restore_latest(
        self,
        trainer: Trainer,
        verify: Callable[[int, TrainState, dict[str, Any]], None] | None = None,
    ) -> tuple[TrainState, dict[str, Any], list[Unrestorable]] | None:
        """Restore the newest committed checkpoint that restores, newest first; ``verify(step,
        state, meta)`` may refuse a restored one (raising :class:`TitanError`), which then
        counts as unrestorable (:func:`titan.trainer.saver.digest_check`).

        Returns:
            None when there is no committed checkpoint; else (state, meta, the newer
            checkpoints that could not be restored and the step folders of any step that hold
            no ``meta``; nothing on disk changes here: the caller moves them aside with
            :meth:`set_aside` once the run has started, so that their steps can be saved
            again and nothing keeps them from retention's count).

        Raises:
            TitanError: none restores (how many were tried, and the newest one's error).
        """

        def read(step: int) -> tuple[TrainState, dict[str, Any]]:
            state, meta = self.restore(step, trainer)
            if verify is not None:
                verify(step, state, meta)
            return state, meta

        restored, skipped = self._newest_readable(read)
        if restored is not None:
            return *restored, skipped + self.uncommitted()
        if len(skipped) > 1:  # that the older ones were tried too
            raise TitanError(
                f"--resume: none of the {len(skipped)} committed checkpoints can be restored "
                f"(the newest: {skipped[0].error})"
            )
        if skipped:
            raise TitanError(f"--resume: {skipped[0].error}")
        return None

    def uncommitted(self) -> list[Unrestorable]:
        """The step folders without ``meta``: no save of this run leaves one (orbax renames a
        whole folder), so a copy of the run dir cut short, or a delete cut short, did."""
        steps = sorted(s for s in self._manager.all_steps() if not self._is_committed(s))
        reason = "no meta: a copy or a delete of it was cut short"
        return [Unrestorable(step, f"{self.path(step)} holds {reason}") for step in steps]

    def restore_params_newest(self, trainer: Trainer) -> tuple[list[Any], int, list[Unrestorable]]:
        """:meth:`restore_params` of the newest committed checkpoint that can be read, newest
        first (``titan generate`` and ``--init-from`` of a run dir).

        Returns:
            (one parameter tree per chunk of ``trainer``, the step read, the newer checkpoints
            that could not be read; nothing on disk changes).

        Raises:
            TitanError: there is no committed checkpoint, or none can be read (names the
                checkpoints' folder and the newest one's error).
        """
        return self.read_newest(lambda step: self.restore_params(step, trainer))

    def check_committed(self, step: int | None) -> None:
        """Refuse to read ``step`` (None: the newest) where it is not committed.

        Raises:
            TitanError: no committed checkpoint at all, or none of ``step`` (names the steps
                there are).
        """
        steps = self.committed_steps()
        if not steps:
            raise TitanError(f"{self.directory.parent}: no committed checkpoint")
        if step is not None and step not in steps:
            raise TitanError(
                f"--step {step}: {self.directory.parent} has no checkpoint of it "
                f"(it has: {', '.join(map(str, steps))})"
            )

    def read_params(
        self, step: int | None, trainer: Trainer
    ) -> tuple[list[Any], int, list[Unrestorable]]:
        """(the parameters of checkpoint ``step`` (:meth:`restore_params`), or of the newest
        that can be read (None, :meth:`restore_params_newest`), the step read, the newer
        checkpoints that could not be read).

        Raises:
            TitanError: as :meth:`restore_params` or :meth:`restore_params_newest`.
        """
        if step is None:
            return self.restore_params_newest(trainer)
        return self.restore_params(step, trainer), step, []

    def read_newest(self, read: Callable[[int], T]) -> tuple[T, int, list[Unrestorable]]:
        """``read(step)`` of the newest committed checkpoint that it reads, newest first.

        Returns:
            (what ``read`` returned, the step read, the newer checkpoints that could not be
            read).

        Raises:
            TitanError: there is no committed checkpoint, or none can be read (names the
                checkpoints' folder and the newest one's error).
        """
        done, skipped = self._newest_readable(lambda step: (read(step), step))
        if done is not None:
            return *done, skipped
        if not skipped:
            raise TitanError(f"{self.directory}: no committed checkpoint")
        raise TitanError(
            f"{self.directory}: none of the {len(skipped)} committed checkpoints can be read "
            f"(the newest: {skipped[0].error})"
        )

    def _newest_readable(self, read: Callable[[int], T]) -> tuple[T | None, list[Unrestorable]]:
        """(``read(step)`` of the newest committed checkpoint it reads, None when it reads
        none; the newer checkpoints it could not read, each with its error in one line).

        The folder is listed afresh before each try: a run still training (``titan generate``
        of a live run) commits new checkpoints and deletes old ones meanwhile. A checkpoint
        deleted while it was read is not unreadable: the newest one committed then is read
        instead, up to :data:`VANISHED_TRIES` times (then it counts as unreadable)."""
        skipped: list[Unrestorable] = []
        vanished = 0
        while steps := [s for s in self._listed_steps() if s not in {u.step for u in skipped}]:
            step = steps[-1]
            try:
                return read(step), skipped
            except Exception as err:  # noqa: BLE001 - a corrupt checkpoint: try the previous
                if not self._is_committed(step) and (vanished := vanished + 1) < VANISHED_TRIES:
                    continue
                message = str(err) if isinstance(err, TitanError) else self._unreadable(step, err)
                skipped.append(Unrestorable(step, message.splitlines()[0]))
        return None, skipped

    def _listed_steps(self) -> list[int]:
        """:meth:`committed_steps` of the folder as it is now (orbax's manager lists it once,
        when made, and then knows only its own saves). A checkpoint deleted while orbax lists
        the folder (its files stat-ed after its name was found) makes it list again, up to
        :data:`VANISHED_TRIES` times; then the last listing, less what is gone, is used."""
        for _ in range(VANISHED_TRIES):
            try:
                self._manager.reload()
                break
            except FileNotFoundError:
                continue
        return self.committed_steps()

    def restore(self, step: int, trainer: Trainer) -> tuple[TrainState, dict[str, Any]]:
        """Restore checkpoint ``step`` into ``trainer``'s layout (resharding as needed).

        Returns:
            (train state, meta).

        Raises:
            TitanError: the checkpoint cannot be mapped onto the trainer's model (names both
                layouts).
        """
        items, meta = self._restore_onto(step, trainer, trainer.abstract_items, partial=False)
        return TrainState.from_items(items, step), meta

    def restore_params(self, step: int, trainer: Trainer) -> list[Any]:
        """The parameters of checkpoint ``step`` on ``trainer``'s chunks (resharded as needed),
        without reading its optimizer state: orbax's partial restore reads only the arrays of
        ``params``, a third of the bytes under AdamW (whose two moments are each the
        parameters' size).

        Returns:
            One parameter tree per chunk of ``trainer``, in model order, placed in its
            shardings.

        Raises:
            TitanError: the checkpoint cannot be read (names it and its folder: a truncated or
                garbled file, or parameters unlike their saved digest) or mapped onto the
                trainer's model.
        """
        try:
            abstract = params_only(trainer.abstract_items)
            items, _ = self._restore_onto(step, trainer, abstract, partial=True)
        except TitanError:
            raise
        except Exception as err:  # noqa: BLE001 - tensorstore's DATA_LOSS, orbax's wrap of it
            raise TitanError(self._unreadable(step, err)) from None
        return [items[chunk_item(c.index)]["params"] for c in trainer.chunks]

    def _restore_onto(
        self, step: int, trainer: Trainer, abstract: Callable[..., dict[str, Any]], partial: bool
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the items of checkpoint ``step`` placed like ``abstract()``, its meta):
        ``abstract`` is ``trainer.abstract_items`` or a part of each item (``partial``)."""
        meta = self._meta(step)
        current = trainer.describe().to_json()  # compared with the meta's JSON
        try:
            if meta["layout"]["chunks"] == current["chunks"]:
                items = self._restore_items(step, meta, abstract(), partial)
                # a whole state is checked on its devices (titan.trainer.saver.digest_check);
                # several processes' sums would need unsigned collectives, which gloo lacks
                if partial and jax.process_count() == 1:
                    _check_as_read(step, meta, items, trainer.chunks, partial)
            else:  # checked as written, before the cut
                saved, saved_chunks, _ = self.restore_host(step, abstract, partial)
                adapter = trainer.adapter
                items = reshard_items(saved, saved_chunks, abstract(), trainer.chunks, adapter)
        except CheckpointDamaged as err:  # damaged whatever the layouts
            raise TitanError(self._unreadable(step, err)) from None
        except (ValueError, KeyError, TitanError) as err:
            written, target = _layout_name(meta["layout"]), _layout_name(current)
            if written == target:
                raise TitanError(self._unreadable(step, err)) from None
            raise TitanError(
                f"checkpoint {step} written by {written} cannot be restored onto {target}: "
                f"{first_line(err)}"
            ) from None
        return items, meta

    def set_aside(self, steps: list[int]) -> None:
        """Move the unrestorable checkpoints newer than the restored one to
        ``<run dir>/unrestorable_checkpoints/<step>``, with their stage items (its
        ``stage_checkpoints``), kept for inspection; the run saves those steps again. Process
        0 moves them; every process then re-reads the steps."""
        if not steps:
            return
        if ocp.multihost.process_index() == 0:
            aside = self.directory.parent / UNRESTORABLE_DIR
            aside.mkdir(exist_ok=True)
            for step in steps:
                target = aside / str(step)
                suffix = 1
                while target.exists():
                    target, suffix = aside / f"{step}.{suffix}", suffix + 1
                self.path(step).rename(target)
                self._stages.move(step, target / STAGE_CHECKPOINT_DIR)
        ocp.multihost.sync_global_processes("titan:unrestorable-set-aside")
        self._manager.reload()

    def _restore_items(
        self, step: int, meta: dict[str, Any], abstract: dict[str, Any], partial: bool = False
    ) -> dict[str, Any]:
        """Items ``abstract`` names of checkpoint ``step``, placed like it; ``partial``: it holds
        part of each item (orbax then reads only that part; stage items are read leaf by leaf
        anyway)."""
        kept = set(meta.get("stage_items", []))
        items = {name: self._stages.restore(step, name, abstract[name]) for name in kept}
        args = {
            name: _restore_args(tree, partial)
            for name, tree in abstract.items()
            if name not in kept
        }
        for name in args:  # orbax would cast each array to the target's dtype (partial too)
            item = self.path(step) / name
            if partial:  # the arrays read only: the others may be absent
                saved = _saved_dtypes(item, _leaf_dtypes(abstract[name]))
            else:
                metadata = ocp.StandardCheckpointHandler().metadata(item)
                saved = {leaf.name: leaf.dtype for leaf in jax.tree.leaves(metadata)}
            self._check_dtypes(step, name, abstract[name], saved)
        if args:
            items.update(self._manager.restore(step, args=ocp.args.Composite(**args)))
        return items

    def _check_dtypes(self, step: int, name: str, abstract: Any, saved: dict[str, Any]) -> None:
        """:func:`titan.checkpoint.stage_store.check_dtype` for each leaf of orbax item ``name``
        (``saved``: its saved dtypes by orbax's leaf names)."""
        for leaf_name, dtype in _leaf_dtypes(abstract).items():
            if leaf_name in saved:
                check_dtype(step, name, leaf_name, saved[leaf_name], dtype)

    def restore_host(
        self,
        step: int,
        abstract: Callable[[list[Chunk], DeviceMesh], dict[str, Any]],
        partial: bool = False,
    ) -> tuple[dict[str, Any], list[Chunk], dict[str, Any]]:
        """Read checkpoint ``step`` as written, into this process's host memory.

        Args:
            abstract: (the checkpoint's chunks, the host mesh) -> their items as
                ``jax.ShapeDtypeStruct`` trees (:meth:`Trainer.abstract_items`).
            partial: ``abstract`` holds part of each item (its ``params``): only that is read.

        Returns:
            (``chunk_<c>`` -> host state, the checkpoint's chunks, its meta).

        Raises:
            TitanError: the checkpoint cannot be read (corrupt metadata or arrays).
            CheckpointDamaged: what was read does not match the digests saved in its meta
                (:func:`_check_as_read`).
        """
        try:
            meta = self._meta(step)
            saved_chunks = chunks_from_ranges(meta["layout"]["chunks"])
            items = self._restore_items(step, meta, abstract(saved_chunks, host_mesh()), partial)
            _check_as_read(step, meta, items, saved_chunks, partial)
        except TitanError:
            raise
        except Exception as err:  # noqa: BLE001 - tensorstore's DATA_LOSS, a hand-edited meta
            raise TitanError(self._unreadable(step, err)) from None
        return items, saved_chunks, meta

    def _unreadable(self, step: int, err: Exception) -> str:
        """Why checkpoint ``step`` cannot be read, in one line: Titan's own message, else the
        error at the root of ``err`` (tensorstore's names the array and the file)."""
        why = first_line(err) if isinstance(err, TitanError) else error_line(root_cause(err))
        return f"checkpoint {step} ({self.path(step)}) cannot be read: {why}"

    def _milestone(self, step: int) -> bool:
        """Whether checkpoint ``step`` was saved as a multiple of ``--checkpoint-keep-every``
        (its meta's :data:`MILESTONE`): kept for ever, also after a resume changed the option.
        A meta that cannot be read counts as one: in doubt a checkpoint is kept, and every
        process keeps it (a delete is collective)."""
        try:
            return self._meta(step).get(MILESTONE, False) is not False
        except TitanError:
            return True

    def _meta(self, step: int) -> dict[str, Any]:
        """The ``meta`` item of checkpoint ``step``, orbax's ``JsonSave`` file read through
        :func:`titan.reading.read_json`."""
        return read_json(self.path(step) / "meta" / "metadata", f"checkpoint {step}")

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def close(self) -> None:
        """Wait for a save still in flight (its outcome is dropped: after a crash nothing records
        it) and close orbax's manager."""
        self._settle()
        self._manager.close()


def _check_as_read(
    step: int, meta: dict[str, Any], items: dict[str, Any], chunks: list[Chunk], partial: bool
) -> None:
    """Checkpoint ``step``'s ``items`` as read (whole chunks, or their ``params`` alone:
    ``partial``) against the digests saved in its ``meta``
    (:func:`titan.checkpoint.finite_check.check_digests`); none saved (an older checkpoint, or
    one of several processes): nothing is compared.

    Raises:
        CheckpointDamaged: a chunk, or its parameters, do not match (names them).
    """
    if (PARAMS_DIGESTS if partial else DIGESTS) in meta:
        read = [items[chunk_item(c.index)] for c in chunks]
        check_digests(step, meta, read_digests(read, partial))


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
