"""The training loop's hooks (:class:`titan.trainer.loop.TrainLoop`), after Levanter's.

A hook is one monitor of the run (the stall watchdog, the power sampler, the profiler, the
heartbeat, checkpoints, evaluation, ...): a :class:`Hook` overriding the points it needs. The
run registers each once, ``hooks.add(EvalHook(...), every=eval_every)``; :class:`Hooks` calls
them in the order added. Adding a monitor is one module with its hook and one ``hooks.add``.

Hook points, in the order a run reaches them:

- ``on_start()``: start background threads (:meth:`Hooks.start`).
- ``on_phase(phase, step)``: the run enters a watchdog phase (``checkpoint_restore``,
  ``compile``, ``data_wait``, ``step``, ``checkpoint_save``, ``eval``, ``idle``) of ``step``.
- ``before_step(step)``: step ``step`` (1-based) is about to fetch its batch.
- ``on_step(loop, step, state)``: step ``step`` was dispatched (its metrics are not read yet);
  ``every=N`` calls it after every N-th step only.
- ``on_metrics(event, reading)``: a step's metrics were read, one step late, and its ``step``
  event recorded.
- ``after_loop()``: the loop has ended, normally or by an exception, before ``run_end``.
- ``close()``: the run has ended; stop background threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from titan.layouts.contract import TrainState
from titan.telemetry.events import Step


class LoopControl(Protocol):
    """What a hook may ask of the loop from ``on_step``."""

    def flush_metrics(self) -> None:
        """Read the pending step's metrics now (its ``step`` event before what follows)."""

    def save_newest(self) -> None:
        """Save the newest state (:class:`titan.trainer.saver.Saver`)."""

    def phase(self, phase: str, step: int) -> None:
        """Enter the watchdog phase ``phase`` of ``step`` (every hook's ``on_phase``)."""

    def restart_clock(self) -> None:
        """Start the next step's time and energy now (work done by a hook counts in no step)."""


@dataclass(frozen=True)
class Reading:
    """A step's metrics as read on the host: the step, the metric values (``loss``,
    ``grad_norm``, ...), whether the device found the step finite, which guarded values were not
    (:func:`titan.trainer.guard.nonfinite_fields`) and the step's time in seconds."""

    step: int
    values: dict[str, float]
    finite: bool
    nonfinite: dict[str, str]
    step_time_s: float


class Hook:
    """A monitor of the run; every point does nothing unless overridden."""

    def on_start(self) -> None:
        """Start background work."""

    def on_phase(self, phase: str, step: int) -> None:
        """The run enters ``phase`` of ``step``."""

    def before_step(self, step: int) -> None:
        """Step ``step`` (1-based) is about to fetch its batch."""

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        """Step ``step`` was dispatched; ``state`` is its output (maybe not computed yet)."""

    def on_metrics(self, event: Step, reading: Reading) -> None:
        """A step's metrics were read and its ``step`` event (``event``) recorded."""

    def after_loop(self) -> None:
        """The loop ended (also by an exception), before ``run_end``."""

    def close(self) -> None:
        """The run ended: stop background work."""


class Hooks:
    """The run's hooks, each called at its points in the order added."""

    def __init__(self) -> None:
        self._hooks: list[tuple[Hook, int]] = []
        self._started = 0  # hooks whose on_start ran: the first ones added

    def add(self, hook: Hook, every: int = 1) -> None:
        """Register ``hook``; its ``on_step`` runs after every ``every``-th step (1: each).

        Raises:
            ValueError: ``every`` is below 1.
        """
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        self._hooks.append((hook, every))

    def start(self) -> None:
        """``on_start`` of each hook added since the last call."""
        for hook, _ in self._hooks[self._started :]:
            hook.on_start()
        self._started = len(self._hooks)

    def on_phase(self, phase: str, step: int) -> None:
        for hook, _ in self._hooks:
            hook.on_phase(phase, step)

    def before_step(self, step: int) -> None:
        for hook, _ in self._hooks:
            hook.before_step(step)

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        for hook, every in self._hooks:
            if step % every == 0:
                hook.on_step(loop, step, state)

    def on_metrics(self, event: Step, reading: Reading) -> None:
        for hook, _ in self._hooks:
            hook.on_metrics(event, reading)

    def after_loop(self) -> None:
        for hook, _ in self._hooks:
            hook.after_loop()

    def close(self) -> None:
        """Each hook's ``close``, in the order added (all of them, as far as none raises)."""
        for hook, _ in self._hooks:
            hook.close()
