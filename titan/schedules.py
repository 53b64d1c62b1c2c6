"""Pipeline schedules as data: per stage, an ordered list of actions; and their validator.

Terms: ``pp`` stages (each on its own devices), ``v`` virtual stages (model chunks) per stage,
``m`` microbatches. The model is cut into ``pp * v`` chunks; chunk ``c`` lives on stage
``c % pp`` as its virtual chunk ``c // pp`` (the interleaved placement of Narayanan et al. 2021,
Sec. 2.2.2). An action is (stage, chunk, microbatch, kind) with kind one of ``F`` (forward),
``B`` (backward: input and weight gradients), ``I`` (backward, input gradient only) and ``W``
(backward, weight gradient only). Each stage executes its list in order; the controller issues
the lists interleaved in dependency order and JAX's asynchronous dispatch runs stages
concurrently.

Schedules, each registered once in :data:`SCHEDULES` (a :class:`ScheduleSpec`: builder, option
check, bubble, in-flight bound). Config validation (``titan.config``), the executor
(``titan.layouts.mpmd``, ``titan.layouts.builders``) and the planner (``titan.planning``) all
ask the registry:

- ``gpipe`` (Huang et al. 2019): all forwards, then all backwards.
- ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021, Sec. 2.2.1): ``pp - g - 1`` warm-up
  forwards on stage g, then one forward one backward, then the remaining backwards.
- ``interleaved-1f1b`` (Narayanan et al. 2021, Sec. 2.2.2): 1F1B over ``v`` chunks per stage;
  needs ``m`` to be a multiple of ``pp``.
- ``zero-bubble`` (ZB-H1, Qi et al. 2023, Sec. 3.1): 1F1B's warm-up with the backward split
  into I and W; input gradients go first, and W actions run where 1F1B idles waiting for
  input gradients (the orders are list-scheduled at equal action times, as the paper does).

Theoretical bubble fractions (idle share of a stage's step time), with t_F, t_B the forward and
backward times of one microbatch on one stage:

- GPipe and 1F1B: (pp - 1) / (m + pp - 1) (Narayanan et al. 2021, Sec. 2.2.1).
- Interleaved: (pp - 1) / (v m + pp - 1) (ibid., Sec. 2.2.2: the bubble shrinks by v).
- ZB-H1: the bubble is (pp - 1)(t_F + t_I - t_W) against 1F1B's (pp - 1)(t_F + t_I + t_W)
  (Qi et al. 2023, Sec. 3.1); with t_F = t_I = t_W this is (pp - 1) / (3 m + pp - 1) for
  m >= pp. With fewer microbatches the I chain is not covered: the step takes
  3 m + pp - 1 + (pp - m) units (Titan's ZB-H1 orders, :func:`_zero_bubble_orders`, replayed
  by :func:`simulate` at unit times take exactly these).

Each is idle / (idle + busy) with a stage's idle and busy time in one unit ((pp - 1, m),
(pp - 1, v m), (pp - 1 + max(0, pp - m), 3 m): :attr:`ScheduleSpec.bubble`); the planner's
bubble relative to the ideal step, idle / busy (:func:`bubble_ratio`), is the same formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from titan.errors import TitanError

FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = "F", "B", "I", "W"


@dataclass(frozen=True)
class Action:
    """One unit of work of one stage.

    Attributes:
        stage: the stage (its devices) that runs it.
        chunk: global model chunk, 0 .. pp * v - 1 (chunk % pp == stage).
        microbatch: 0 .. m - 1.
        kind: F, B, I or W (module docstring).
    """

    stage: int
    chunk: int
    microbatch: int
    kind: str

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}c{self.chunk}"


@dataclass(frozen=True)
class Schedule:
    """Per-stage ordered action lists of one training step."""

    name: str
    pp: int
    microbatches: int
    virtual_stages: int
    stages: tuple[tuple[Action, ...], ...]

    @property
    def chunks(self) -> int:
        return self.pp * self.virtual_stages

    def in_flight_bound(self, stage: int) -> int:
        """Documented peak of microbatches whose residuals (forward activations) ``stage``
        holds: :attr:`ScheduleSpec.in_flight_bound` of this schedule."""
        spec = SCHEDULES[self.name]
        return spec.in_flight_bound(stage, self.pp, self.microbatches, self.virtual_stages)

    def peak_in_flight(self, stage: int) -> int:
        """Microbatches whose residuals ``stage`` holds at its peak, counted on its action list
        (a forward makes one live, the backward that frees it, B or W, ends it)."""
        live: set[tuple[int, int]] = set()
        peak = 0
        for action in self.stages[stage]:
            key = (action.chunk, action.microbatch)
            if action.kind == FORWARD:
                live.add(key)
            elif action.kind in (BACKWARD, BACKWARD_WEIGHT):
                live.discard(key)
            peak = max(peak, len(live))
        return peak


def _one_f_one_b(stage: int, pp: int, m: int, backward_kind: str) -> list[tuple[int, str]]:
    warmup = min(pp - stage - 1, m)
    order = [(i, FORWARD) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(warmup + i, FORWARD), (i, backward_kind)]
    order += [(i, backward_kind) for i in range(m - warmup, m)]
    return order


def _gpipe(stage: int, pp: int, m: int, v: int) -> list[Action]:
    forwards = [Action(stage, stage, i, FORWARD) for i in range(m)]
    return forwards + [Action(stage, stage, i, BACKWARD) for i in range(m)]


def _1f1b(stage: int, pp: int, m: int, v: int) -> list[Action]:
    return [Action(stage, stage, i, k) for i, k in _one_f_one_b(stage, pp, m, BACKWARD)]


def _zero_bubble(stage: int, pp: int, m: int, v: int) -> list[Action]:
    return [Action(stage, stage, i, k) for i, k in _zero_bubble_orders(pp, m)[stage]]


# Tie-break of actions that could start at once: the input gradient first (the next stage
# down waits for it), then a forward, then a weight gradient (it fills what would idle).
_ZB_RANK = {BACKWARD_INPUT: 0, FORWARD: 1, BACKWARD_WEIGHT: 2}


@cache
def _zero_bubble_orders(pp: int, m: int) -> tuple[tuple[tuple[int, str], ...], ...]:
    """Each stage's (microbatch, kind) order of ZB-H1 (Qi et al. 2023, Sec. 3.1), found as
    that paper finds its schedules, by list scheduling at t_F = t_I = t_W: the action that can
    start first runs (ties: :data:`_ZB_RANK`, then the lower stage). Stage g starts a forward
    while fewer than ``pp - g`` of its forwards wait for their I (1F1B's warm-up) and fewer than
    ``2 pp - g - 1`` microbatches wait for their W (their residuals stay alive until W runs:
    the in-flight bound). So W fills the time 1F1B idles, and the step takes
    3 m + pp - 1 + max(0, pp - m) units against 1F1B's 3 (m + pp - 1)."""
    done: dict[tuple[int, int, str], int] = {}  # (stage, microbatch, kind) -> finish
    free = [0] * pp
    ran: list[dict[str, int]] = [dict.fromkeys(_ZB_RANK, 0) for _ in range(pp)]
    orders: list[list[tuple[int, str]]] = [[] for _ in range(pp)]
    for _ in range(3 * pp * m):
        start, _rank, g, kind = min(
            (max(free[g], ready), _ZB_RANK[kind], g, kind)
            for g in range(pp)
            for kind, ready in _zb_ready(g, pp, m, ran[g], done).items()
        )
        i = ran[g][kind]
        done[(g, i, kind)] = free[g] = start + 1
        ran[g][kind] += 1
        orders[g].append((i, kind))
    return tuple(tuple(order) for order in orders)


def _zb_ready(
    g: int, pp: int, m: int, ran: dict[str, int], done: dict[tuple[int, int, str], int]
) -> dict[str, int]:
    """Stage g's next F, I and W that may run now, each with the time its inputs are ready."""
    f, i, w = ran[FORWARD], ran[BACKWARD_INPUT], ran[BACKWARD_WEIGHT]
    ready: dict[str, int] = {}
    upstream = done.get((g - 1, f, FORWARD)) if g else 0
    if f < m and f - i < pp - g and f - w < 2 * pp - g - 1 and upstream is not None:
        ready[FORWARD] = upstream
    downstream = done.get((g + 1, i, BACKWARD_INPUT)) if g < pp - 1 else 0
    if i < f and downstream is not None:
        ready[BACKWARD_INPUT] = max(done[(g, i, FORWARD)], downstream)
    if w < i:
        ready[BACKWARD_WEIGHT] = done[(g, w, BACKWARD_INPUT)]
    return ready


def _interleaved(stage: int, pp: int, m: int, v: int) -> list[Action]:
    total = m * v

    def forward(k: int) -> Action:
        chunk_in_group = (k // pp) % v
        microbatch = (k // (pp * v)) * pp + k % pp
        return Action(stage, chunk_in_group * pp + stage, microbatch, FORWARD)

    def backward(k: int) -> Action:
        chunk_in_group = v - 1 - (k // pp) % v
        microbatch = (k // (pp * v)) * pp + k % pp
        return Action(stage, chunk_in_group * pp + stage, microbatch, BACKWARD)

    warmup = min(2 * (pp - stage - 1) + (v - 1) * pp, total)
    actions = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        actions += [forward(warmup + k), backward(k)]
    return actions + [backward(k) for k in range(total - warmup, total)]


def _check_one_chunk(name: str, pp: int, m: int, v: int) -> None:
    if v != 1:
        raise TitanError(f"--virtual-stages {v} needs --schedule interleaved-1f1b")


def _check_interleaved(name: str, pp: int, m: int, v: int) -> None:
    if v < 2:
        raise TitanError("--schedule interleaved-1f1b needs --virtual-stages >= 2")
    if m % pp:
        raise TitanError(
            f"--microbatches {m} must be a multiple of --pp {pp} for --schedule interleaved-1f1b"
        )


def _one_chunk_bubble(pp: int, m: int, v: int) -> tuple[int, int]:
    """GPipe's and 1F1B's (idle, busy), in t_F + t_B: (pp - 1, m), for any m."""
    return pp - 1, m


@dataclass(frozen=True)
class ScheduleSpec:
    """Everything known about one pipeline schedule, registered once in :data:`SCHEDULES`.

    Attributes:
        name: the ``--schedule`` value.
        short: label in the planner's tables.
        builder: (stage, pp, m, v) -> that stage's ordered actions.
        check: (name, pp, m, v) -> None; raises TitanError for options the schedule rejects.
        bubble: (pp, m, v) -> (idle, busy): a stage's idle and busy time in one step, in one
            unit (module docstring, with sources).
        in_flight: (stage, pp, m, v) -> documented peak of chunk-microbatches whose residuals
            the stage holds (before the cap at m v).
        split_backward: the backward runs as I and W actions (input, weight gradients).
        virtual_stages: takes more than one model chunk per stage.
    """

    name: str
    short: str
    builder: Callable[[int, int, int, int], list[Action]]
    check: Callable[[str, int, int, int], None]
    bubble: Callable[[int, int, int], tuple[int, int]]
    in_flight: Callable[[int, int, int, int], int]
    split_backward: bool = False
    virtual_stages: bool = False

    def in_flight_bound(self, stage: int, pp: int, m: int, v: int) -> int:
        """Documented peak of chunk-microbatches in flight on ``stage``, at most ``m v``:
        GPipe m; 1F1B pp - stage; interleaved the warm-up forwards plus one,
        ``2 (pp - stage - 1) + (v - 1) pp + 1`` (Narayanan et al. 2021, Sec. 2.2.2); ZB-H1 here
        ``2 pp - stage - 1``: the first stage's is 1F1B's plus ``pp - 1`` deferred W actions,
        whose residuals stay alive until W runs, and no stage holds more
        (:func:`_zero_bubble_orders`)."""
        return min(self.in_flight(stage, pp, m, v), m * v)


SCHEDULES: dict[str, ScheduleSpec] = {
    spec.name: spec
    for spec in (
        ScheduleSpec(
            "gpipe", "gpipe", _gpipe, _check_one_chunk, _one_chunk_bubble, lambda g, p, m, v: m
        ),
        ScheduleSpec(
            "1f1b", "1f1b", _1f1b, _check_one_chunk, _one_chunk_bubble, lambda g, p, m, v: p - g
        ),
        ScheduleSpec(
            "interleaved-1f1b",
            "int",
            _interleaved,
            _check_interleaved,
            lambda p, m, v: (p - 1, v * m),
            lambda g, p, m, v: 2 * (p - g - 1) + (v - 1) * p + 1,
            virtual_stages=True,
        ),
        ScheduleSpec(
            "zero-bubble",
            "zb",
            _zero_bubble,
            _check_one_chunk,
            lambda p, m, v: (p - 1 + max(0, p - m), 3 * m),
            lambda g, p, m, v: 2 * p - g - 1,
            split_backward=True,
        ),
    )
}


def schedule_spec(name: str) -> ScheduleSpec:
    """The registered schedule ``name``.

    Raises:
        TitanError: ``name`` is not registered.
    """
    if name not in SCHEDULES:
        raise TitanError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name]


def check_schedule_options(name: str, pp: int, microbatches: int, virtual_stages: int) -> None:
    """Raises TitanError (one line, naming the option) for combinations a schedule rejects."""
    schedule_spec(name).check(name, pp, microbatches, virtual_stages)


def bubble_ratio(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Pipeline idle time over the ideal (bubble-free) step time: idle / busy of the schedule's
    :attr:`ScheduleSpec.bubble` (module docstring); 0 without a pipeline."""
    idle, busy = schedule_spec(name).bubble(pp, microbatches, virtual_stages)
    return idle / busy


def theoretical_bubble(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of each stage's step time, idle / (idle + busy) of the schedule's
    :attr:`ScheduleSpec.bubble` (module docstring for formulas and sources)."""
    idle, busy = schedule_spec(name).bubble(pp, microbatches, virtual_stages)
    return idle / (idle + busy)


def build_schedule(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """The action lists of schedule ``name``, validated.

    Raises:
        TitanError: options the schedule rejects, or a generated schedule that fails validation.
    """
    check_schedule_options(name, pp, microbatches, virtual_stages)
    build = SCHEDULES[name].builder
    stages = [build(g, pp, microbatches, virtual_stages) for g in range(pp)]
    schedule = Schedule(name, pp, microbatches, virtual_stages, tuple(tuple(g) for g in stages))
    validate_schedule(schedule)
    return schedule


def _dependencies(action: Action, chunks: int) -> list[tuple[int, int, str]]:
    c, i = action.chunk, action.microbatch
    if action.kind == FORWARD:
        return [(c - 1, i, FORWARD)] if c > 0 else []
    if action.kind == BACKWARD_WEIGHT:
        return [(c, i, BACKWARD_INPUT)]
    deps = [(c, i, FORWARD)]
    if c < chunks - 1:
        deps.append((c + 1, i, "grad"))
    return deps


def _expected(schedule: Schedule) -> set[tuple[int, int, str]]:
    kinds = {FORWARD, BACKWARD}
    if SCHEDULES[schedule.name].split_backward:
        kinds = {FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT}
    return {
        (c, i, k)
        for c in range(schedule.chunks)
        for i in range(schedule.microbatches)
        for k in kinds
    }


def execution_order(schedule: Schedule) -> list[Action]:
    """The actions in an order that respects every dependency, stages advancing round-robin
    (the order the controller dispatches them in).

    Raises:
        TitanError: the schedule deadlocks (a stage waits on an action that never comes).
    """
    done: set[tuple[int, int, str]] = set()
    cursors = [0] * schedule.pp
    order: list[Action] = []
    remaining = sum(len(g) for g in schedule.stages)
    while len(order) < remaining:
        progressed = False
        for g, actions in enumerate(schedule.stages):
            while cursors[g] < len(actions):
                action = actions[cursors[g]]
                if not all(dep in done for dep in _dependencies(action, schedule.chunks)):
                    break
                done.add((action.chunk, action.microbatch, action.kind))
                if action.kind in (BACKWARD, BACKWARD_INPUT):
                    done.add((action.chunk, action.microbatch, "grad"))
                order.append(action)
                cursors[g] += 1
                progressed = True
        if not progressed:
            stuck = [
                str(acts[cursors[g]])
                for g, acts in enumerate(schedule.stages)
                if cursors[g] < len(acts)
            ]
            raise TitanError(f"schedule {schedule.name} deadlocks: stages wait at {stuck}")
    return order


def validate_schedule(schedule: Schedule) -> None:
    """Check that every action is on its chunk's stage, appears exactly once, every dependency
    is respected (a forward after the previous chunk's forward, a backward after its forward and
    the next chunk's backward, W after I), and each stage's in-flight microbatches stay within
    :meth:`Schedule.in_flight_bound`.

    Raises:
        TitanError: naming the first violation.
    """
    seen: list[tuple[int, int, str]] = []
    for g, actions in enumerate(schedule.stages):
        for action in actions:
            if action.stage != g or action.chunk % schedule.pp != g:
                raise TitanError(f"schedule {schedule.name}: {action} is on stage {g}")
            seen.append((action.chunk, action.microbatch, action.kind))
    if len(seen) != len(set(seen)) or set(seen) != _expected(schedule):
        raise TitanError(f"schedule {schedule.name}: actions missing or repeated")
    execution_order(schedule)
    for g in range(schedule.pp):
        peak = schedule.peak_in_flight(g)
        if peak > schedule.in_flight_bound(g):
            raise TitanError(
                f"schedule {schedule.name}: stage {g} holds {peak} microbatches in flight, "
                f"above its bound {schedule.in_flight_bound(g)}"
            )


def simulate(schedule: Schedule, durations: dict[tuple[int, int, str], float]) -> float:
    """Makespan (seconds) of ``schedule`` on ideal hardware: each stage runs its actions in
    order, an action starts when its stage is free and its dependencies have finished, and
    nothing else costs time (no dispatch, no transfer latency).

    Args:
        durations: (chunk, microbatch, kind) -> measured seconds of that action.
    """
    finish: dict[tuple[int, int, str], float] = {}
    free = [0.0] * schedule.pp
    for action in execution_order(schedule):
        deps = [
            finish[
                (
                    c,
                    i,
                    BACKWARD_INPUT
                    if k == "grad" and (c, i, BACKWARD_INPUT) in finish
                    else (BACKWARD if k == "grad" else k),
                )
            ]
            for c, i, k in _dependencies(action, schedule.chunks)
        ]
        start = max([free[action.stage], *deps])
        key = (action.chunk, action.microbatch, action.kind)
        finish[key] = start + durations[key]
        free[action.stage] = finish[key]
    return max(free)
