"""Textual's Sparkline drawn column by column: the same bars and colours for a fraction of the CPU.

Textual's renderable summarises each bucket and blends its colour once per cell (width x height
times) and yields one segment per cell; this one does both once per column and merges the cells
of a row that share a style. A monitor redraws the loss sparkline at every step, so this is most
of what following a run costs.

Only public API is used: the buckets and the colour blend are computed here (the same arithmetic
as Textual's private ``_buckets`` and ``_blend_colors``), so a Textual release that moves those
does not break the console.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from fractions import Fraction
from itertools import groupby
from operator import itemgetter

from rich.color import Color, blend_rgb
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.widgets import Sparkline


def buckets(data: Sequence[float], count: int) -> Iterator[Sequence[float]]:
    """``data`` cut into ``count`` consecutive parts of (nearly) equal length, empty ones left out:
    ``[1, 2, 3, 4]`` into 2 is ``[1, 2], [3, 4]``. The partition of Textual's renderable."""
    step = Fraction(len(data), count)
    for index in range(count):
        part = data[int(step * index) : int(step * (index + 1))]
        if part:
            yield part


def blend(low: Color, high: Color, ratio: float) -> Color:
    """The colour ``ratio`` (0..1) of the way from ``low`` to ``high`` in RGB; ``high`` when
    either has no RGB value (a terminal palette colour). Textual's sparkline blend."""
    if low.triplet is None or high.triplet is None:
        return high
    return Color.from_triplet(blend_rgb(low.triplet, high.triplet, ratio))


def style_color(style: Style) -> Color:
    """The colour of the renderable's ``min_color`` or ``max_color``: a ``Style.from_color`` of
    the colour that it was given, so never ``None``."""
    assert style.color is not None, style
    return style.color


class SparklineColumns(SparklineRenderable[float]):
    """Textual's sparkline renderable (same arguments), drawn column by column; no data draws
    blank rows (Textual's draws a row of its lowest bar, as if every value were the least)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        data = self.data
        width = self.width or options.max_width
        height = self.height or 1
        if not data:  # blank: no row of the lowest bar (Textual's) for a run without steps
            for row in range(height):
                yield Segment(" " * width)
                if row < height - 1:
                    yield Segment.line()
            return
        if len(data) == 1:  # Textual's full block
            yield from super().__rich_console__(console, options)
            return
        levels = len(self.BARS)
        minimum, maximum = min(data), max(data)
        extent = maximum - minimum or 1
        parts = tuple(buckets(list(data), width))
        low_color, high_color = style_color(self.min_color), style_color(self.max_color)
        columns: list[tuple[int, Style]] = []
        position, step = 0.0, len(parts) / width
        for _ in range(width):  # the bucket walk of Textual's renderable
            ratio = (self.summary_function(parts[int(position)]) - minimum) / extent
            color = blend(low_color, high_color, ratio)
            columns.append((int(ratio * (levels * height - 1)), Style.from_color(color)))
            position += step
        for row in reversed(range(height)):
            low, high = row * levels, (row + 1) * levels
            cells = [
                (" ", None)
                if bar < low
                else ("█" if bar >= high else self.BARS[bar % levels], style)
                for bar, style in columns
            ]
            for style, run in groupby(cells, key=itemgetter(1)):
                yield Segment("".join(char for char, _ in run), style)
            if row > 0:
                yield Segment.line()


class ColumnSparkline(Sparkline):
    """A :class:`textual.widgets.Sparkline` (same arguments, styles and look), drawn faster."""

    def render(self) -> SparklineColumns:
        drawn = super().render()
        assert isinstance(drawn, SparklineRenderable), drawn  # Sparkline.render draws one
        return SparklineColumns(
            drawn.data,
            width=drawn.width,
            height=drawn.height,
            min_color=style_color(drawn.min_color),
            max_color=style_color(drawn.max_color),
            summary_function=drawn.summary_function,
        )
