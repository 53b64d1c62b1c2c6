"""The progress lines as a hook: each ``step`` event read (:class:`titan.trainer.progress.
TrainProgress`)."""

from __future__ import annotations

from titan.telemetry.events import Step
from titan.trainer.hooks import Hook, Reading
from titan.trainer.progress import TrainProgress


class ProgressHook(Hook):
    """Gives each ``step`` event to ``progress``."""

    def __init__(self, progress: TrainProgress) -> None:
        self.progress = progress

    def on_metrics(self, event: Step, reading: Reading) -> None:
        self.progress.step(event)
