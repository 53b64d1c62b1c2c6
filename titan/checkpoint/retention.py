"""Retention: which committed checkpoints a run keeps, and the deletion of the others and of the
leftovers of saves that never committed.

A run keeps the ``--checkpoint-keep`` newest committed checkpoints and every step that is a
multiple of ``--checkpoint-keep-every`` (:func:`steps_to_prune`); a checkpoint saved as such a
multiple is marked in its meta (:data:`MILESTONE`) and kept for ever. When pruning runs, and on
which processes, is the save's (:mod:`titan.checkpoint.protocol`, :mod:`titan.checkpoint.saving`).
"""

from __future__ import annotations

import shutil
import sys

from titan.checkpoint.folder import CheckpointFolder
from titan.checkpoint.protocol import leftovers
from titan.errors import TitanError, error_line
from titan.inert import inert
from titan.parallel.distributed import process_index

MILESTONE = "milestone"
"""The meta field that marks a checkpoint saved at a multiple of ``--checkpoint-keep-every``:
pruning never deletes it (:meth:`Retention.prune`), whatever the option is later."""


def steps_to_prune(committed: list[int], keep: int, keep_every: int) -> list[int]:
    """The committed steps to delete: all but the ``keep`` newest and (``keep_every`` > 0)
    the multiples of ``keep_every``, oldest first."""
    newest = set(sorted(committed)[-keep:])
    return [
        s for s in sorted(committed) if s not in newest and not (keep_every and s % keep_every == 0)
    ]


class Retention:
    """What a run keeps of its checkpoints, and the deletion of the rest.

    Args:
        folder: the run's checkpoints.
        keep: how many of the newest committed checkpoints to keep (``--checkpoint-keep``).
        keep_every: also keep every step that is a multiple of this, forever (0: none;
            ``--checkpoint-keep-every``).
    """

    def __init__(self, folder: CheckpointFolder, keep: int, keep_every: int) -> None:
        self.folder, self.keep, self.keep_every = folder, keep, keep_every
        self._undeletable: set[int] = set()  # steps whose deletion failed, told once each

    def is_milestone(self, step: int) -> bool:
        """Whether a save of ``step`` is a milestone (its meta's :data:`MILESTONE`): a multiple
        of ``keep_every``."""
        return bool(self.keep_every and step % self.keep_every == 0)

    def doomed(self, upto: int) -> list[int]:
        """The committed steps up to ``upto`` that retention deletes: :func:`steps_to_prune`'s,
        less the milestones (:meth:`_saved_as_milestone`)."""
        committed = [s for s in self.folder.committed_steps() if s <= upto]
        pruned = steps_to_prune(committed, self.keep, self.keep_every)
        return [step for step in pruned if not self._saved_as_milestone(step)]

    def prune(self, upto: int, doomed: list[int]) -> None:
        """Delete the ``doomed`` steps (:meth:`doomed`, listed up to ``upto`` before the
        processes met: the same list on every process, as orbax's delete is collective; its
        folder goes first, which uncommits the step, then its stage items), and the leftovers
        of saves up to ``upto`` that never committed. A failure is one line on stderr (once
        per step), never the save's, and stops no other deletion: a later pruning tries the
        step again."""
        for step in doomed:
            try:
                self.folder.manager.delete(step)
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
            for folder in leftovers(self.folder.directory.iterdir(), upto, None):
                shutil.rmtree(folder, ignore_errors=True)
        self.folder.stages.prune(self.folder.committed_steps(), upto)

    def _saved_as_milestone(self, step: int) -> bool:
        """Whether checkpoint ``step`` was saved as a multiple of ``--checkpoint-keep-every``
        (its meta's :data:`MILESTONE`): kept for ever, also after a resume changed the option.
        A meta that cannot be read counts as one: in doubt a checkpoint is kept, and every
        process keeps it (a delete is collective)."""
        try:
            return self.folder.meta(step).get(MILESTONE, False) is not False
        except TitanError:
            return True
