"""The health of the training as a hook: ``loss_spike`` events (:class:`titan.trainer.guard.
LossSpikeDetector`) and ``--nonfinite`` (:class:`titan.trainer.guard.NonFiniteGuard`) on each
step read."""

from __future__ import annotations

from titan.config import TrainConfig
from titan.telemetry.events import Step
from titan.telemetry.records import RunRecord
from titan.trainer.guard import LossSpikeDetector, NonFiniteGuard
from titan.trainer.hooks import Hook, Reading


class HealthHook(Hook):
    """Records loss spikes and applies ``--nonfinite`` to each step read.

    Raises (from ``on_metrics``):
        NonFiniteAbort: ``--nonfinite abort``, or too many non-finite steps in a row.
    """

    def __init__(self, cfg: TrainConfig, record: RunRecord) -> None:
        obs, opt = cfg.observability, cfg.optimizer
        self.spikes = LossSpikeDetector(obs.loss_spike_window, obs.loss_spike_sigma)
        self.guard = NonFiniteGuard(opt.nonfinite, opt.nonfinite_patience)
        self.record = record

    def on_metrics(self, event: Step, reading: Reading) -> None:
        spike = self.spikes.observe(reading.step, reading.values["loss"])
        if spike is not None:
            self.record.emit(spike)
        self.guard.check(reading.step, reading.finite, reading.nonfinite)
