"""The step clock times a step up to the moment its outputs are ready, on its own thread, so
that a step read one step late is not timed by when the loop reads it."""

from __future__ import annotations

import threading
import time

import jax.numpy as jnp

from titan.trainer.step_clock import StepClock


class HeldOutput:
    """A step output that becomes ready when the test releases it (``block_until_ready`` is
    what :func:`jax.block_until_ready` calls on a leaf that is not a JAX array)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released_s = 0.0

    def release(self) -> None:
        self.released_s = time.perf_counter()
        self.released.set()

    def block_until_ready(self) -> HeldOutput:
        self.released.wait()
        return self


def test_a_step_ends_when_its_outputs_are_ready_not_when_it_is_read():
    clock = StepClock()
    start_s = time.perf_counter()
    first, second = HeldOutput(), HeldOutput()
    ends = [clock.dispatched({"loss": first}), clock.dispatched({"loss": second})]
    assert not ends[0].done()  # the clock waits for the device, the loop does not
    first.release()
    second.release()
    time.sleep(0.2)  # the loop reads the metrics later: that is in neither step's time
    read_s = time.perf_counter()
    times = [clock.step_time_s(end) for end in ends]
    assert first.released_s - start_s <= times[0] < read_s - start_s
    assert sum(times) < read_s - start_s
    assert ends[1].result() >= second.released_s
    clock.close()


def test_the_last_step_waits_for_the_arrays_its_metrics_do_not_read():
    clock = StepClock()
    start_s = time.perf_counter()
    metrics, state = {"loss": jnp.float32(1)}, HeldOutput()
    end = clock.dispatched(metrics)
    threading.Timer(0.05, state.release).start()
    step_s = clock.step_time_s(end, also=state)
    assert state.released.is_set() and step_s >= state.released_s - start_s
    clock.close()
