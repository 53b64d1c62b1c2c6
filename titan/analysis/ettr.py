"""Restart analysis of one run: effective training time ratio (ETTR) and runtime goodput.

A run's ``events.jsonl`` is a chain of *attempts*: the events from one ``run_start`` to the next
``run_start`` or the end of the file. An attempt without ``run_end`` crashed; its end is its
last event's time. Given the current time, a last attempt without ``run_end`` whose last event
is younger than :data:`RUNNING_WINDOW_S` is still ``running`` instead: its steps all count (no
progress is lost yet).

Definitions (Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine Learning Research
Clusters", Sec. 3: ETTR = productive runtime / available wall-clock time; the badput categories
follow Google's "ML Productivity Goodput" (Google Cloud blog, 2024, and the
``ml-goodput-measurement`` library: initialization, program startup/compilation, data loading,
checkpoint save and restore, progress wasted by a disruption)):

    start(a)     = run_start's ``setup_start`` (when the trainer began setting the attempt up:
                   corpus, tokenizer, build, compilation, restore), or, in a record without it,
                   the time of ``run_start``
    available_s  = sum over attempts a of (last event time(a) - start(a))
    productive_s = sum over surviving steps s of (step_time_s - data_wait_s - save_s_inside)
    ETTR         = productive_s / available_s
    goodput      = productive_s / available_s, with badput (fractions of available_s):
        initialization     = first step start (or the attempt's end) - start - the seconds
                             of the compilations and of the ``pinned_host`` reservation
                             before it, fresh attempt (events written
                             together after several compilations tell only their lengths);
                             first step start = min over the attempt's step events k of
                             (k's write time - the step times up to k's), as a step event
                             may be written after its step ended (a stop flushes the last
                             ones together)
        checkpoint_restore = the same span in a resumed attempt (an upper bound: it also holds
                             whatever else the process did there)
        compilation        = sum of ``compile`` events' ``seconds``, of the compilations
                             that began after the attempt's start (one recorded after
                             ``run_start`` may have been made before it, e.g. for
                             ``--remat auto``; in a record without ``setup_start`` it began
                             before the attempt's start and is left out)
        data_wait          = sum of step events' ``data_wait_s`` (0 when the trainer does not
                             record it: ``data_wait_recorded`` is then False)
        checkpoint_save    = sum of ``checkpoint`` and ``checkpoint_failed`` events' ``seconds``
                             (the time the loop waited for the save; an async save's
                             background writing is inside the step times), and of
                             ``pinned_host`` events' (the memory the saves copy into,
                             reserved after the first step in no step's time; one reserved
                             before the first step is taken out of initialization)
        eval               = sum of ``eval`` events' ``seconds`` (validation, ``--eval-every``;
                             the trainer keeps it out of every step's time)
        lost_progress      = compute time of steps that did not survive
        other              = available_s - everything above (shutdown, logging, the time after
                             the last step of a crashed attempt), per attempt; 0 where the
                             durations exceed the wall time within the clocks' slack

Assumptions, stated because the records cannot show otherwise:

- Gaps between attempts (no process ran: the scheduler re-queued the job, or a person restarted
  it) are not available time. Kokolis et al. count the time a job is eligible to run; without the
  scheduler's record we cannot tell waiting-to-be-scheduled from not submitted, so ETTR and
  runtime goodput coincide here and ``restart_gap_s`` is reported on its own.
- Time a process spends before :func:`titan.trainer.train.train` is entered (imports, the
  launcher) is invisible to the records and counted nowhere; in a record without
  ``setup_start``, so is everything before ``run_start`` (tokenization, a compilation made to
  choose ``--remat auto``, the checkpoint restore): a ``compile`` event whose ``seconds`` reach
  back before ``run_start`` is then such a compilation, ended before ``run_start`` was
  written.
- The wall time comes from the events' times (the machine's clock) and the durations from the
  loop's own timer. When an attempt's durations add up to more than its wall time (beyond
  :data:`CLOCK_SLACK_S` or :data:`CLOCK_SLACK_FRACTION`), the clock went backwards during
  it, and ETTR and goodput are None (unknown) rather than a ratio above what the record shows.
- A duration that is missing counts as 0. One that is recorded but is not a finite number of
  at least 0 (a corrupt or hand-edited record) counts as 0 and makes ETTR and goodput None:
  a ratio built on it would be no measurement. A ``setup_start`` after its
  ``run_start``, before the start of the process that wrote it (``process.started``) or before
  the previous attempt's end is not believed: that attempt counts from its ``run_start``.
- A ``--remat auto`` candidate compiled and then passed over (over the usable memory) has its
  own ``compile`` event (``passed_over``), counted as compilation; in records older than that
  field it has none and its compilation is counted as initialization.
- ``step_time_s`` is the wall time between consecutive step completions, so a checkpoint saved
  between steps k and k+1 is inside step k+1's time: its ``seconds`` are taken out of that step.
  ``data_wait_s`` is taken to be inside ``step_time_s`` too.
- A stall (``stall`` event) that ends is inside its step's ``step_time_s``; one that ends the
  process leaves the time after the last step in ``other``. Stalls are counted, not timed.
- Surviving steps: attempt a+1 restores step r(a+1) (its ``start_step``). A step of attempt a
  survives when its number is <= min(r(a+1), bound(a+1)); the final attempt's bound is its
  ``run_end`` step when it ended ``completed`` or ``stopped`` (the trainer checkpoints then),
  else its last checkpoint. A step number counts once: a step redone after a restart is
  productive in the attempt whose result survived and lost in the others.

This module imports neither JAX nor DuckDB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from titan.telemetry.events import (
    Checkpoint,
    CheckpointFailed,
    Compile,
    Eval,
    Event,
    PinnedHost,
    RunEnd,
    RunStart,
    Stall,
    Step,
)

BADPUT_KINDS = (
    "initialization",
    "compilation",
    "data_wait",
    "checkpoint_save",
    "checkpoint_restore",
    "eval",
    "lost_progress",
    "other",
)
CLEAN_ENDS = ("completed", "stopped")
RUNNING = "running"
# Seconds since its last event within which a last attempt without run_end is taken as running:
# the trainer writes an event every step, and the watchdog's default floor (titan.config
# ``--watchdog-floor``, 300 s) is the longest a healthy step may go without one.
RUNNING_WINDOW_S = 300.0
# /proc's start time of a process (``run_start``'s ``process.started``) is counted in clock
# ticks from a boot time that is itself rounded to the second: a set-up start up to this much
# before it is still believed (:func:`_attempt_start`)
PROCESS_START_SLACK_S = 1.0
# How far an attempt's recorded durations (perf-counter seconds) may add up beyond its wall
# time (event times, ``time.time()``) before its clock is not believed (:attr:`Goodput.ettr`):
# the larger of this many seconds and CLOCK_SLACK_FRACTION of its wall time, room for the two
# clocks' rounding and for the span between a step's end and its event being written.
CLOCK_SLACK_S = 1.0
CLOCK_SLACK_FRACTION = 0.01
CRASHED = "crashed"


@dataclass
class Attempt:
    """One process's share of a run (times in seconds, unix time for ``start``/``end``)."""

    index: int
    start: float
    end: float
    status: str
    start_step: int
    resumed: bool
    init_s: float = 0.0
    restore_s: float = 0.0
    compile_s: float = 0.0
    # compilations made before the attempt's start (in a record without ``setup_start``),
    # outside the available time (module docstring)
    startup_compile_s: float = 0.0
    checkpoint_save_s: float = 0.0
    eval_s: float = 0.0
    data_wait_s: float = 0.0
    productive_s: float = 0.0
    lost_s: float = 0.0
    stalls: int = 0
    last_step: int | None = None
    last_checkpoint: int | None = None
    surviving_upto: int | None = None
    # (step number, compute seconds) of each step, in order.
    steps: list[tuple[int, float]] = field(default_factory=list, repr=False)
    # recorded durations that are not a finite number of at least 0 (:meth:`duration`)
    unreadable: int = 0

    def duration(self, value: float | None) -> float:
        """Seconds of a duration read from the record: the value when it is a finite number
        of at least 0, else 0; a value recorded but not such a number counts in
        :attr:`unreadable`."""
        if value is None:
            return 0.0
        if _is_finite(value) and value >= 0:
            return float(value)
        self.unreadable += 1
        return 0.0

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    @property
    def other_s(self) -> float:
        accounted = (
            self.init_s
            + self.restore_s
            + self.compile_s
            + self.checkpoint_save_s
            + self.eval_s
            + self.data_wait_s
            + self.productive_s
            + self.lost_s
        )
        return self.wall_s - accounted

    @property
    def clock_believed(self) -> bool:
        """Whether the wall time holds what the recorded durations add up to (within
        :data:`CLOCK_SLACK_S` or :data:`CLOCK_SLACK_FRACTION`): False when the machine's clock
        went backwards during the attempt (e.g. set back by NTP or by hand), which shrinks
        the wall time under the durations the loop measured."""
        slack = max(CLOCK_SLACK_S, CLOCK_SLACK_FRACTION * max(self.wall_s, 0.0))
        return self.other_s >= -slack


