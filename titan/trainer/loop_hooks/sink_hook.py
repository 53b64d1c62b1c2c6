"""``--metrics tensorboard`` as a hook: the live metric sink (:func:`titan.telemetry.sinks.
live_sink`), which follows the record in the background, stopped (and drained) at the end."""

from __future__ import annotations

from titan.telemetry.sinks import LiveTensorBoard
from titan.trainer.hooks import Hook


class SinkHook(Hook):
    """Stops ``sink`` when the run ends (it starts when made)."""

    def __init__(self, sink: LiveTensorBoard) -> None:
        self.sink = sink

    def close(self) -> None:
        self.sink.stop()
