"""The loop's hooks (titan.trainer.hooks) and its one-step-late metrics (titan.trainer.pending):
the order hooks are called in, ``every=N``, and when a dispatched step is reported."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from titan.layouts.contract import TrainState
from titan.trainer.hooks import Hook, Hooks, LoopControl
from titan.trainer.pending import Dispatched, PendingMetrics


class _Log(Hook):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def on_start(self) -> None:
        self.calls.append(f"{self.name}.start")

    def on_step(self, loop: LoopControl, step: int, state: TrainState) -> None:
        self.calls.append(f"{self.name}.step{step}")

    def close(self) -> None:
        self.calls.append(f"{self.name}.close")


def test_hooks_run_in_the_order_added_and_every_n_steps():
    calls: list[str] = []
    hooks = Hooks()
    hooks.add(_Log("a", calls))
    hooks.add(_Log("b", calls), every=2)
    for step in (1, 2, 3, 4):
        hooks.on_step(None, step, None)  # type: ignore[arg-type]
    hooks.close()
    assert calls == ["a.step1", "a.step2", "b.step2", "a.step3", "a.step4", "b.step4"] + [
        "a.close",
        "b.close",
    ]


def test_start_starts_only_the_hooks_added_since_the_last_start():
    calls: list[str] = []
    hooks = Hooks()
    hooks.add(_Log("early", calls))
    hooks.start()
    hooks.add(_Log("late", calls))
    hooks.start()
    assert calls == ["early.start", "late.start"]


def test_every_below_one_is_refused():
    with pytest.raises(ValueError, match="every must be at least 1, not 0"):
        Hooks().add(Hook(), every=0)


def _dispatched(step: int) -> Dispatched:
    return Dispatched(step, {}, np.arange(2), step * 8, {}, Future())


def test_pending_metrics_report_each_step_once_one_step_late():
    reported: list[tuple[int, object]] = []
    pending = PendingMetrics(lambda d, also: reported.append((d.step, also)))
    assert pending.hold(_dispatched(1)) is None
    previous = pending.hold(_dispatched(2))
    assert previous is not None and previous.step == 1  # the caller reports the previous step
    pending.flush(also="state")
    pending.flush()  # nothing held any more
    assert reported == [(2, "state")]
    assert pending.held is None
    pending.hold(_dispatched(3))
    taken = pending.take()
    assert taken is not None and taken.step == 3 and pending.held is None


def test_a_report_that_raises_leaves_the_step_held():
    def fail(d: Dispatched, also: object) -> None:
        raise RuntimeError(f"step {d.step}")

    pending = PendingMetrics(fail)
    pending.hold(_dispatched(5))
    with pytest.raises(RuntimeError, match="step 5"):
        pending.flush()
    held = pending.held
    assert held is not None and held.step == 5
