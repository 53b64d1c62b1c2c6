"""The training loop: steps until ``--steps`` or a stop signal, each step's metrics read one
step late (:mod:`titan.trainer.pending`), the run's monitors called at their points
(:mod:`titan.trainer.hooks`), the newest state saved at the end (:mod:`titan.trainer.saver`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any

from titan.config import DebuggingOptions
from titan.data.images import ImageBatches
from titan.data.mixture import Batches
from titan.data.text import batch_digest
from titan.layouts.contract import Trainer, TrainState
from titan.parallel.distributed import StopAgreement, process_count
from titan.stopping import StopFlag
from titan.telemetry.device_memory import peak_bytes, uncounted_temp_bytes
from titan.telemetry.events import Compile, Step
from titan.telemetry.mfu import FlopsMeter
from titan.telemetry.power import PowerSampler, StepEnergy
from titan.telemetry.records import RunRecord
from titan.trainer.guard import NonFiniteAbort, nonfinite_fields, poison_batch
from titan.trainer.hooks import Hooks, Reading
from titan.trainer.pending import Dispatched, PendingMetrics
from titan.trainer.saver import Saver
from titan.trainer.step_clock import StepClock


@dataclass(frozen=True)
class Throughput:
    """How a ``step`` event counts its work: rows per batch, tokens per row (``--seq-len``, or a
    DiT's patches per image), whether rows are images (``images_per_s``), the MFU meter, the
    power sampler (``energy_j``), the run's devices in this process and the temporaries of its
    largest program that their allocator does not count (peak memory, :meth:`peak_memory`)."""

    batch_size: int
    tokens_per_row: int
    images: bool
    flops: FlopsMeter
    power: PowerSampler
    local_devices: list
    uncounted_temp_bytes: int = 0

    def peak_memory(self) -> int | None:
        """Peak bytes per device: the allocator's peak (:func:`peak_bytes`) plus the
        temporaries it does not count; None where the backend reports no peak."""
        peak = peak_bytes(self.local_devices)
        return None if peak is None else peak + self.uncounted_temp_bytes


def save_before_loop() -> str:
    """What a save on a stall says before the loop has a state (``RunEnd.saved``)."""
    if process_count() > 1:
        return "not reachable: a save needs every process, and only this one is stopping"
    return "nothing to save: the loop has not started"


class TrainLoop:
    """The steps of a run from a restored or initialised state.

    Args:
        trainer: the run's trainer.
        batches: the run's batches.
        steps: ``--steps``, the run's total.
        hooks: the run's monitors.
        saver: saves the newest state at the end (and for hooks).
        record: where ``step`` events and the trainer's events go.
        throughput: how ``step`` events count their work.
        stop: the run's stop flag; with several processes a stop is agreed on
            (:class:`titan.parallel.distributed.StopAgreement`).
        debugging: the testing aids (``--debug-stall-at-step``, ``--debug-nonfinite-at-step``).
    """

    def __init__(
        self,
        trainer: Trainer,
        batches: Batches | ImageBatches,
        steps: int,
        hooks: Hooks,
        saver: Saver,
        record: RunRecord,
        throughput: Throughput,
        stop: StopFlag,
        debugging: DebuggingOptions,
    ) -> None:
        self.trainer = trainer
        self.batches = batches
        self.steps = steps
        self.hooks = hooks
        self.saver = saver
        self.record = record
        self.throughput = throughput
        self.stop = stop
        self.debugging = debugging
        self.agreement = StopAgreement(lambda: stop.requested)
        self.pending = PendingMetrics(self._report)
        # Held while a step donates the state or a save reads it: a save on a stall (another
        # thread) happens only when it can take it at once (the loop is stuck elsewhere).
        self._dispatch = threading.Lock()
        # (state, its data position, its step's finite flag on the device; None before the
        # first step): the newest state.
        self._newest: tuple[TrainState, int, Any] | None = None
        # The last step with a step event: what run_end's step says (the step in flight when
        # the watchdog aborts was never recorded).
        self.recorded_step: int | None = None
        self.clock: StepClock  # both made by run(): step times and energy start there
        self.energy: StepEnergy

    def count_program_temporaries(self, compiled: list[Compile]) -> None:
        """Count in each step's peak memory the temporaries of the largest of the ``compiled``
        programs where the allocator leaves them out (:func:`uncounted_temp_bytes`)."""
        temp = uncounted_temp_bytes(self.throughput.local_devices, [e.memory for e in compiled])
        self.throughput = dataclasses.replace(self.throughput, uncounted_temp_bytes=temp)

    def run(self, state: TrainState, step: int) -> tuple[int, str]:
        """Train from ``state`` after ``step`` until ``--steps`` or a stop signal, then save the
        newest state and wait for the last save.

        Returns:
            (last step done, ``completed`` (every step done, whenever a stop came) or
            ``stopped``).

        Raises:
            NonFiniteAbort: ``--nonfinite abort`` (:mod:`titan.trainer.guard`).
            FinalSaveFailed: the last save was not committed.
        """
        start = self.saver.saved_step = self.recorded_step = step  # restored or initialised
        self._newest = (state, self.batches.position, None)
        self.clock = StepClock()
        self.energy = StepEnergy(self.throughput.power)
        self.saver.schedule.restart()
        try:
            try:
                step = self.loop(state, step)
            finally:  # no clock thread left waiting on the device when the loop fails
                self.clock.close()
            if step != self.saver.saved_step:
                self.save_newest()
            self.phase("checkpoint_save", step)
            self.saver.wait()  # the last save commits before run_end
            if step != start:  # this run trained and saved (a stop before step 1 saves nothing)
                self.saver.check_committed(step)
            self.phase("idle", step)
        finally:
            self.hooks.after_loop()
        # a stop that came once every step was done (during the last save) ends nothing early
        stopped = self.agreement.agreed and step < self.steps
        return step, "stopped" if stopped else "completed"

    def loop(self, state: TrainState, step: int) -> int:
        """The steps of :meth:`run` from ``step``, each reported one step late. Returns the
        last step done."""
        while step < self.steps and not self.agreement.stop_before(step):
            self.hooks.before_step(step + 1)
            self.phase("data_wait", step + 1)
            batch, ids = self.batches.next_batch()
            self.phase("step", step + 1)
            if step + 1 == self.debugging.debug_stall_at_step:
                self._debug_stall()
            if step + 1 == self.debugging.debug_nonfinite_at_step:
                batch = poison_batch(batch)
            if self.pending.held and self.trainer.next_step_blocks():
                self.pending.flush()  # a blocking step must not count in the previous one
            with self._dispatch:  # the newest state and its unread metrics change together
                state, metrics = self.trainer.step(state, batch)
                step += 1
                position = self.batches.position
                self._newest = (state, position, metrics["finite"])
                fields = self.trainer.step_fields()
                end = self.clock.dispatched(metrics)
                previous = self.pending.hold(Dispatched(step, metrics, ids, position, fields, end))
            self.agreement.contribute(step)
            if previous:
                self._report(previous)
            self.hooks.on_step(self, step, state)
        assert self._newest is not None  # set by run()
        self.pending.flush(also=self._newest[0])  # the last step ends when its state is ready
        return step

    def flush_metrics(self) -> None:
        """Read the pending step's metrics now (a non-finite abort raises here)."""
        self.pending.flush()

    def phase(self, phase: str, step: int) -> None:
        self.hooks.on_phase(phase, step)

    def restart_clock(self) -> None:
        self.clock.restart()
        self.energy.restart()

    def save_newest(self) -> None:
        """Save the newest state from the loop (holding the dispatch lock, so that a save on a
        stall does not save it at the same time)."""
        with self._dispatch:
            assert self._newest is not None  # saved after a step
            state, position, _ = self._newest
            self.saver.save(state, position)

    def save_on_stall(self) -> str:
        """Save the newest state from the watchdog thread when that is safe, and say what
        happened (``RunEnd.saved``). Safe means: one process (a save is collective), the loop
        is not inside a step dispatch (which donates the state) or a save (the lock is free at
        once), the state and its step's metrics are computed (``is_ready``, so a hung device
        cannot hang the save), its step is known finite, and its weights are finite. The step's
        unread metrics are recorded first (its ``step`` event, step time up to now), and the
        data position saved is the one taken with the state after its step, not the loader's
        live one."""
        import jax

        if process_count() > 1 or self._newest is None:
            return save_before_loop()
        if not self._dispatch.acquire(blocking=False):
            return "not reachable: the loop is stuck inside a step dispatch or a save"
        try:
            state, position, finite = self._newest
            if state.step == self.saver.saved_step:
                return "already saved" if state.step else "nothing to save: no step done"
            pending = self.pending.take()
            arrays = jax.tree.leaves((state, finite, pending and pending.metrics))
            if not all(leaf.is_ready() for leaf in arrays):
                return f"not reachable: the device has not finished step {state.step}"
            if not bool(finite):
                return f"not saved: step {state.step} was not finite"
            if pending is not None:
                self._report(pending)  # the step's event comes before its checkpoint's
            self.saver.save(state, position)
            self.saver.wait()  # committed before the process ends
            return "saved"
        except NonFiniteAbort as err:
            return f"not saved: {err}"
        except Exception as err:  # noqa: BLE001 - the abort must go on to its run_end and exit
            return f"not saved: {type(err).__name__}: {err}"
        finally:
            self._dispatch.release()

    def _debug_stall(self) -> None:
        """``--debug-stall-at-step``: hang here (a testing aid for the watchdog) until a stop
        signal arrives or the watchdog aborts the process."""
        while not self.stop.requested:
            time.sleep(0.1)

    def _report(self, dispatched: Dispatched, also: Any = None) -> None:
        """Read ``dispatched``'s metrics, record its ``step`` event and the trainer's events,
        and give the reading to the hooks (``also``: what else the step ends with)."""
        import jax

        values = {key: float(value) for key, value in jax.device_get(dispatched.metrics).items()}
        finite = bool(values.pop("finite"))
        nonfinite = nonfinite_fields(values)
        step_time_s = self.clock.step_time_s(dispatched.end, also)
        self.recorded_step = dispatched.step
        reading = Reading(dispatched.step, values, finite, nonfinite, step_time_s)
        event = self.record.emit(self._step_event(dispatched, reading))
        for layout_event in self.trainer.drain_events():
            self.record.emit(layout_event)
        self.hooks.on_metrics(event, reading)

    def _step_event(self, dispatched: Dispatched, reading: Reading) -> Step:
        """The ``step`` event of ``dispatched``, read as ``reading``."""
        work = self.throughput
        step, step_time_s = dispatched.step, reading.step_time_s
        tokens = work.batch_size * work.tokens_per_row
        return Step.from_fields(
            step=step,
            **reading.values,
            tokens=tokens,
            tokens_seen=step * tokens,
            step_time_s=step_time_s,
            tokens_per_s=tokens / step_time_s,
            images_per_s=work.batch_size / step_time_s if work.images else None,
            data_position=dispatched.position,
            batch_digest=batch_digest(dispatched.ids),
            **work.flops.step_fields(tokens / step_time_s),
            **self.energy.step_fields(tokens),
            nonfinite=reading.nonfinite or None,
            skipped=None if reading.finite else True,
            peak_memory_bytes=work.peak_memory(),
            **dispatched.fields,
        )
