"""``--profile-steps A:B`` as a hook: a trace of steps A..B (:class:`titan.telemetry.profile.
StepProfiler`), closed when the loop ends, also by a stop signal or an error."""

from __future__ import annotations

from titan.layouts.contract import TrainState
from titan.telemetry.profile import StepProfiler
from titan.trainer.hooks import Hook, LoopControl


class ProfilerHook(Hook):
    """Opens ``profiler``'s trace before step A and closes it after step B."""

    def __init__(self, profiler: StepProfiler) -> None:
        self.profiler = profiler

    def before_step(self, step: int) -> None:
        self.profiler.step_starts(step)

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        self.profiler.step_done(step, state)

    def after_loop(self) -> None:
        self.profiler.stop()
