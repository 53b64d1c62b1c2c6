"""The health of the training as a hook: ``loss_spike`` events (:class:`titan.trainer.guard.
LossSpikeDetector`) and ``--nonfinite`` (:class:`titan.trainer.guard.NonFiniteGuard`) on each
step read."""

from __future__ import annotations

from titan.telemetry.events import Step
from titan.telemetry.records import RunRecord
from titan.trainer.guard import LossSpikeDetector, NonFiniteGuard
from titan.trainer.hooks import Hook, Reading


class HealthHook(Hook):
    """Records the loss spikes ``spikes`` finds (``--loss-spike-window``, ``--loss-spike-sigma``)
    and applies ``guard`` (``--nonfinite``, ``--nonfinite-patience``) to each step read.

    Raises (from ``on_metrics``):
        NonFiniteAbort: ``--nonfinite abort``, or too many non-finite steps in a row.
    """

    def __init__(self, spikes: LossSpikeDetector, guard: NonFiniteGuard, record: RunRecord) -> None:
        self.spikes = spikes
        self.guard = guard
        self.record = record

    def on_metrics(self, event: Step, reading: Reading) -> None:
        spike = self.spikes.observe(reading.step, reading.values["loss"])
        if spike is not None:
            self.record.emit(spike)
        self.guard.check(reading.step, reading.finite, reading.nonfinite)
