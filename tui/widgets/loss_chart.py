"""The loss curve of a run: a Sparkline in a titled box, with first, lowest and last loss."""

from __future__ import annotations

import time
from collections.abc import Sequence
from statistics import fmean

from textual.app import ComposeResult
from textual.containers import Vertical

from tui.widgets.sparkline import ColumnSparkline

# The chart is a trend over every step: while steps arrive it is redrawn at most this often (a
# repaint of the chart costs more than the rest of the overview together; the loss stat shows
# each step).
REDRAW_INTERVAL_S = 5.0


class LossChart(Vertical):
    """Loss per step, one column per bucket of steps (the bucket's mean).

    Args:
        id: the widget id.
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.border_title = "loss"
        self.border_subtitle = "no steps yet"
        self._drawn_at = -REDRAW_INTERVAL_S  # time.monotonic() of the last draw

    def compose(self) -> ComposeResult:
        yield ColumnSparkline([], summary_function=fmean)

    def show(self, losses: Sequence[float], *, force: bool = False) -> None:
        """Draw ``losses`` (one per step, in order) when some were added, unless the last draw
        is less than :data:`REDRAW_INTERVAL_S` old and ``force`` is false."""
        sparkline = self.query_one(ColumnSparkline)
        if not losses or len(losses) == len(sparkline.data or ()):
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < REDRAW_INTERVAL_S:
            return
        self._drawn_at = now
        sparkline.data = list(losses)
        self.border_subtitle = (
            f"first {losses[0]:.3f} · min {min(losses):.3f} · last {losses[-1]:.3f}"
        )
