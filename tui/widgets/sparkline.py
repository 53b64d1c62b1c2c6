"""Textual's Sparkline drawn column by column: the same bars and colours for a fraction of the CPU.

Textual's renderable summarises each bucket and blends its colour once per cell (width x height
times) and yields one segment per cell; this one does both once per column and merges the cells
of a row that share a style. A monitor redraws the loss sparkline at every step, so this is most
of what following a run costs.
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from textual.renderables._blend_colors import blend_colors
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.widgets import Sparkline


class SparklineColumns(SparklineRenderable[float]):
    """Textual's sparkline renderable (same arguments), drawn column by column."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        data = self.data
        if len(data) < 2:  # Textual's flat line or full block
            yield from super().__rich_console__(console, options)
            return
        width = self.width or options.max_width
        height = self.height or 1
        levels = len(self.BARS)
        minimum, maximum = min(data), max(data)
        extent = maximum - minimum or 1
        buckets = tuple(self._buckets(list(data), num_buckets=width))
        low_color, high_color = self.min_color.color, self.max_color.color
        columns: list[tuple[int, Style]] = []
        position, step = 0.0, len(buckets) / width
        for _ in range(width):  # the bucket walk of Textual's renderable
            ratio = (self.summary_function(buckets[int(position)]) - minimum) / extent
            color = blend_colors(low_color, high_color, ratio)
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
        return SparklineColumns(
            drawn.data,
            width=drawn.width,
            height=drawn.height,
            min_color=drawn.min_color.color,
            max_color=drawn.max_color.color,
            summary_function=drawn.summary_function,
        )
