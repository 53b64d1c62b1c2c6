"""``--checkpoint-pin-host`` as a hook: the pinned host memory that saves copy into, reserved
once after the run's first step (:func:`titan.checkpoint.pinned_host.reserve_host`), in no step's
time.

After the first step, not before it: the first step shows that the compiled program runs (its
loss, its memory) without waiting for the reservation (about 15 s for 18 GB on one H200), and a
run that fails there fails before paying for it. The first save comes after it, and the loop's
steps overlap that save at their speed.
"""

from __future__ import annotations

import sys
from typing import Any

from titan.checkpoint.pinned_host import reserve_host
from titan.inert import inert
from titan.layouts.contract import TrainState
from titan.stopping import StopFlag
from titan.telemetry.events import PinnedHost
from titan.telemetry.records import RunRecord
from titan.trainer.hooks import Hook, LoopControl
from titan.trainer.progress import TrainProgress

RESERVING = "reserving pinned host memory for checkpoints"


class PinHostHook(Hook):
    """Reserves the pinned host memory of the saves of ``items`` after the first step the loop
    runs: that step's ``step`` event first, then the ``pinned_host`` event; the next step's time
    and energy start after it. Registered after the profiler's hook (a trace of that step closes
    first) and before the checkpoint hook (it precedes a save of that step). Nothing is reserved
    once a stop signal has come: the loop stops after this step, and its last save is waited for
    anyway.

    Args:
        items: the trainer's checkpoint items, abstract (``Trainer.abstract_items()``).
        record: where the ``pinned_host`` event goes.
        progress: says that the reservation is under way.
        stop: the run's stop flag: a stop signal ends the reservation between two shards.
    """

    def __init__(
        self, items: dict[str, Any], record: RunRecord, progress: TrainProgress, stop: StopFlag
    ) -> None:
        self.items: dict[str, Any] | None = items
        self.record = record
        self.progress = progress
        self.stop = stop

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        if self.items is None:
            return
        items, self.items = self.items, None
        if self.stop.requested:
            return
        loop.flush_metrics()
        loop.phase("checkpoint_save", step)
        with self.progress.status(RESERVING):
            _record_reserve(reserve_host(items, stopped=lambda: self.stop.requested), self.record)
        loop.restart_clock()


def _record_reserve(reserved: PinnedHost | None, record: RunRecord) -> None:
    """Record the reservation of pinned host memory; a failed one is also said, in one line."""
    if reserved is None:
        return
    record.emit(reserved)
    if reserved.error:
        print(
            f"titan: reserving {reserved.bytes / 1e9:.1f} GB of pinned host memory for "
            f"checkpoints failed ({inert(reserved.error)}); the first save will take it, "
            "holding the steps back",
            file=sys.stderr,
        )
