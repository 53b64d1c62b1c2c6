"""Line charts (textual-plotext): a run's loss and learning rate, or two runs' losses overlaid."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeGuard

from textual.app import RenderResult
from textual_plotext import PlotextPlot

from tui.curve import nice_ticks, thin, tick_label

# Lines drawn with braille dots when colour is on; plain characters for --no-color / ASCII.
_MARKERS = ("braille", "braille")
_ASCII_MARKERS = ("*", "+")
# Axis ticks at even, round values (tui.curve.nice_ticks), about one per this many columns on
# the step axis and rows on the value axis: room for a label such as "1,000,000" between them.
_COLUMNS_PER_X_TICK, _ROWS_PER_Y_TICK = 14, 3
# (label, steps, values): a line; a value None or NaN is no point (tui.curve.thin).
Series = tuple[str, Sequence[float], Sequence[float | None]]
# The largest magnitude drawn: plotext's scale overflows past about 1e300 (a loss of -1e308
# raised OverflowError in its render); a record's value beyond it is no point, as NaN is.
_LARGEST = 1e200


class CurvePlot(PlotextPlot):
    """One or two ``(label, steps, values)`` series on step axes.

    Args:
        title: the chart's title.
        ascii_only: draw with ``*`` and ``+`` instead of braille dots.
        id: the widget id.
    """

    def __init__(self, title: str, *, ascii_only: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.markers = _ASCII_MARKERS if ascii_only else _MARKERS
        self.series: list[Series] = []
        self._drawn: list[tuple] | None = None  # the _shape of the series drawn
        self._plotted_width: int | None = None  # the width the series were thinned for

    def show(self, series: Sequence[Series]) -> None:
        """Replace the series and redraw; nothing is redrawn when no series gained or lost a
        point (plotext rebuilds the whole chart on each draw)."""
        shape = _shape(series)  # taken now: the monitor's lists grow in place
        if shape == self._drawn:
            return
        self._drawn = shape
        self.series = list(series)
        self._plotted_width = None
        self.refresh()

    def render(self) -> RenderResult:
        """The chart, its series thinned to what its width shows (:func:`tui.curve.thin`):
        plotext's time grows with the points, about 20 ms for the 735 of a curve of 1M steps
        on 118 columns and 12 ms for the 440 that show (bench/console.py --scale)."""
        if self._plotted_width != self.size.width:
            self._plot_series(self.size.width)
        return super().render()

    def _plot_series(self, width: int) -> None:
        """Hand the series to plotext for a chart ``width`` columns wide."""
        self._plotted_width = width
        plt = self.plt
        plt.clear_data()
        plt.title(self.title)
        plt.xlabel("step")
        label = len(self.series) > 1
        shown_x: list[float] = []
        shown_y: list[float] = []
        for (name, xs, ys), marker in zip(self.series, self.markers, strict=False):
            xs, ys = _drawable(xs, ys)
            if xs:
                steps, values = thin(xs, ys, 2 * width)  # braille: two dots a column
                plt.plot(steps, values, label=name if label else None, marker=marker)
                shown_x += steps
                shown_y += [v for v in values if v is not None and math.isfinite(v)]
        for ticks, shown, most in (
            (plt.xticks, shown_x, width // _COLUMNS_PER_X_TICK),
            (plt.yticks, shown_y, self.size.height // _ROWS_PER_Y_TICK),
        ):
            if shown:
                at = nice_ticks(min(shown), max(shown), most)
                ticks(at, [tick_label(t) for t in at])


def _drawable(
    xs: Sequence[float], ys: Sequence[float | None]
) -> tuple[list[float], list[float | None]]:
    """The points of a series that a chart can place: a step that is a finite number (a
    record's ``"step": null`` is none), and its value, or None (no point) for a value that is
    not a finite number within :data:`_LARGEST`."""
    steps, values = [], []
    for x, y in zip(xs, ys, strict=True):
        if _finite(x):
            steps.append(x)
            values.append(y if _finite(y) and abs(y) <= _LARGEST else None)
    return steps, values


def _finite(value: object) -> TypeGuard[float]:
    """A number (not a bool) that is neither infinite nor NaN."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _shape(series: Sequence[Series]) -> list[tuple]:
    """What tells a redraw apart: each series' label, length and last point."""
    return [(label, len(xs), xs[-1:], ys[-1:]) for label, xs, ys in series]
