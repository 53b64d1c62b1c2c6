"""The monitor's bounded curve: M4 decimation keeps the extremes, the ends and a bound."""

from __future__ import annotations

import itertools
import math

import pytest

from tui.curve import Curve, nice_ticks, thin, tick_label


def _wave(step: int) -> float:
    """A decaying loss with one spike (step 7,777) and one dip (step 31,337)."""
    return 10.0 + 100.0 * (step == 7_777) - 9.5 * (step == 31_337) + math.sin(step / 50) / step


def test_curve_keeps_every_point_while_under_its_bound():
    curve = Curve(max_points=64)
    for step in range(1, 17):
        curve.append(step, float(step), 0.1)
    assert curve.steps == list(range(1, 17)) and curve.losses == [float(s) for s in range(1, 17)]


def test_curve_is_bounded_and_keeps_minimum_maximum_first_and_last():
    curve = Curve(max_points=64)
    steps = range(1, 50_001)
    for step in steps:
        curve.append(step, _wave(step), step * 1e-6)
    losses = curve.losses
    assert curve.count == 50_000 and 16 < len(losses) <= 64
    assert max(losses) == max(map(_wave, steps)) and 7_777 in curve.steps
    assert min(losses) == min(map(_wave, steps)) and 31_337 in curve.steps
    assert (curve.steps[0], curve.steps[-1]) == (1, 50_000)
    assert curve.steps == sorted(curve.steps) and curve.lrs[-1] == 50_000 * 1e-6


def test_curve_skips_non_finite_losses_as_extremes():
    curve = Curve(max_points=8)
    for step, loss in enumerate([3.0, math.nan, None, 1.0, math.inf, 2.0, 5.0, 4.0, 0.5, 6.0]):
        curve.append(step, loss, 0.0)
    finite = [v for v in curve.losses if isinstance(v, float) and math.isfinite(v)]
    assert min(finite) == 0.5 and max(finite) == 6.0 and len(curve.losses) <= 8


def test_thin_keeps_each_columns_extremes_and_the_ends():
    steps = list(range(1, 10_001))
    values = [_wave(step) for step in steps]
    values[5_000] = math.nan  # no value: never an extreme, the column keeps its others
    kept_steps, kept_values = thin(steps, values, columns=40)
    finite = [v for v in kept_values if math.isfinite(v)]
    assert len(kept_steps) <= 2 * 40 + 2 and kept_steps == sorted(kept_steps)
    assert (kept_steps[0], kept_steps[-1]) == (1, 10_000)
    every = [v for v in values if math.isfinite(v)]
    assert 7_777 in kept_steps and (min(finite), max(finite)) == (min(every), max(every))
    assert thin(steps[:80], values[:80], columns=40) == (steps[:80], values[:80])


@pytest.mark.parametrize(
    ("low", "high", "most", "labels"),
    [
        (1, 200, 6, ["50", "100", "150", "200"]),  # plotext's own: 1.0 50.8 100.5 150.2 200.0
        (0.67, 5.0, 5, ["1", "2", "3", "4", "5"]),
        (0.0, 3e-4, 4, ["0", "0.0001", "0.0002", "0.0003"]),
        (1, 1_000_000, 8, ["200,000", "400,000", "600,000", "800,000", "1,000,000"]),
        (-3, 7, 5, ["-2", "0", "2", "4", "6"]),
        (4.0, 4.0, 5, ["4"]),
        (1.0, math.inf, 5, []),
    ],
)
def test_axis_ticks_are_evenly_spaced_round_numbers(low, high, most, labels):
    ticks = nice_ticks(low, high, most)
    assert [tick_label(t) for t in ticks] == labels
    assert all(low <= t <= high for t in ticks) and len(ticks) <= max(most, 2)
    gaps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert len(gaps) <= 1
