"""Pipeline schedules as data: generation, validation, bounds and bubble formulas."""

from __future__ import annotations

import dataclasses

import pytest

from titan.errors import TitanError
from titan.schedules import (
    Action,
    build_schedule,
    execution_order,
    theoretical_bubble,
    validate_schedule,
)

GRID = [
    ("gpipe", 2, 4, 1),
    ("gpipe", 4, 8, 1),
    ("1f1b", 2, 4, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 4, 2, 1),
    ("zero-bubble", 2, 4, 1),
    ("zero-bubble", 4, 8, 1),
    ("interleaved-1f1b", 2, 4, 2),
    ("interleaved-1f1b", 4, 8, 2),
    ("interleaved-1f1b", 4, 4, 3),
]


@pytest.mark.parametrize(("name", "pp", "m", "v"), GRID)
def test_generated_schedules_are_complete_and_valid(name, pp, m, v):
    schedule = build_schedule(name, pp, m, v)
    per_chunk = 3 if name == "zero-bubble" else 2
    assert sum(len(g) for g in schedule.stages) == per_chunk * pp * v * m
    assert len(execution_order(schedule)) == per_chunk * pp * v * m


def _peak_in_flight(actions):
    live, peak = set(), 0
    for a in actions:
        if a.kind == "F":
            live.add((a.chunk, a.microbatch))
        elif a.kind in ("B", "W"):
            live.discard((a.chunk, a.microbatch))
        peak = max(peak, len(live))
    return peak


def test_1f1b_keeps_at_most_pp_microbatches_on_the_first_stage():
    schedule = build_schedule("1f1b", 4, 16)
    assert _peak_in_flight(schedule.stages[0]) == 4
    assert _peak_in_flight(schedule.stages[3]) == 1
    assert _peak_in_flight(build_schedule("gpipe", 4, 16).stages[0]) == 16


def test_zero_bubble_defers_weight_gradients_into_the_cool_down():
    first = build_schedule("zero-bubble", 4, 8).stages[0]
    kinds = "".join(a.kind for a in first)
    cool_down = kinds[kinds.rindex("F") + 1 :]  # the first stage waits for input gradients
    assert cool_down.count("W") >= 4 and kinds.endswith("W")  # deferred W's fill the waits
    assert kinds.index("W") > kinds.index("I") + 3


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_replay_of_zero_bubble_at_unit_times_has_the_zb_h1_bubble(pp, m):
    # t_F = t_I = t_W: (pp - 1)(t_F + t_I - t_W) idle for m >= pp (Qi et al. 2023, Sec. 3.1),
    # against 1F1B's (pp - 1)(t_F + t_I + t_W) in the same units
    from titan.schedules import simulate

    schedule = build_schedule("zero-bubble", pp, m)
    durations = {(a.chunk, a.microbatch, a.kind): 1.0 for stage in schedule.stages for a in stage}
    makespan = simulate(schedule, durations)
    if m >= pp:
        assert makespan == 3 * m + pp - 1
    assert 1 - 3 * m / makespan == pytest.approx(theoretical_bubble("zero-bubble", pp, m))
    one_f_one_b = build_schedule("1f1b", pp, m)
    both = {
        (a.chunk, a.microbatch, a.kind): 2.0 if a.kind == "B" else 1.0
        for g in one_f_one_b.stages
        for a in g
    }
    assert makespan < simulate(one_f_one_b, both) == 3 * (m + pp - 1)
    assert all(schedule.peak_in_flight(g) <= 2 * pp - g - 1 for g in range(pp))


def test_validator_rejects_a_backward_before_its_forward():
    good = build_schedule("1f1b", 2, 4)
    group0 = list(good.stages[0])
    first_b = next(i for i, a in enumerate(group0) if a.kind == "B")
    group0.insert(0, group0.pop(first_b))
    broken = dataclasses.replace(good, stages=(tuple(group0), good.stages[1]))
    with pytest.raises(TitanError, match="deadlocks"):
        validate_schedule(broken)


def test_validator_rejects_missing_repeated_and_misplaced_actions():
    good = build_schedule("gpipe", 2, 2)
    repeated = dataclasses.replace(
        good, stages=(good.stages[0] + good.stages[0][:1], good.stages[1])
    )
    with pytest.raises(TitanError, match="missing or repeated"):
        validate_schedule(repeated)
    misplaced = dataclasses.replace(
        good, stages=(good.stages[0] + (Action(0, 1, 0, "F"),), good.stages[1])
    )
    with pytest.raises(TitanError, match="is on stage 0"):
        validate_schedule(misplaced)


def test_validator_enforces_the_in_flight_bound():
    gpipe = build_schedule("gpipe", 4, 8)
    mislabelled = dataclasses.replace(gpipe, name="1f1b")
    with pytest.raises(
        TitanError, match="stage 0 holds 8 microbatches in flight, above its bound 4"
    ):
        validate_schedule(mislabelled)


def test_theoretical_bubbles():
    assert theoretical_bubble("1f1b", 2, 8) == pytest.approx(1 / 9)
    assert theoretical_bubble("gpipe", 4, 4) == pytest.approx(3 / 7)
    assert theoretical_bubble("interleaved-1f1b", 2, 8, 2) == pytest.approx(1 / 17)
    assert theoretical_bubble("zero-bubble", 2, 8) == pytest.approx(1 / 25)
    assert theoretical_bubble("zero-bubble", 4, 8) < theoretical_bubble("1f1b", 4, 8)
    assert theoretical_bubble("zero-bubble", 4, 1) == pytest.approx(6 / 9)  # the I chain bare


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("interleaved-1f1b", 4, 6, 2), "--microbatches 6 must be a multiple of --pp 4"),
        (("interleaved-1f1b", 2, 4, 1), "needs --virtual-stages >= 2"),
        (("1f1b", 2, 4, 2), "--virtual-stages 2 needs --schedule interleaved-1f1b"),
    ],
)
def test_invalid_combinations_are_rejected(args, message):
    with pytest.raises(TitanError, match=message):
        build_schedule(*args)


def test_replay_of_1f1b_with_unit_times_has_the_theoretical_bubble():
    from titan.schedules import simulate

    schedule = build_schedule("1f1b", 2, 4)
    durations = {(a.chunk, a.microbatch, a.kind): 1.0 for stage in schedule.stages for a in stage}
    makespan = simulate(schedule, durations)
    assert makespan == 10.0  # (m + p - 1) (t_F + t_B)
    busy = sum(1.0 for a in schedule.stages[0])
    assert 1 - busy / makespan == pytest.approx(theoretical_bubble("1f1b", 2, 4))
