"""The box of a modal dialog: titled, with its keys in the bottom border."""

from __future__ import annotations

from textual.containers import Vertical


def dialog_box(title: str, keys: str) -> Vertical:
    """A ``.dialog`` box (styled by ``screens/dialog.tcss``) titled ``title``, ``keys`` below."""
    box = Vertical(classes="dialog")
    box.border_title = title
    box.border_subtitle = keys
    return box
