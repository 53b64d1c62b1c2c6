"""Step times of the training loop: each step's time is the interval between the end of the
previous step and its own end, a step ending when its dispatch has returned and its outputs are
ready on the device.

The loop reads a step's metrics one step late, after dispatching the next step, so that the host
never waits on the device. A clock read at that moment would put the next step's dispatch into
this step's time: under ``--layout mpmd``, whose dispatch is host-heavy (every action of the
schedule), each step would carry the next one's dispatch and the last step almost nothing (a
last step's tokens/s far above the others'). Here a worker thread waits for each step's outputs
and notes when they became ready, so the loop still never waits and each step is timed by its
own end.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

import jax

# Seconds close() waits for the steps still on the device (a stuck one is the watchdog's).
CLOSE_WAIT_S = 60.0


def ready_at(outputs: Any, dispatched_s: float) -> float:
    """The ``time.perf_counter()`` second at which ``outputs`` (a pytree of arrays) are ready,
    not before ``dispatched_s`` (when their dispatch returned); waits for them."""
    jax.block_until_ready(outputs)
    return max(dispatched_s, time.perf_counter())


class StepClock:
    """The end of each dispatched step, noted by a daemon thread (a step stuck on the device
    holds no exit), and step times as the intervals between step ends."""

    def __init__(self) -> None:
        self._waits: queue.SimpleQueue[tuple[Any, float, Future[float]] | None] = (
            queue.SimpleQueue()
        )
        self._last_end_s = time.perf_counter()
        self._thread = threading.Thread(
            target=self._wait_loop, name="titan-step-clock", daemon=True
        )
        self._thread.start()

    def restart(self) -> None:
        """The next step's time starts now (after an evaluation, which is in no step's time)."""
        self._last_end_s = time.perf_counter()

    def dispatched(self, outputs: Any) -> Future[float]:
        """Call when a step's dispatch returns, with its outputs (arrays that the step's whole
        device work produces, e.g. its metrics): the future of the step's end
        (``time.perf_counter()`` seconds). The outputs must not be donated to a later step."""
        end: Future[float] = Future()
        self._waits.put((outputs, time.perf_counter(), end))
        return end

    def step_time_s(self, end: Future[float], also: Any = None) -> float:
        """Seconds from the previous step's end to ``end`` (waiting for it); with ``also``
        (arrays of the step that its outputs do not depend on, such as the new state of a
        chunk whose update no metric reads), the step ends when those are ready too.

        Raises:
            The error of the device work that ``end`` waited for, if it failed.
        """
        end_s = end.result()
        if also is not None:
            end_s = ready_at(also, end_s)
        step_s, self._last_end_s = end_s - self._last_end_s, end_s
        return step_s

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Ends the thread once the steps dispatched so far have ended, waiting up to
        ``wait_s`` seconds for it: a process that exits while the thread still waits inside
        the runtime is aborted by it (SIGABRT) instead of exiting with its own code."""
        self._waits.put(None)
        self._thread.join(wait_s)

    def _wait_loop(self) -> None:
        while (wait := self._waits.get()) is not None:
            outputs, dispatched_s, end = wait
            try:
                end.set_result(ready_at(outputs, dispatched_s))
            except Exception as err:  # the step's device error, raised where it is read
                end.set_exception(err)