@dataclass
class Goodput:
    """ETTR and runtime goodput of a run (see the module docstring for the formulas)."""

    attempts: list[Attempt]
    data_wait_recorded: bool

    @property
    def available_s(self) -> float:
        return sum(a.wall_s for a in self.attempts)

    @property
    def productive_s(self) -> float:
        return sum(a.productive_s for a in self.attempts)

    @property
    def restarts(self) -> int:
        return max(len(self.attempts) - 1, 0)

    @property
    def restart_gap_s(self) -> float:
        """Time between an attempt's last event and the next attempt's start (not available)."""
        pairs = zip(self.attempts, self.attempts[1:], strict=False)
        return sum(max(b.start - a.end, 0.0) for a, b in pairs)

    @property
    def badput_s(self) -> dict[str, float]:
        """Seconds per badput kind (:data:`BADPUT_KINDS`), summed over attempts; an attempt's
        ``other`` is at least 0 (its durations may exceed its wall time within the clocks'
        slack, :attr:`Attempt.clock_believed`: no badput is negative)."""
        per_attempt = {
            "initialization": lambda a: a.init_s,
            "compilation": lambda a: a.compile_s,
            "data_wait": lambda a: a.data_wait_s,
            "checkpoint_save": lambda a: a.checkpoint_save_s,
            "checkpoint_restore": lambda a: a.restore_s,
            "eval": lambda a: a.eval_s,
            "lost_progress": lambda a: a.lost_s,
            "other": lambda a: max(a.other_s, 0.0),
        }
        return {kind: sum(get(a) for a in self.attempts) for kind, get in per_attempt.items()}

    @property
    def clock_believed(self) -> bool:
        """Whether every attempt's clock is believed (:attr:`Attempt.clock_believed`)."""
        return all(a.clock_believed for a in self.attempts)

    @property
    def ettr(self) -> float | None:
        """Kokolis et al. 2024: productive runtime / available wall-clock time; None when
        nothing was available or the record's clock is not believed (:attr:`clock_believed`:
        the ratio of two clocks that disagree is no measurement), or a recorded duration is
        unreadable (:attr:`unreadable`). At most 1: durations that exceed the wall time within
        the clocks' slack (:data:`CLOCK_SLACK_S`) read as 1."""
        available = self.available_s
        if available <= 0 or not self.clock_believed or self.unreadable:
            return None
        return min(1.0, self.productive_s / available)

    @property
    def unreadable(self) -> int:
        """Recorded durations that are not a finite number of at least 0, over all attempts."""
        return sum(a.unreadable for a in self.attempts)

    @property
    def goodput(self) -> float | None:
        """Runtime goodput: the productive share of the time the attempts ran."""
        return self.ettr

    def as_dict(self) -> dict[str, Any]:
        available = self.available_s
        badput = self.badput_s
        return {
            "ettr": self.ettr,
            "goodput": self.goodput,
            "available_s": available,
            "productive_s": self.productive_s,
            "restart_gap_s": self.restart_gap_s,
            "restarts": self.restarts,
            "badput_s": badput,
            "badput": {k: (v / available if available > 0 else None) for k, v in badput.items()},
            "data_wait_recorded": self.data_wait_recorded,
            "clock_believed": self.clock_believed,
            "unreadable_durations": self.unreadable,
            "attempts": [
                {
                    "index": a.index,
                    "status": a.status,
                    "start_step": a.start_step,
                    "last_step": a.last_step,
                    "last_checkpoint": a.last_checkpoint,
                    "surviving_upto": a.surviving_upto,
                    "wall_s": a.wall_s,
                    "productive_s": a.productive_s,
                    "lost_s": a.lost_s,
                }
                for a in self.attempts
            ],
        }


