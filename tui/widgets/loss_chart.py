"""The loss curve of a run: a Sparkline in a titled box, with first, lowest and last loss."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline


class LossChart(Vertical):
    """Loss per step, one column per bucket of steps (the bucket's mean).

    Args:
        id: the widget id.
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.border_title = "loss"
        self.border_subtitle = "no steps yet"

    def compose(self) -> ComposeResult:
        yield Sparkline([], summary_function=fmean)

    def show(self, losses: Sequence[float]) -> None:
        """Draw ``losses`` (one per step, in order)."""
        if not losses:
            return
        self.query_one(Sparkline).data = list(losses)
        self.border_subtitle = (
            f"first {losses[0]:.3f} · min {min(losses):.3f} · last {losses[-1]:.3f}"
        )
