"""Saving checkpoints: one save after the other, each through the phases of
:mod:`titan.checkpoint.protocol`, synchronous or in a background thread, and when the loop saves.

A save writes this process's stage items (:mod:`titan.checkpoint.stage_store`), waits for every
process's, and commits the other items and ``meta`` through orbax. Asynchronous saves
(``--checkpoint-async``) return once the state is copied to host memory or, with one process and
room on its devices, once a copy on the devices is dispatched (:mod:`titan.checkpoint.snapshot`);
a background thread (:class:`_PendingSave`) writes and commits. A save first settles the one
before it; once every process has seen that one committed, retention prunes
(:class:`titan.checkpoint.retention.Retention`). :class:`SaveResult` says how each save ended.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import orbax.checkpoint as ocp

from titan.checkpoint.folder import CheckpointFolder
from titan.checkpoint.protocol import fault_point, seen_everywhere, written_everywhere
from titan.checkpoint.retention import MILESTONE, Retention
from titan.checkpoint.snapshot import device_snapshot, snapshot_fits
from titan.errors import TitanError, error_line
from titan.layouts.contract import TrainState
from titan.parallel.distributed import barrier, process_count
from titan.telemetry.records import DISK_FULL, disk_full


@dataclass(frozen=True)
class SaveResult:
    """How one save ended.

    Attributes:
        step: the step saved.
        blocking_s: seconds the training loop waited in :meth:`SaveSequence.save` (and, for
            the last save, in :meth:`SaveSequence.wait`): the previous save settling, then
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


def _save_error(err: BaseException) -> str:
    """Why a save failed, one line: :func:`titan.telemetry.records.disk_full`'s line for a
    full disk (:attr:`SaveResult.disk_full`), else the error's first line."""
    return disk_full(err) or error_line(err)


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


class SaveSequence:
    """A run's saves, one after the other: each settles the one before it, and what retention
    drops goes once every process has seen a save committed.

    Args:
        folder: the run's checkpoints.
        retention: what the run keeps of them.
        asynchronous: write in a background thread (``--checkpoint-async``).
    """

    def __init__(self, folder: CheckpointFolder, retention: Retention, asynchronous: bool) -> None:
        self._folder, self._retention, self.asynchronous = folder, retention, asynchronous
        self._pending: _PendingSave | None = None
        self._settled: SaveResult | None = None  # the last save settled, not yet concluded
        self._saved = False  # whether this sequence has saved yet
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
            _consume_failed_save(self._folder.manager)  # an earlier failure, already recorded
            try:
                self._folder.manager.save(step, args=composite, force=True)
            except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
                self._finish_orbax_save(step)
                return _save_error(err)
            return self._finish_orbax_save(step)

        def prune() -> None:  # the new checkpoint is committed: older ones may go
            self._retention.prune(step, self._retention.doomed(step))

        self._pending = _PendingSave(write, step, begun, time.perf_counter() - start, prune)
        return []

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
        meta = {**meta, MILESTONE: self._retention.is_milestone(state.step)}
        if not self._saved:  # what an earlier run's failed or killed saves left
            self._retention.remove_leftovers(None)
            barrier("titan:checkpoint-leftovers")
            self._saved = True
        step, items = state.step, state.items()
        if self._snapshots and snapshot_fits(items):
            return [*settled, *self._save_snapshot(step, device_snapshot(items), meta, start)]
        fault_point("write", step)
        try:  # now, whatever the mode
            stage_items, error = self._folder.stages.save(step, items), None
        except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
            stage_items, error = [], _save_error(err)
        if not written_everywhere(step, error is None):  # before the commit
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
            self._folder.manager.save(step, args=composite, force=True)
        except Exception as err:  # noqa: BLE001 - a failed save is a result, not a crash
            self._finish_orbax_save(step)
            elapsed = time.perf_counter() - start
            return [*settled, self._settle_as(SaveResult(step, elapsed, elapsed, _save_error(err)))]
        if self.asynchronous:
            finish = functools.partial(self._finish_orbax_save, step)
            self._pending = _PendingSave(finish, step, save_start, time.perf_counter() - start)
            return settled
        error = self._finish_orbax_save(step)
        result = self._settle_as(SaveResult(step, 0.0, time.perf_counter() - save_start, error))
        self._conclude()  # the loop waits for the pruning too
        return [*settled, replace(result, blocking_s=time.perf_counter() - start)]

    def _finish_orbax_save(self, step: int) -> str | None:
        """Wait for orbax's save of ``step`` to finish (on the calling thread). Returns None when
        it committed, else why not."""
        try:
            self._folder.manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - reported in the result
            return _save_error(err)
        if not self._folder.is_committed(step):
            return f"checkpoint {step} was not committed (no {self._folder.path(step) / 'meta'})"
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
        _consume_failed_save(self._folder.manager)
        return [self._settle_as(result, pruned=pending.prunes)]

    def _settle_as(self, result: SaveResult, pruned: bool = False) -> SaveResult:
        """Hold ``result`` for :meth:`_conclude` (unless its own thread ``pruned`` already); a
        failed save's leftovers go at once when this is the only process (nobody else may
        still write them)."""
        self._settled = None if pruned else result
        if result.error is not None and process_count() == 1:
            self._retention.remove_leftovers(result.step)
        return result

    def _conclude(self) -> None:
        """The ``seen`` and ``prune`` phases after the save settled last, if it committed:
        every process has seen it (a barrier), then process 0 prunes up to its step."""
        result, self._settled = self._settled, None
        if result is None or result.error is not None:
            return
        # Listed before the barrier: past it, process 0 may already be deleting some.
        doomed = self._retention.doomed(result.step)
        seen_everywhere(result.step)
        self._retention.prune(result.step, doomed)
