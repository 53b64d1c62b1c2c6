"""Saving the run's state from the loop: the ``checkpoint`` and ``checkpoint_failed`` events of
each save, and the refusal to save non-finite weights (:class:`titan.checkpoint.finite_check.
FiniteCheck`). :class:`titan.checkpoint.checkpointer.Checkpointer` does the saving."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from titan.checkpoint.checkpointer import Checkpointer, SaveResult, SaveSchedule
from titan.checkpoint.finite_check import FiniteCheck, check_digests
from titan.data.images import ImageBatches
from titan.data.mixture import Batches
from titan.inert import inert
from titan.layouts.contract import Trainer, TrainState
from titan.telemetry.events import Checkpoint, CheckpointFailed
from titan.telemetry.records import DiskFull, RunRecord
from titan.trainer.guard import NonFiniteAbort


def digest_check(
    finite_check: FiniteCheck, trainer: Trainer
) -> Callable[[int, TrainState, dict[str, Any]], None]:
    """The check of a checkpoint restored onto the same layout against the digests saved in
    its meta (:func:`titan.checkpoint.finite_check.check_digests`): a file that changed after
    the save (a flipped bit on disk, a hand edit) restores values that do not match, and the
    checkpoint counts as unrestorable (the one before it is tried). Onto another layout the
    checkpoint's chunks are checked as read, before they are cut
    (:meth:`titan.checkpoint.checkpointer.Checkpointer.restore`); with several processes no digest
    is taken.

    Raises (the returned function):
        TitanError: a chunk's digest differs from the saved one (names the checkpoint and the
            chunk).
    """

    def check(step: int, state: TrainState, meta: dict[str, Any]) -> None:
        if meta["layout"]["chunks"] != trainer.describe().to_json()["chunks"]:
            return
        restored = finite_check.digests(state)
        if restored is not None:
            check_digests(step, meta, restored)

    return check


class FinalSaveFailed(Exception):
    """The run's newest state, saved at its end (completed or stopped), was not committed: the
    run fails (``run_end`` ``failed``, exit 1) rather than report an end that a resume cannot
    start from.

    Args:
        step: the step of the state that was saved.
        latest: the newest committed checkpoint's step (None: none).
        error: why the save failed (its ``checkpoint_failed`` error).
    """

    def __init__(self, step: int, latest: int | None, error: str) -> None:
        kept = "none (a resume starts from step 0)" if latest is None else f"step {latest}"
        super().__init__(
            f"the checkpoint of step {step}, the run's last, failed ({error}); the last "
            f"committed checkpoint is {kept}"
        )


class Saver:
    """Saves of the run's state and their records.

    Args:
        checkpointer: the run's checkpoints.
        schedule: when the loop saves (``--checkpoint-every``, ``--checkpoint-every-s``).
        record: where the saves' events go.
        trainer: the run's trainer (its layout goes in each save's meta).
        batches: the run's batches (their count goes in each save's meta).
        phase: enters a watchdog phase of a step (:meth:`titan.trainer.hooks.Hooks.on_phase`).
        finite_check: the check of the weights before a save (shared with the restore's
            :func:`digest_check`; a fresh one by default).
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        schedule: SaveSchedule,
        record: RunRecord,
        trainer: Trainer,
        batches: Batches | ImageBatches,
        phase: Callable[[str, int], None],
        finite_check: FiniteCheck | None = None,
    ) -> None:
        self.checkpointer = checkpointer
        self.schedule = schedule
        self.record = record
        self.trainer = trainer
        self.batches = batches
        self.phase = phase
        self.finite_check = finite_check or FiniteCheck()
        self.saved_step: int | None = None  # the step of the newest state saved or restored
        self.errors: dict[int, str] = {}  # the failed saves' errors by step

    def save(self, state: TrainState, position: int) -> None:
        """Save ``state`` with the data position after its step (``position``), unless its
        weights are not finite.

        Raises:
            NonFiniteAbort: a parameter or optimizer moment is not finite (nothing is written).
            DiskFull: a save found the disk full (:meth:`record_saves`).
        """
        step = state.step
        self.phase("checkpoint_save", step)
        finite, digests, recompiled = self.finite_check(state)
        for event in recompiled:
            self.record.emit(event)
        if not finite:
            raise NonFiniteAbort(step, f"step {step}: non-finite weights (nothing saved)")
        meta = {
            "data_position": position,
            "num_sequences": self.batches.num_sequences,
            "data_digest": self.batches.data_digest,
            "layout": self.trainer.describe().to_json(),
            **(digests or {}),  # one process: finite_check.DIGESTS, finite_check.PARAMS_DIGESTS
        }
        self.record_saves(self.checkpointer.save(state, meta))
        self.schedule.restart()
        self.saved_step = step

    def record_settled(self) -> None:
        """Record the saves that settled since the last call (:meth:`record_saves`)."""
        self.record_saves(self.checkpointer.results())

    def wait(self) -> None:
        """Wait for a save in flight and record it (:meth:`record_saves`)."""
        self.record_saves(self.checkpointer.wait())

    def check_committed(self, step: int) -> None:
        """Check that the run's last state, of ``step``, is committed (after :meth:`wait`).

        Raises:
            FinalSaveFailed: the newest committed checkpoint is not ``step``'s.
        """
        latest = self.checkpointer.latest_step()
        if latest != step:
            raise FinalSaveFailed(step, latest, self.errors.get(step, "not committed"))

    def record_saves(self, results: list[SaveResult]) -> None:
        """A ``checkpoint`` event per committed save, a ``checkpoint_failed`` event and a line
        on stderr per failed one.

        Raises:
            DiskFull: a save found the disk full (after its ``checkpoint_failed`` event): the
                run ends, with one line.
        """
        for r in results:
            if r.error is None:
                path = str(self.checkpointer.path(r.step))
                asynchronous = self.checkpointer.asynchronous or None
                self.record.emit(
                    Checkpoint(
                        step=r.step,
                        seconds=r.blocking_s,
                        commit_s=r.commit_s,
                        asynchronous=asynchronous,
                        path=path,
                    )
                )
                continue
            self.errors[r.step] = r.error
            self.record.emit(
                CheckpointFailed(
                    step=r.step, error=r.error, seconds=r.blocking_s, commit_s=r.commit_s
                )
            )
            if r.disk_full:
                raise DiskFull(r.error)
            print(
                f"titan: checkpoint {r.step} failed and is not committed: {inert(r.error)}",
                file=sys.stderr,
                flush=True,
            )
