"""``--eval-every`` as a hook: the ``eval`` event of the held-out data after every N steps
(:class:`titan.trainer.evaluation.Evaluation`), in no step's time."""

from __future__ import annotations

from titan.layouts.contract import TrainState
from titan.telemetry.records import RunRecord
from titan.trainer.evaluation import Evaluation
from titan.trainer.hooks import Hook, LoopControl
from titan.trainer.progress import TrainProgress


class EvalHook(Hook):
    """Evaluates the state after a step (registered with ``every=--eval-every``): its ``step``
    event first, then the ``eval`` event; the next step's time starts after it."""

    def __init__(self, evaluation: Evaluation, record: RunRecord, progress: TrainProgress) -> None:
        self.evaluation = evaluation
        self.record = record
        self.progress = progress

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        loop.flush_metrics()
        loop.phase("eval", step)
        self.progress.eval(self.record.emit(self.evaluation.run(state, step)))
        loop.restart_clock()
