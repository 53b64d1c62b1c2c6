"""A yes/no question over the current screen (stop or kill a run)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.widgets.dialog import dialog_box


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True on ``y``, False on ``n`` or ``Esc``.

    Args:
        question: what is asked (one or two lines).
    """

    CSS_PATH = "dialog.tcss"
    BINDINGS = [
        Binding("y", "dismiss(True)", "Yes"),
        Binding("n,escape", "dismiss(False)", "No"),
        # A modal screen takes the app's keys away: f1 (the key help) is bound here again.
        Binding("f1", "app.help", "Keys"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with dialog_box("confirm", "y: yes · n or esc: no"):
            yield Static(self.question, markup=False)
