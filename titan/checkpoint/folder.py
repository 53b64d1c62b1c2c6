"""A run's checkpoints folder as orbax's manager sees it: its steps, which of them are committed,
each one's ``meta``, and the stage items beside it (:mod:`titan.checkpoint.stage_store`).

Saving (:mod:`titan.checkpoint.saving`), restoring (:mod:`titan.checkpoint.restoring`) and
retention (:mod:`titan.checkpoint.retention`) share one :class:`CheckpointFolder`. Making one
also quiets orbax's echoes of a failure that Titan says itself, in one line
(:func:`_quiet_echoes`).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from titan.checkpoint.stage_store import StageStore
from titan.out_paths import CHECKPOINT_DIR
from titan.reading import read_json

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


class CheckpointFolder:
    """The checkpoints of a run: ``<run dir>/checkpoints/<step>/`` (orbax's items and ``meta``)
    and ``<run dir>/stage_checkpoints/<step>/`` (:class:`titan.checkpoint.stage_store.StageStore`).

    Args:
        run_dir: the run dir (the folder is created when missing).
        asynchronous: orbax's manager saves in a background thread (``--checkpoint-async``).

    Attributes:
        directory: ``<run dir>/checkpoints``, absolute.
        manager: orbax's ``CheckpointManager`` of ``directory`` (no retention of its own).
        stages: the stage items of the run.
    """

    def __init__(self, run_dir: Path, asynchronous: bool) -> None:
        logging.getLogger("absl").setLevel(logging.WARNING)
        _quiet_echoes()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=asynchronous
        )
        self.directory = (Path(run_dir) / CHECKPOINT_DIR).absolute()
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.stages = StageStore(run_dir)

    def committed_steps(self) -> list[int]:
        """Steps of the committed checkpoints, oldest first. A step directory without the
        ``meta`` item (made by hand, or left by something other than a finished save) is not a
        checkpoint and is skipped."""
        return sorted(s for s in self.manager.all_steps() if self.is_committed(s))

    def latest_step(self) -> int | None:
        """Step of the newest committed checkpoint, or None."""
        return max(self.committed_steps(), default=None)

    def is_committed(self, step: int) -> bool:
        """Whether checkpoint ``step`` is committed: its folder holds ``meta``."""
        return (self.path(step) / "meta").is_dir()

    def meta(self, step: int) -> dict[str, Any]:
        """The ``meta`` item of checkpoint ``step``, orbax's ``JsonSave`` file read through
        :func:`titan.reading.read_json`.

        Raises:
            TitanError: it cannot be read (names the checkpoint).
        """
        return read_json(self.path(step) / "meta" / "metadata", f"checkpoint {step}")

    def path(self, step: int) -> Path:
        """The folder of checkpoint ``step``."""
        return self.directory / str(step)
