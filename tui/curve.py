"""A run's loss and learning-rate curve, kept in bounded memory for the monitor.

The monitor follows a run for its whole life (a million steps and more); keeping every point
would grow without bound and make each redraw slower. :class:`Curve` keeps at most
:data:`MAX_POINTS` points by M4 decimation (Jugel et al. 2014, "M4: A Visualization-Oriented
Time Series Data Aggregation", VLDB): the steps are cut into at most ``MAX_POINTS // 4``
buckets of equal count, and each bucket keeps its first, lowest-loss, highest-loss and last
point. A line drawn through those points has the same extremes as one through every point, so
spikes and the final loss are never lost. When the buckets fill up, neighbours are merged
pairwise (a bucket's width doubles), so appending is O(1) amortised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

# Points kept at most: M4 draws a line exactly with 4 points per pixel column (Jugel et al.
# 2014), and a chart 128 terminal columns wide has 256 (plotext's braille: two dots a column).
MAX_POINTS = 1024

# (arrival index, step, loss, learning rate: None for a curve without one, such as eval losses)
Point = tuple[int, int, float | None, float | None]


def _value(point: Point) -> float | None:
    """The loss of a point when it is a finite number (None otherwise: never an extreme)."""
    loss = point[2]
    return loss if isinstance(loss, int | float) and math.isfinite(loss) else None


@dataclass
class _Bucket:
    """Consecutive points summarised by their first, lowest, highest and last."""

    first: Point
    low: Point
    high: Point
    last: Point

    def add(self, point: Point) -> None:
        self.last = point
        value = _value(point)
        if value is not None:
            low, high = _value(self.low), _value(self.high)
            if low is None or value < low:
                self.low = point
            if high is None or value > high:
                self.high = point

    def merge(self, later: _Bucket) -> None:
        for point in (later.low, later.high):
            self.add(point)
        self.last = later.last

    def points(self) -> list[Point]:
        return sorted({self.first, self.low, self.high, self.last})


class Curve:
    """``(step, loss, learning rate)`` of each step (or ``(step, eval loss)`` of each
    evaluation), M4-decimated to at most ``max_points``.

    Args:
        max_points: points kept at most (a multiple of 4; every point is kept while fewer than
            ``max_points // 4`` were appended).
    """

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._capacity = max(1, max_points // 4)  # buckets
        self._buckets: list[_Bucket] = []
        self._width = 1  # points per bucket (the last one may hold fewer)
        self._filled = 0  # points in the last bucket
        self.count = 0  # points appended

    def append(self, step: int, loss: float | None, lr: float | None = None) -> None:
        """Add one step's point (after every earlier step's)."""
        point = (self.count, step, loss, lr)
        self.count += 1
        if self._buckets and self._filled < self._width:
            self._buckets[-1].add(point)
            self._filled += 1
            return
        if len(self._buckets) == self._capacity:
            self._halve()
            if self._filled < self._width:
                self._buckets[-1].add(point)
                self._filled += 1
                return
        self._buckets.append(_Bucket(point, point, point, point))
        self._filled = 1

    def copy(self) -> Curve:
        """An independent copy (its buckets copied: appends to either leave the other as is)."""
        copy = Curve()
        copy._capacity, copy._width, copy._filled, copy.count = (
            self._capacity,
            self._width,
            self._filled,
            self.count,
        )
        copy._buckets = [dataclasses.replace(bucket) for bucket in self._buckets]
        return copy

    def _halve(self) -> None:
        """Merge neighbouring buckets pairwise: half as many, twice as wide."""
        merged = []
        for i in range(0, len(self._buckets), 2):
            bucket = self._buckets[i]
            if i + 1 < len(self._buckets):
                bucket.merge(self._buckets[i + 1])
            merged.append(bucket)
        last_full = len(self._buckets) % 2 == 0
        self._filled = self._filled + (self._width if last_full else 0)
        self._buckets = merged
        self._width *= 2

    def _points(self) -> list[Point]:
        return [p for bucket in self._buckets for p in bucket.points()]

    @property
    def steps(self) -> list[int]:
        """The step of each point kept, in order."""
        return [p[1] for p in self._points()]

    @property
    def losses(self) -> list[float | None]:
        """The loss of each point kept (the steps' order)."""
        return [p[2] for p in self._points()]

    @property
    def lrs(self) -> list[float | None]:
        """The learning rate of each point kept (the steps' order)."""
        return [p[3] for p in self._points()]


def thin(
    steps: Sequence[float], values: Sequence[float | None], columns: int
) -> tuple[list[float], list[float | None]]:
    """The points of a line as a chart ``columns`` dots wide can show them: the steps cut into
    ``columns`` ranges of equal width, each keeping its lowest and highest point in step order
    (min-max decimation, the pixel-column half of M4: Jugel et al. 2014), the first point of a
    range without a finite value, and the line's first and last points. A line of at most
    ``2 * columns`` points comes back whole.

    Args:
        steps: the x of each point, ascending. values: the y of each (None or NaN: no value).
        columns: the chart's width in dots (plotext's braille: two a terminal column).

    Returns:
        ``(steps, values)`` of the points kept (at most ``2 * columns + 2``), in step order.
    """
    if len(steps) <= 2 * columns:
        return list(steps), list(values)
    first, span = steps[0], (steps[-1] - steps[0]) or 1
    kept = {0, len(steps) - 1}
    ranges: dict[int, list[int]] = {}  # range -> [lowest, highest] or [first without value]
    for i, (step, value) in enumerate(zip(steps, values, strict=True)):
        column = min(int((step - first) * columns / span), columns - 1)
        extremes = ranges.get(column)
        number = value if isinstance(value, int | float) and math.isfinite(value) else None
        if extremes is None or (number is not None and len(extremes) == 1):
            ranges[column] = [i, i] if number is not None else [i]
        elif number is not None:  # extremes: [lowest, highest], both of finite values
            if number < cast(float, values[extremes[0]]):
                extremes[0] = i
            if number > cast(float, values[extremes[1]]):
                extremes[1] = i
    for extremes in ranges.values():
        kept.update(extremes)
    order = sorted(kept)
    return [steps[i] for i in order], [values[i] for i in order]


def nice_ticks(low: float, high: float, most: int) -> list[float]:
    """At most ``most`` (at least 2) evenly spaced axis ticks inside ``[low, high]``, a step of
    1, 2 or 5 times a power of ten apart ("nice numbers": Heckbert 1990, "Nice Numbers for
    Graph Labels", Graphics Gems I, pp. 61-63), so that labels read ``0 50 100 150`` rather
    than plotext's ``1.0 50.8 100.5``. One tick at ``low`` when the range is empty, none when
    a bound is not finite."""
    if not (math.isfinite(low) and math.isfinite(high)) or high < low:
        return []
    if high == low:
        return [low]
    power = 10.0 ** math.floor(math.log10((high - low) / max(most, 2)))
    for step in (m * power * scale for scale in (1, 10, 100) for m in (1, 2, 5)):
        first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
        if last - first + 1 <= max(most, 2):
            break
    ticks = [n * step for n in range(first, last + 1)]
    return [round(t, 12) for t in ticks]


def tick_label(value: float) -> str:
    """An axis tick as text: a whole number with thousands separators, else 4 significant
    digits (``1,000``, ``2.5``, ``0.0003``)."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.4g}"
