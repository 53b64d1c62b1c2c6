"""The "terminal too small" notice: every screen has one, shown over it while the terminal is
smaller than the console's minimum size (:data:`MIN_SIZE`)."""

from __future__ import annotations

from textual.geometry import Size
from textual.widgets import Static

# The size the screens are laid out for (docs/console.md: "it works at 80x24 and wider").
MIN_SIZE = Size(80, 24)


def too_small(size: Size) -> bool:
    """Whether a terminal of ``size`` is narrower or lower than :data:`MIN_SIZE`."""
    return size.width < MIN_SIZE.width or size.height < MIN_SIZE.height


def notice_text(size: Size) -> str:
    """What the notice says at ``size``."""
    return (
        f"Terminal too small: {size.width}x{size.height}.\n"
        f"The console needs at least {MIN_SIZE.width}x{MIN_SIZE.height}: enlarge the window.\n"
        "Keys do nothing until then, but q or ctrl+q quits."
    )


class TooSmall(Static):
    """The notice; hidden unless the app has the ``-too-small`` class (``too_small.tcss``)."""

    def __init__(self) -> None:
        super().__init__("", markup=False)
        # Whether the terminal was too small when its screen was last shown (the app's class).
        self.left_small = False
