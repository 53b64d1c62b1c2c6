"""The stall watchdog as a hook: the run's phases go to :class:`titan.telemetry.watchdog.
Watchdog`, and a stall is recorded, and with ``--watchdog-abort 1`` ends the process with
:data:`titan.exit_codes.EXIT_STALL` after saving the state when it is reachable
(:meth:`titan.trainer.loop.TrainLoop.save_on_stall`)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TextIO

from titan.checkpoint.checkpointer import Checkpointer
from titan.config import ObservabilityOptions
from titan.exit_codes import EXIT_STALL
from titan.telemetry.events import RunEnd, Step
from titan.telemetry.heartbeat import hang_stacks_path, heartbeat_allowance_s, read_beats
from titan.telemetry.records import RunRecord
from titan.telemetry.watchdog import Stall, Watchdog
from titan.trainer.hooks import Hook, Reading
from titan.trainer.loop import TrainLoop, save_before_loop
from titan.trainer.processes import Heartbeat


class StallHook(Hook):
    """The watchdog of the run's phases (a background thread).

    Until :meth:`attach` a stall is said, not recorded (``record`` is muted), and there is
    nothing to save.

    Args:
        options: ``--watchdog-floor``, ``--watchdog-factor``, ``--watchdog-abort``.
        record: the run's record before it is opened (a :class:`titan.trainer.processes.
            MutedRecord`).
        checkpointer: the run's checkpoints (``run_end``'s ``checkpoint_step``).
    """

    def __init__(
        self, options: ObservabilityOptions, record: RunRecord, checkpointer: Checkpointer
    ) -> None:
        self.watchdog = Watchdog(options.watchdog_floor, options.watchdog_factor, self.on_stall)
        self.abort = options.watchdog_abort
        self.record = record
        self.checkpointer = checkpointer
        self.heartbeat: Heartbeat | None = None
        self.loop: TrainLoop | None = None
        self.stacks: TextIO | None = None
        self.grace_s = heartbeat_allowance_s(options.watchdog_floor)

    def attach(self, record: RunRecord, heartbeat: Heartbeat, loop: TrainLoop) -> None:
        """From now on record stalls in ``record``, tell ``heartbeat`` and save ``loop``'s
        state on an abort; and write every thread's stack to ``processes/<id>.stacks`` when the
        process hangs holding the GIL for its phase's allowance plus the heartbeat allowance,
        ending it with ``--watchdog-abort`` (:meth:`titan.telemetry.watchdog.Watchdog.
        arm_hang_timer`)."""
        self.record, self.heartbeat, self.loop = record, heartbeat, loop
        self.stacks = open(  # noqa: SIM115 - open until close(): the timer writes to it
            hang_stacks_path(record.run_dir, heartbeat.fields["process"]), "w"
        )
        self.watchdog.arm_hang_timer(self.stacks, self.grace_s, end=self.abort)

    def on_start(self) -> None:
        self.watchdog.start()

    def on_phase(self, phase: str, step: int) -> None:
        self.watchdog.enter(phase, step)
        if self.heartbeat is not None:
            self.heartbeat.in_phase(phase, step)

    def on_metrics(self, event: Step, reading: Reading) -> None:
        self.watchdog.step_done(reading.step_time_s)

    def close(self) -> None:
        """Stop the watchdog and its hang timer; the stacks file, empty (no hang), is removed."""
        self.watchdog.stop()
        if self.stacks is not None:
            self.stacks.close()
            Path(self.stacks.name).unlink(missing_ok=True)
            self.stacks = None

    def on_stall(self, stall: Stall) -> None:
        """Record a stall (on the watchdog thread, while the main thread is stuck); with
        ``--watchdog-abort 1`` save the state when it is reachable, then end the process with
        :data:`EXIT_STALL` without unwinding the stuck thread. Another process's stall reaches
        the record through its heartbeat (:mod:`titan.trainer.peers`)."""
        self.record.emit(stall)
        if self.heartbeat is not None:
            self.heartbeat.stalled(stall)
        peers = [
            f"{b.id.name()} is {b.doing()}"
            for b in read_beats(self.record.run_dir)
            if b.doing()
            and (self.heartbeat is None or b.id.process != self.heartbeat.fields["process"])
        ]
        print(
            f"titan: stall: {stall.where()} has taken {stall.elapsed_s:.1f} s "
            f"(stall allowance {stall.threshold_s:.1f} s)" + "".join(f"; {p}" for p in peers),
            file=sys.stderr,
            flush=True,
        )
        if not self.abort:
            return
        loop = self.loop
        saved = loop.save_on_stall() if loop else save_before_loop()
        if loop is not None:
            with contextlib.suppress(Exception):  # a save in flight commits before the exit
                loop.saver.wait()
        self.record.emit(
            RunEnd(
                status="failed",
                step=loop.recorded_step if loop else None,
                reason="stall",
                error=f"stalled in {stall.phase} for {stall.elapsed_s:.1f} s",
                checkpoint_step=self.checkpointer.latest_step(),
                saved=saved,
            )
        )
        self.record.close()
        os._exit(EXIT_STALL)
