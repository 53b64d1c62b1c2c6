"""Checkpoints as hooks: the outcome of each asynchronous save once it settles
(:class:`SettledSavesHook`), and the saves that ``--checkpoint-every`` and
``--checkpoint-every-s`` ask for (:class:`CheckpointHook`)."""

from __future__ import annotations

from titan.layouts.contract import TrainState
from titan.trainer.hooks import Hook, LoopControl
from titan.trainer.saver import Saver


class SettledSavesHook(Hook):
    """Records, after each step, the saves that settled meanwhile."""

    def __init__(self, saver: Saver) -> None:
        self.saver = saver

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        self.saver.record_settled()


class CheckpointHook(Hook):
    """Saves the newest state when the saver's schedule says so, after its ``step`` event (a
    non-finite abort raises there, before the save)."""

    def __init__(self, saver: Saver) -> None:
        self.saver = saver

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        if self.saver.schedule.due(step):
            loop.flush_metrics()
            loop.save_newest()
