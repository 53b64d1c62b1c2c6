"""Repeated compilations as a hook: the ``compile`` events of functions compiled again during
the loop (:class:`titan.trainer.compilation.CompileWatch`), recorded after each step."""

from __future__ import annotations

from titan.layouts.contract import TrainState
from titan.telemetry.records import RunRecord
from titan.trainer.compilation import CompileWatch
from titan.trainer.hooks import Hook, LoopControl


class CompileHook(Hook):
    """Records the events that ``compiles`` collected since the last step."""

    def __init__(self, compiles: CompileWatch, record: RunRecord) -> None:
        self.compiles = compiles
        self.record = record

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        for event in self.compiles.drain():
            self.record.emit(event)