def split_attempts(events: Iterable[Event]) -> list[list[Event]]:
    """The events grouped by attempt, each group starting with its ``run_start``. Events before
    the first ``run_start`` are dropped."""
    attempts: list[list[Event]] = []
    for event in events:
        if isinstance(event, RunStart):
            attempts.append([event])
        elif attempts:
            attempts[-1].append(event)
    return attempts


def attempt_start(attempt: list[Event]) -> RunStart:
    """The ``run_start`` of one attempt of :func:`split_attempts` (its first event)."""
    start = attempt[0]
    assert isinstance(start, RunStart), start
    return start


def _is_finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and math.isfinite(value)


def _attempt_start(start: RunStart, earliest: float) -> float:
    """When an attempt began (module docstring): its ``setup_start`` where the record's value
    can be believed, a finite number not after its ``run_start``, and not before the start of
    the process that wrote it (``process.started``, less :data:`PROCESS_START_SLACK_S`) nor
    ``earliest`` (the previous attempt's end); else the time of its ``run_start``."""
    written = start.written_time
    setup = start.setup_start
    started = start.process.get("started") if isinstance(start.process, dict) else None
    if not (_is_finite(setup) and _is_finite(started)):
        return written
    floor = max(earliest, started - PROCESS_START_SLACK_S)
    return setup if floor <= setup <= written else written


