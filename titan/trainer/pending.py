"""The step whose metrics the loop has not read yet.

The loop reads a step's metrics one step late, after dispatching the next step, so that the host
never waits on the device before dispatching (:mod:`titan.trainer.step_clock`). The step in
flight is held here until it is read: after the next dispatch, or earlier when its ``step``
event must come before something else (a blocking step, a save, an evaluation).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from titan.layouts.contract import StepMetrics


@dataclass(frozen=True)
class Dispatched:
    """A dispatched step: its number, its metrics on the device, the batch's sequence ids, the
    data position after it, the trainer's extra ``step`` fields, and when it ends (seconds of
    :func:`time.perf_counter`, from :meth:`titan.trainer.step_clock.StepClock.dispatched`)."""

    step: int
    metrics: StepMetrics
    ids: np.ndarray
    position: int
    fields: dict[str, Any]
    end: Future[float]


class PendingMetrics:
    """At most one dispatched step whose metrics are unread, and the report that reads them.

    Args:
        report: reads a step's metrics and records it; its second argument is what else the step
            ends with (the last step ends when its new state is ready), or None.
    """

    def __init__(self, report: Callable[[Dispatched, Any], None]) -> None:
        self._report = report
        self._held: Dispatched | None = None

    @property
    def held(self) -> Dispatched | None:
        return self._held

    def hold(self, dispatched: Dispatched) -> Dispatched | None:
        """Hold ``dispatched``; returns the step held before it, for the caller to report."""
        previous, self._held = self._held, dispatched
        return previous

    def take(self) -> Dispatched | None:
        """The held step, no longer held (the caller reports it)."""
        held, self._held = self._held, None
        return held

    def flush(self, also: Any = None) -> None:
        """Report the held step now, if any (it stays held if the report raises)."""
        if self._held is not None:
            self._report(self._held, also)
            self._held = None
