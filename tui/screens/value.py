"""One value of a key-value table read in full (a run detail's MFU reason, power source, a long
config value): the table cuts it at the column's end, this shows it wrapped."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from titan.inert import inert
from tui.widgets.dialog import dialog_box


class ValueScreen(ModalScreen[None]):
    """A dialog titled ``key`` with ``value`` wrapped (scrolled when longer than the screen);
    ``Esc`` or ``enter`` closes it.

    Args:
        key: the row's key.
        value: its whole value, shown as plain inert text.
    """

    CSS_PATH = "dialog.tcss"
    BINDINGS = [
        Binding("escape,enter", "dismiss(None)", "Close"),
        # A modal screen takes the app's keys away: f1 (the key help) is bound here again.
        Binding("f1", "app.help", "Keys"),
    ]

    def __init__(self, key: str, value: str) -> None:
        super().__init__()
        self.key = key
        self.value = value

    def compose(self) -> ComposeResult:
        with dialog_box(inert(self.key), "esc or enter: close"):
            with VerticalScroll(id="value-scroll"):
                yield Static(inert(self.value), id="value-text", markup=False)