def _attempt(index: int, events: list[Event], earliest: float) -> tuple[Attempt, bool]:
    """One attempt's accounting, before survival is known; and whether ``data_wait_s`` was seen.
    ``earliest``: the previous attempt's end (no attempt starts before it)."""
    start_event = attempt_start(events)
    resumed_from = start_event.resumed_from_step
    attempt = Attempt(
        index=index,
        start=_attempt_start(start_event, earliest),
        end=max(e.written_time for e in events),
        status=CRASHED,
        start_step=start_event.start_step or resumed_from or 0,
        resumed=resumed_from is not None,
    )
    first_step_start: float | None = None
    counted_before_steps = 0.0  # compilations and pinned_host reservations
    steps_s = 0.0  # the step times so far
    save_since_step = 0.0
    saw_data_wait = False
    for event in events[1:]:
        if isinstance(event, Compile):
            seconds = attempt.duration(event.seconds)
            began = event.written_time - seconds
            if began < attempt.start:  # before the attempt's start (module docstring)
                attempt.startup_compile_s += seconds
                continue
            attempt.compile_s += seconds
            if first_step_start is None:
                counted_before_steps += seconds
        elif isinstance(event, PinnedHost):
            seconds = attempt.duration(event.seconds)
            attempt.checkpoint_save_s += seconds
            if first_step_start is None:
                counted_before_steps += seconds
        elif isinstance(event, Checkpoint | CheckpointFailed):
            seconds = attempt.duration(event.seconds)
            attempt.checkpoint_save_s += seconds
            save_since_step += seconds
            if isinstance(event, Checkpoint):
                attempt.last_checkpoint = event.step
        elif isinstance(event, Eval):
            attempt.eval_s += attempt.duration(event.seconds)
        elif isinstance(event, Stall):
            attempt.stalls += 1
        elif isinstance(event, RunEnd):
            attempt.status = event.status or CRASHED
            attempt.last_step = event.step or attempt.last_step
        elif isinstance(event, Step):
            step_time = attempt.duration(event.step_time_s)
            wait = attempt.duration(event.data_wait_s)
            saw_data_wait |= event.data_wait_s is not None
            steps_s += step_time
            # each step's write time less the step times up to it bounds the first step's
            # start from above (time outside the steps, an eval, only raises it): a step event
            # written late (a stop flushes the last ones together) is not taken for its end
            began = event.written_time - steps_s
            first_step_start = began if first_step_start is None else min(first_step_start, began)
            compute = step_time - wait - save_since_step
            attempt.steps.append((event.step, compute if compute > 0 else 0.0))
            attempt.data_wait_s += wait
            attempt.last_step = event.step
            save_since_step = 0.0
    until = attempt.end if first_step_start is None else first_step_start
    pre_s = max(until - attempt.start - counted_before_steps, 0.0)
    if attempt.resumed:
        attempt.restore_s = pre_s
    else:
        attempt.init_s = pre_s
    return attempt, saw_data_wait


def _final_bound(attempt: Attempt) -> int:
    """The last step of the final attempt that the run keeps."""
    if attempt.status in (*CLEAN_ENDS, RUNNING) and attempt.last_step is not None:
        return attempt.last_step
    if attempt.last_checkpoint is not None:
        return attempt.last_checkpoint
    return attempt.start_step


def analyze(events: Iterable[Event], now: float | None = None) -> Goodput:
    """ETTR and goodput of a run from its events in file order (as
    :func:`~titan.telemetry.events.parse_event` gives them; unknown types are ignored). A
    run with no ``run_start`` gives no attempts and ``ettr`` None. ``now`` (Unix seconds) lets
    a recent last attempt without ``run_end`` count as running (module doc)."""
    attempts: list[Attempt] = []
    saw_wait = False
    for index, group in enumerate(split_attempts(events)):
        attempt, seen = _attempt(index, group, attempts[-1].end if attempts else -math.inf)
        attempts.append(attempt)
        saw_wait |= seen
    if attempts and attempts[-1].status == CRASHED and now is not None:
        if now - attempts[-1].end < RUNNING_WINDOW_S:
            attempts[-1].status = RUNNING
    bound: int | None = None
    counted: set[int] = set()
    for attempt in reversed(attempts):
        if bound is None:
            bound = _final_bound(attempt)
        attempt.surviving_upto = bound
        for number, compute_s in reversed(attempt.steps):
            if number <= bound and number not in counted:
                counted.add(number)
                attempt.productive_s += compute_s
            else:
                attempt.lost_s += compute_s
        bound = min(bound, attempt.start_step)
    return Goodput(attempts, saw_wait)
