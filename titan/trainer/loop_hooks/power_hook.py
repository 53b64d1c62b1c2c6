"""The power sampler as a hook: sampling in the background for the run's length
(:class:`titan.telemetry.power.PowerSampler`; each ``step`` event's energy is read by the loop)."""

from __future__ import annotations

from titan.telemetry.power import PowerSampler
from titan.trainer.hooks import Hook


class PowerHook(Hook):
    """Starts ``sampler`` with the run and stops it at the end."""

    def __init__(self, sampler: PowerSampler) -> None:
        self.sampler = sampler

    def on_start(self) -> None:
        self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()
