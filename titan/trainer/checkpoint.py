"""Checkpoints: orbax saves of the train state plus the loader position and the layout.

Each checkpoint ``<run dir>/checkpoints/<step>/`` holds ``state`` (parameters, optimizer state,
step; orbax ``StandardSave``) and ``meta`` (JSON: data position, layout, model shape). Orbax
writes into a temporary folder and renames it on commit, so a crash mid-save leaves the previous
checkpoint as the latest one. Restoring onto abstract arrays that carry shardings reshards, so
a run may resume under another SPMD mesh.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"
KEEP = 3


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
        """Step of the newest committed checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> float:
        """Save ``state`` and ``meta`` as checkpoint ``step``. Returns seconds spent."""
        start = time.perf_counter()
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self._manager.wait_until_finished()
        return time.perf_counter() - start

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restore checkpoint ``step`` into the shardings carried by ``abstract_state``.

        Returns:
            (state, meta).
        """
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            ),
        )
        return restored.state, restored.meta

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def close(self) -> None:
        self._manager.close()
