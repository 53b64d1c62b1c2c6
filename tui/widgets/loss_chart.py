"""The loss curve of a run: a Sparkline in a titled box, with the first, best (lowest, as History
names it) and last loss."""

from __future__ import annotations

import time
from statistics import fmean

from textual.app import ComposeResult
from textual.containers import Vertical

from tui.curve import Curve
from tui.widgets.sparkline import ColumnSparkline

# The chart is a trend over every step: while steps arrive it is redrawn at most this often (a
# repaint of the chart costs more than the rest of the overview together; the loss stat shows
# each step).
REDRAW_INTERVAL_S = 5.0


class LossChart(Vertical):
    """Loss over the steps, one column per bucket of the curve's points (their mean).

    Args:
        id: the widget id.
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.border_title = "loss"
        self.border_subtitle = "no steps yet"
        self._drawn_at = -REDRAW_INTERVAL_S  # time.monotonic() of the last draw
        self._drawn_count = 0  # the curve's points appended at the last draw

    def compose(self) -> ComposeResult:
        yield ColumnSparkline([], summary_function=fmean)

    def show(self, curve: Curve, *, force: bool = False) -> None:
        """Draw the losses of ``curve`` (bounded: :class:`tui.curve.Curve` keeps each bucket's
        first, lowest, highest and last) when steps were added, unless the last draw is less
        than :data:`REDRAW_INTERVAL_S` old and ``force`` is false."""
        if curve.count == self._drawn_count:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < REDRAW_INTERVAL_S:
            return
        losses = [loss for loss in curve.losses if loss is not None]
        if not losses:
            if curve.count == 0:  # the record read again from its start (replaced, removed)
                self._drawn_count = 0
                self.query_one(ColumnSparkline).data = []
                self.border_subtitle = "no steps yet"
            return
        self._drawn_at, self._drawn_count = now, curve.count
        self.query_one(ColumnSparkline).data = losses
        self.border_subtitle = (
            f"first {losses[0]:.3f} · best {min(losses):.3f} · last {losses[-1]:.3f}"
        )
