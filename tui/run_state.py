"""What the monitor shows about a run, folded from its ``events.jsonl`` events.

:class:`RunState` is plain data: :meth:`RunState.apply` takes events in file order (the schema is
in ``titan.observability.records``) and keeps what the screens draw. It does no I/O, so it runs
on the UI thread and in tests alike. A resumed run appends a second ``run_start`` to the same
record; the state then follows the new segment and keeps the loss history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Steps over which the step rate for the ETA is measured (wall clock between step events).
RATE_WINDOW_STEPS = 20


@dataclass
class RunState:
    """The latest known state of one run.

    Attributes:
        run_id: from the events.
        preset: the model preset (``config.preset`` of ``run_start``).
        param_count: parameters of the model.
        total_steps: the step the run stops at.
        started_at: unix seconds of the (latest) ``run_start``; ``None`` before it.
        resumed_from_step: the checkpoint step this segment resumed from, or ``None``.
        step: last completed step (1-based; 0 before the first).
        loss: loss of the last step.
        tokens_per_s: throughput of the last step.
        tokens_seen: cumulative tokens trained on.
        losses: loss of every step seen, in order.
        compile_s: seconds spent compiling, summed over ``compile`` events.
        checkpoint_step: step of the last saved checkpoint, or ``None``.
        end_status: ``completed``, ``stopped`` or ``failed`` from ``run_end``; ``None`` before.
        end_error: the error text of a failed run.
        ended_at: unix seconds of ``run_end``.
    """

    run_id: str = ""
    preset: str = ""
    param_count: int | None = None
    total_steps: int | None = None
    started_at: float | None = None
    resumed_from_step: int | None = None
    step: int = 0
    loss: float | None = None
    tokens_per_s: float | None = None
    tokens_seen: int = 0
    losses: list[float] = field(default_factory=list)
    compile_s: float = 0.0
    checkpoint_step: int | None = None
    end_status: str | None = None
    end_error: str | None = None
    ended_at: float | None = None
    _step_times: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=RATE_WINDOW_STEPS), repr=False
    )

    def apply(self, events: Iterable[dict[str, Any]]) -> None:
        """Fold events (dicts of the run record schema) into the state; unknown types are
        ignored so that newer records still display."""
        for event in events:
            handler = getattr(self, f"_on_{event.get('type')}", None)
            if handler is not None:
                handler(event)
            self.run_id = event.get("run_id", self.run_id)

    @property
    def status(self) -> str:
        """``starting`` (no ``run_start`` yet), ``running``, or the ``run_end`` status."""
        if self.end_status:
            return self.end_status
        return "running" if self.started_at is not None else "starting"

    def elapsed_s(self, now: float) -> float | None:
        """Seconds since ``run_start`` (until ``run_end`` once ended); ``None`` before start."""
        if self.started_at is None:
            return None
        return (self.ended_at or now) - self.started_at

    def eta_s(self) -> float | None:
        """Seconds left at the recent step rate; 0 once ended, ``None`` while unknown.

        The rate is the wall-clock time between the last :data:`RATE_WINDOW_STEPS` step events,
        so it includes data loading and logging, not only ``step_time_s``.
        """
        if self.end_status:
            return 0.0
        if self.total_steps is None or len(self._step_times) < 2:
            return None
        (first_step, first_t), (last_step, last_t) = self._step_times[0], self._step_times[-1]
        seconds_per_step = (last_t - first_t) / (last_step - first_step)
        return max(self.total_steps - self.step, 0) * seconds_per_step

    def _on_run_start(self, event: dict[str, Any]) -> None:
        self.preset = event.get("config", {}).get("preset", self.preset)
        self.param_count = event.get("param_count")
        self.total_steps = event.get("total_steps")
        self.started_at = event["time"]
        self.resumed_from_step = event.get("resumed_from_step")
        self.step = event.get("start_step", self.step)
        self.end_status = self.end_error = self.ended_at = None
        self._step_times.clear()

    def _on_compile(self, event: dict[str, Any]) -> None:
        self.compile_s += event.get("seconds", 0.0)

    def _on_step(self, event: dict[str, Any]) -> None:
        self.step = event["step"]
        self.loss = event["loss"]
        self.losses.append(event["loss"])
        self.tokens_per_s = event.get("tokens_per_s")
        self.tokens_seen = event.get("tokens_seen", self.tokens_seen)
        self._step_times.append((event["step"], event["time"]))

    def _on_checkpoint(self, event: dict[str, Any]) -> None:
        self.checkpoint_step = event["step"]

    def _on_run_end(self, event: dict[str, Any]) -> None:
        self.end_status = event["status"]
        self.end_error = event.get("error")
        self.ended_at = event["time"]
        if event.get("step") is not None:  # a run that failed before its first step has None
            self.step = event["step"]
