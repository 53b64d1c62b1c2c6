"""A labelled value on one line of the monitor (``loss   3.412``)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import HorizontalGroup
from textual.widgets import Label, Static

from titan.inert import inert

# CSS classes that colour a value: good (done), warn (stopped, stopping), bad (failed, rc != 0).
TONES = ("good", "warn", "bad")


def tone_of(fraction: float, warn_at: float, bad_at: float) -> str:
    """``good`` under ``warn_at``, ``warn`` under ``bad_at``, else ``bad``."""
    if fraction < warn_at:
        return "good"
    return "warn" if fraction < bad_at else "bad"


class Stat(HorizontalGroup):
    """A dim label and a value; :meth:`show` changes the value and its tone.

    Args:
        label: the text before the value.
        id: the widget id.
    """

    def __init__(self, label: str, *, id: str) -> None:
        super().__init__(id=id)
        self._label = label
        self._value = Static("-", markup=False, classes="stat-value")
        self._shown: tuple[str, str | None, bool] = ("-", None, False)

    @property
    def value(self) -> str:
        """The text shown (for tests and screenshots)."""
        return str(self._value.content)

    def compose(self) -> ComposeResult:
        yield Label(self._label, classes="stat-label")
        yield self._value

    def show(self, value: str, tone: str | None = None, *, wrap: bool = False) -> None:
        """Show ``value`` (as inert text, never markup), coloured by ``tone`` (one of
        :data:`TONES`, or ``None`` for plain); with ``wrap``, on as many lines as it needs
        (class ``-wrap``: a failure reason is shown whole, not cut at the column's end).

        Only a change repaints, and only the value's line: its width is fixed by the layout
        (``1fr``, no wrap), so no layout pass is needed unless the value wraps or did."""
        value = inert(value)
        if (value, tone, wrap) == self._shown:
            return
        wrapped = self._shown[2]
        self._shown = (value, tone, wrap)
        self.set_class(wrap, "-wrap")
        self._value.update(value, layout=wrap or wrapped)
        for name in TONES:
            self._value.set_class(name == tone, f"-{name}")
