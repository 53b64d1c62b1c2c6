"""What the monitor shows about a run, folded from its ``events.jsonl`` events.

:class:`RunState` is plain data: :meth:`RunState.apply` takes events in file order (the typed
events of :mod:`titan.telemetry.events`, ``docs/events.md``) and keeps what the screens
draw. It does no I/O, so it runs in the monitor's polling worker and in tests alike; the
worker hands the UI thread :meth:`RunState.snapshot` copies to draw. Its memory does not grow
with the record: the curves are decimated, and of the per-step series (power, stalls) only the
last few are kept, with counts. A resumed run appends a second ``run_start`` to the same record;
the state then follows the new segment and keeps the loss history.

The watchdog panel's phase is the one the last event implies (``run_start``: compile; ``step``
and ``checkpoint``: the next step; ``stall``: its phase; ``run_end``: idle) and its allowance
comes from :class:`titan.telemetry.watchdog.Watchdog` fed with the recorded step times and
the run's ``--watchdog-floor`` / ``--watchdog-factor``: the trainer's own rule.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from titan.analysis.liveness import RecordFacts
from titan.formatting import peak_label
from titan.gpus import gpu_for_device_kind
from titan.telemetry.events import (
    MFU_CONVENTION,
    Checkpoint,
    Compile,
    Eval,
    Event,
    PinnedHost,
    Pipeline,
    PipelineTiming,
    RunEnd,
    RunStart,
    Stall,
    Step,
)
from titan.telemetry.watchdog import WINDOW, Watchdog
from tui.curve import Curve

# Steps over which the step rate for the ETA is measured (wall clock between step events).
RATE_WINDOW_STEPS = 20
# The phase the loop is in after each event type (the watchdog's phase names).
_PHASE_AFTER = {
    "run_start": "compile",
    "step": "step",
    "checkpoint": "step",
    "eval": "step",
    "run_end": "idle",
}
# Until run_start tells the run's options: titan train's defaults.
_WATCHDOG_DEFAULTS = (300.0, 10.0)
# The last stalls kept (with their stacks; the panel shows the last two and the count) and the
# last steps' power kept (the power panel's sparkline shows 120).
STALLS_KEPT = 8
POWER_STEPS_KEPT = 256


def _typed(mapping: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """``mapping[key]`` when it is a ``kind`` (an int counts as a float, a bool as neither),
    else ``default``."""
    value = mapping.get(key)
    if isinstance(value, bool) or value is None:
        return default
    if kind is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, kind) else default


def _new_watchdog(floor_s: float, factor: float) -> Watchdog:
    return Watchdog(floor_s, factor, on_stall=lambda stall: None)


@dataclass
class RunState:
    """The latest known state of one run.

    Attributes:
        run_id: from the events.
        preset: the model preset (``config.preset`` of ``run_start``).
        param_count: parameters of the model.
        total_steps: the step the run stops at.
        started_at: unix seconds of the (latest) ``run_start``; ``None`` before it.
        first_started_at: unix seconds of the first ``run_start`` (elapsed time counts from it).
        attempts: ``run_start`` events read (1 for a fresh run, one more per resume).
        resumed_from_step: the checkpoint step this segment resumed from, or ``None``.
        step: the last step with a ``step`` event (1-based; the attempt's start step before
            its first): the one definition of a run's steps, as ``titan summarize`` counts them.
        loss: loss of the last step.
        tokens_per_s: throughput of the last step.
        tokens_seen: cumulative tokens trained on.
        curve: the steps' ``(step, loss, lr)``, decimated to a bounded number of points
            (:class:`tui.curve.Curve`; ``steps``, ``losses`` and ``lrs`` read it).
        eval_curve: the ``eval`` events' ``(step, held-out loss)``, decimated the same way;
            eval_loss: the last one's loss (None before the first).
        compile_s: seconds spent compiling, summed over ``compile`` events.
        checkpoint_step: step of the last saved checkpoint, or ``None``.
        end_status: ``completed``, ``stopped`` or ``failed`` from ``run_end``; ``None`` before.
        end_error: the error text of a failed run.
        ended_at: unix seconds of ``run_end``.
        last_event_at: unix seconds of the latest event (the heartbeat the panel ages).
        phase: the watchdog phase the last event implies (see the module docstring).
        stalls: the last :data:`STALLS_KEPT` ``stall`` events (phase, elapsed_s, threshold_s,
            step, stacks); stall_count: all of them.
        mfu: MFU of the last step under ``mfu_convention`` (:data:`MFU_CONVENTION` once a step
            recorded one); mfu_reason: why it is missing; mfu_peak: what it divides by, per
            device (:func:`titan.formatting.peak_label`, as ``titan summarize`` names it).
        flops_per_token: model FLOPs per token of the last step under ``mfu_convention``.
        energy_j: energy of every step so far (None without a power source);
        energy_tokens: the tokens of those steps (``energy_j / energy_tokens``: the run's
            joules per token, as ``titan summarize`` divides them); power_reason: why there is
            no power source.
        power_w: average power of each of the last :data:`POWER_STEPS_KEPT` steps with energy,
            watts (all devices).
        devices: devices the layout uses; tdp_w: the board power of one (None: not in the
            catalog, e.g. a CPU).
        peak_memory_bytes: the last step's measured peak device memory (None: not reported);
            compiled_memory_bytes: the largest compiled program's buffers
            (:attr:`~titan.telemetry.events.Compile.program_bytes`).
        pipeline: the ``pipeline`` event of an MPMD run; pipeline_timing: its latest
            ``pipeline_timing`` event (per-action spans of one step).
        facts: what :func:`titan.analysis.liveness.judge` needs from the events.
    """

    run_id: str = ""
    preset: str = ""
    param_count: int | None = None
    total_steps: int | None = None
    started_at: float | None = None
    first_started_at: float | None = None
    attempts: int = 0
    resumed_from_step: int | None = None
    step: int = 0
    loss: float | None = None
    tokens_per_s: float | None = None
    tokens_seen: int = 0
    curve: Curve = field(default_factory=Curve)
    eval_curve: Curve = field(default_factory=Curve)
    eval_loss: float | None = None
    compile_s: float = 0.0
    checkpoint_step: int | None = None
    end_status: str | None = None
    end_error: str | None = None
    ended_at: float | None = None
    last_event_at: float | None = None
    phase: str = "idle"
    stalls: list[Stall] = field(default_factory=list)
    stall_count: int = 0
    mfu: float | None = None
    mfu_convention: str | None = None
    mfu_reason: str | None = None
    mfu_peak: str | None = None
    device_kinds: list[str] = field(default_factory=list)
    device_count: int | None = None
    flops_per_token: float | None = None
    energy_j: float | None = None
    energy_tokens: int = 0
    power_reason: str | None = None
    power_w: deque[float] = field(default_factory=lambda: deque(maxlen=POWER_STEPS_KEPT))
    devices: int | None = None
    tdp_w: float | None = None
    peak_memory_bytes: int | None = None
    compiled_memory_bytes: int | None = None
    pipeline: Pipeline | None = None
    pipeline_timing: PipelineTiming | None = None
    facts: RecordFacts = field(default_factory=RecordFacts)
    _step_times: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=RATE_WINDOW_STEPS), repr=False
    )
    # The run's --watchdog-floor and --watchdog-factor, and its last step times (the rule's
    # rolling window).
    _watchdog_rule: tuple[float, float] = _WATCHDOG_DEFAULTS
    _watchdog_step_times: deque[float] = field(
        default_factory=lambda: deque(maxlen=WINDOW), repr=False
    )

    def apply(self, events: Iterable[Event]) -> None:
        """Fold events into the state; unknown types are ignored so that newer records still
        display."""
        events = list(events)
        self.facts = self.facts.fold(events)
        for event in events:
            handler = getattr(self, f"_on_{event.type}", None)
            if handler is not None:
                handler(event)
            self.run_id = event.run_id or self.run_id
            self.last_event_at = event.time
            self.phase = _PHASE_AFTER.get(event.type, self.phase)

    def snapshot(self) -> RunState:
        """A copy that later :meth:`apply` calls leave as it is (the worker folds, the UI thread
        draws the copy): the mutable parts are copied, the events kept are shared (frozen)."""
        return dataclasses.replace(
            self,
            curve=self.curve.copy(),
            eval_curve=self.eval_curve.copy(),
            stalls=list(self.stalls),
            power_w=self.power_w.copy(),
            _step_times=self._step_times.copy(),
            _watchdog_step_times=self._watchdog_step_times.copy(),
        )

    @property
    def status(self) -> str:
        """What the events alone say: ``starting`` (no ``run_start`` yet), ``running``, or the
        ``run_end`` status. The screens show the run's state from
        :func:`titan.analysis.liveness.judge` (with :attr:`facts`), which also checks its
        processes."""
        if self.end_status:
            return self.end_status
        return "running" if self.started_at is not None else "starting"

    def elapsed_s(self, now: float) -> float | None:
        """Seconds since the first ``run_start`` (until ``run_end`` once ended), the gaps
        between attempts included: the ``wall_s`` of History and ``titan summarize`` (first
        ``run_start`` to the last event); ``None`` before start, and when the clock went back
        since it (a span below 0: unknown, never negative)."""
        if self.first_started_at is None:
            return None
        elapsed = (self.ended_at or now) - self.first_started_at
        return elapsed if elapsed >= 0 else None

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

    def threshold_s(self) -> float:
        """The watchdog's allowance for :attr:`phase`, seconds (``inf`` when idle): the
        trainer's rule (:meth:`titan.telemetry.watchdog.Watchdog.threshold_s`) over the
        recorded step times."""
        watchdog = _new_watchdog(*self._watchdog_rule)
        for step_time_s in self._watchdog_step_times:
            watchdog.step_done(step_time_s)
        return watchdog.threshold_s(self.phase)

    def _on_run_start(self, event: RunStart) -> None:
        # Values inside the nested dicts are whatever the record holds: each is taken only when
        # it has the type it should have, so that a hostile or damaged record cannot crash us.
        config = event.config or {}
        self.preset = _typed(config, "preset", str, self.preset)
        self._watchdog_rule = (
            _typed(config, "watchdog_floor", float, _WATCHDOG_DEFAULTS[0]),
            _typed(config, "watchdog_factor", float, _WATCHDOG_DEFAULTS[1]),
        )
        self._watchdog_step_times.clear()
        self.devices = _typed(event.layout or {}, "devices", int, None)
        kinds = _typed(event.env or {}, "device_kinds", list, None) or [""]
        gpu = gpu_for_device_kind(kinds[0]) if isinstance(kinds[0], str) else None
        self.device_kinds = [k for k in kinds if isinstance(k, str) and k]
        self.device_count = _typed(event.env or {}, "device_count", int, None)
        self.tdp_w = gpu.tdp_w if gpu is not None and gpu.name != "cpu" else None
        self.power_reason = _typed(event.power or {}, "reason", str, None)
        self.param_count = event.param_count
        self.total_steps = event.total_steps
        self.started_at = event.time
        if self.first_started_at is None:
            self.first_started_at = event.time
        self.attempts += 1
        self.resumed_from_step = event.resumed_from_step
        self.step = event.start_step if event.start_step is not None else self.step
        # the last step's figures are an earlier attempt's, maybe of a step past this start
        self.loss = self.tokens_per_s = None
        self.end_status = self.end_error = self.ended_at = None
        self._step_times.clear()

    def _on_compile(self, event: Compile) -> None:
        self.compile_s += event.seconds or 0.0
        program = event.run_program_bytes
        if program is not None:
            self.compiled_memory_bytes = max(self.compiled_memory_bytes or 0, program)

    def _on_step(self, event: Step) -> None:
        self.step = event.step
        self.loss = event.loss
        self.curve.append(event.step, event.loss, event.lr or 0.0)
        self.tokens_per_s = event.tokens_per_s
        if event.tokens_seen is not None:
            self.tokens_seen = event.tokens_seen
        self._step_times.append((event.step, event.written_time))
        if event.step_time_s:
            self._watchdog_step_times.append(event.step_time_s)
        self._take_flops(event)
        self._take_energy(event)
        self.peak_memory_bytes = event.peak_memory_bytes

    def _on_pinned_host(self, event: PinnedHost) -> None:
        # a pause once per process (after the first step): the ETA's rate starts after it
        self._step_times.clear()

    def _on_eval(self, event: Eval) -> None:
        self.eval_loss = event.loss
        self.eval_curve.append(event.step, event.loss)

    def _take_flops(self, event: Step) -> None:
        """MFU and FLOPs per token under :data:`MFU_CONVENTION` (as ``summarize`` reports)."""
        per_token, mfu = event.model_flops_per_token, event.mfu
        self.mfu_reason = event.mfu_reason
        if per_token is not None or mfu is not None:
            self.mfu_convention = MFU_CONVENTION
        if per_token is not None:
            self.flops_per_token = getattr(per_token, MFU_CONVENTION)
        self.mfu = getattr(mfu, MFU_CONVENTION) if mfu is not None else None
        self.mfu_peak = (
            peak_label(mfu.peak_flops, mfu.peak_kind, self.device_kinds, self.device_count)
            if mfu is not None
            else None
        )

    def _take_energy(self, event: Step) -> None:
        energy_j = event.energy_j
        if energy_j is None:
            return
        self.energy_j = (self.energy_j or 0.0) + energy_j
        self.energy_tokens += event.tokens or 0
        if event.step_time_s:
            self.power_w.append(energy_j / event.step_time_s)

    def _on_stall(self, event: Stall) -> None:
        self.stalls = [*self.stalls[-(STALLS_KEPT - 1) :], event]
        self.stall_count += 1
        self.phase = event.phase

    def _on_pipeline(self, event: Pipeline) -> None:
        self.pipeline = event

    def _on_pipeline_timing(self, event: PipelineTiming) -> None:
        self.pipeline_timing = event

    def _on_checkpoint(self, event: Checkpoint) -> None:
        self.checkpoint_step = event.step

    def _on_run_end(self, event: RunEnd) -> None:
        self.end_status = event.status
        self.end_error = event.error
        self.ended_at = event.time
