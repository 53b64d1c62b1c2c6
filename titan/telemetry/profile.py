"""``--profile-steps A:B``: a JAX profiler trace of training steps A to B, and its ``profile``
event.

The trace (``jax.profiler.start_trace`` / ``stop_trace``, XLA's profiler) is written under
``<run dir>/profile/`` as ``plugins/profile/<timestamp>/<host>.xplane.pb`` and
``<host>.trace.json.gz``: open the folder with TensorBoard's or XProf's profile plugin, or the
``.trace.json.gz`` in Perfetto (ui.perfetto.dev). It starts before step A fetches its batch and
stops once step B's device work has finished (the loop blocks on the state there), so the device
work of A to B is inside it. A resumed run whose start step lies inside A..B traces the steps left.

One ``profile`` event per trace (:class:`titan.telemetry.events.Profile`): the steps traced,
the trace files and the profiler's overhead; ``error`` when the profiler failed (the run goes on
without a trace).

Every exit path stops an open trace: the end of the range, a stop signal or an exception
(:meth:`StepProfiler.__exit__`, around the loop). A watchdog abort (``--watchdog-abort 1``) ends
the process without unwinding, and the trace is lost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from titan.telemetry.events import Profile
from titan.telemetry.records import RunRecord

PROFILE_DIR = "profile"
TRACE_SUFFIXES = (".xplane.pb", ".trace.json.gz")


class StepProfiler:
    """Starts and stops the trace around the steps of ``--profile-steps``.

    Args:
        steps: (A, B), 1-based and inclusive
            (``titan.config.ObservabilityOptions.profile_steps``), or None for no trace.
        record: the run's record; the trace goes to ``record.run_dir / PROFILE_DIR``.
    """

    def __init__(self, steps: tuple[int, int] | None, record: RunRecord) -> None:
        self.steps = steps
        self.record = record
        self.trace_dir = record.run_dir / PROFILE_DIR
        self._first: int | None = None  # first traced step while a trace is open
        self._last: int | None = None
        self._seconds = 0.0
        self._before: set[Path] = set()
        self._done = steps is None

    def step_starts(self, step: int) -> None:
        """Called before step ``step`` (1-based) fetches its batch: open the trace at step A (or
        at the first step of a resumed run inside A..B)."""
        if self._done or self._first is not None or self.steps is None:
            return
        if not self.steps[0] <= step <= self.steps[1]:
            return
        import jax

        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._before = set(self._trace_files())
        start = time.perf_counter()
        try:
            jax.profiler.start_trace(str(self.trace_dir))
        except Exception as err:  # noqa: BLE001 - a profiler failure must not end the run
            self._done = True
            self._emit(step, None, time.perf_counter() - start, f"{type(err).__name__}: {err}")
            return
        self._seconds = time.perf_counter() - start
        self._first = step

    def step_done(self, step: int, state: Any) -> None:
        """Called after step ``step`` was dispatched: at step B wait for its device work
        (``state``: the step's output) and close the trace."""
        if self._first is None or self.steps is None:  # no open trace (and none without steps)
            return
        self._last = step
        if step == self.steps[1]:
            import jax

            jax.block_until_ready(state)
            self.stop()

    def stop(self) -> None:
        """Close an open trace and record its ``profile`` event (nothing when none is open).
        A failure is printed and recorded, never raised."""
        if self._first is None:
            return
        import jax

        first, self._first, self._done = self._first, None, True
        start = time.perf_counter()
        error = None
        try:
            jax.profiler.stop_trace()
        except Exception as err:  # noqa: BLE001 - the run end must still be recorded
            error = f"{type(err).__name__}: {err}"
        self._emit(first, self._last, self._seconds + time.perf_counter() - start, error)

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _trace_files(self) -> list[Path]:
        return [p for p in self.trace_dir.rglob("*") if p.name.endswith(TRACE_SUFFIXES)]

    def _emit(self, first: int, last: int | None, seconds: float, error: str | None) -> None:
        assert self.steps is not None  # a trace, or its failure, is of --profile-steps
        run_dir = self.record.run_dir
        files = sorted(p.relative_to(run_dir) for p in set(self._trace_files()) - self._before)
        folders = sorted({str(p.parent) for p in files})
        if error:
            print(f"titan: profiler: {error}", file=sys.stderr, flush=True)
        self.record.emit(
            Profile(
                steps=[first, last] if last is not None else None,
                requested=list(self.steps),
                complete=error is None and (first, last) == self.steps,
                dir=folders[0] if len(folders) == 1 else PROFILE_DIR,
                files=[str(p) for p in files],
                seconds=seconds,
                error=error,
            )
        )
