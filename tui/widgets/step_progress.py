"""The monitor's progress bar: steps done of the total, without an ETA of its own."""

from __future__ import annotations

from textual.events import Mount
from textual.widgets import ProgressBar

# Fractions the bar tells apart: finer than its cells and its whole percent.
_RESOLUTION = 1000


class StepProgress(ProgressBar):
    """A :class:`textual.widgets.ProgressBar` without the ETA countdown and without the timer
    that refreshes it every second (the monitor shows its own ETA).

    Args:
        id: the widget id.
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, show_eta=False)
        self._shown: tuple[int | None, int] | None = None

    # Textual passes the event to a handler that takes one (ProgressBar's takes none).
    def on_mount(self, event: Mount) -> None:  # type: ignore[override]
        event.prevent_default()  # ProgressBar's own on_mount starts the 1 s ETA refresh

    def show(self, step: int, total: int | None) -> None:
        """``step`` of ``total`` steps (hidden while the total is unknown: no "working" pulse
        for a run that has not started or is dead). Repaints only when the bar or the percentage
        would change, not at every step of a long run."""
        shown = (total, int(step / total * _RESOLUTION) if total else 0)
        if shown == self._shown:
            return
        self._shown = shown
        self.visible = total is not None
        # An unknown total would be Textual's pulse, repainted 15 times a second even hidden.
        self.update(total=total or 0, progress=step if total else 0)
