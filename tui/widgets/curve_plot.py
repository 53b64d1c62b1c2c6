"""Line charts (textual-plotext): a run's loss and learning rate, or two runs' losses overlaid."""

from __future__ import annotations

from collections.abc import Sequence

from textual_plotext import PlotextPlot

# Lines drawn with braille dots when colour is on; plain characters for --no-color / ASCII.
_MARKERS = ("braille", "braille")
_ASCII_MARKERS = ("*", "+")


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
        self.series: list[tuple[str, Sequence[float], Sequence[float]]] = []
        self._drawn: list[tuple] | None = None  # the _shape of the series drawn

    def show(self, series: Sequence[tuple[str, Sequence[float], Sequence[float]]]) -> None:
        """Replace the series and redraw; nothing is redrawn when no series gained or lost a
        point (plotext rebuilds the whole chart on each draw)."""
        shape = _shape(series)  # taken now: the monitor's lists grow in place
        if shape == self._drawn:
            return
        self._drawn = shape
        self.series = list(series)
        plt = self.plt
        plt.clear_data()
        plt.title(self.title)
        plt.xlabel("step")
        for (label, xs, ys), marker in zip(self.series, self.markers, strict=False):
            if xs:
                plt.plot(
                    list(xs), list(ys), label=label if len(self.series) > 1 else None, marker=marker
                )
        self.refresh()


def _shape(series: Sequence[tuple[str, Sequence[float], Sequence[float]]]) -> list[tuple]:
    """What tells a redraw apart: each series' label, length and last point."""
    return [(label, len(xs), xs[-1:], ys[-1:]) for label, xs, ys in series]
