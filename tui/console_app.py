"""What the screens read of the console: :class:`tui.app.TitanConsole`, which imports the screens
(so they name it by this protocol)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, cast

from textual.app import App

from tui.launcher import LaunchedRun


class ConsoleApp(Protocol):
    """The console's state that its screens read.

    Attributes:
        ascii_only: ``--ascii``: charts and marks in ASCII.
        launched: the runs this console launched, by resolved run dir.
    """

    ascii_only: bool
    launched: dict[Path, LaunchedRun]


def console_app(app: App) -> ConsoleApp:
    """``app`` as the console: every screen runs in :class:`tui.app.TitanConsole`."""
    return cast(ConsoleApp, app)
