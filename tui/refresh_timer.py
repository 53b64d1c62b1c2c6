"""A screen's refresh timer: runs while the screen is shown, paused while another covers it."""

from __future__ import annotations

from collections.abc import Callable

from textual.screen import Screen
from textual.timer import Timer


class ScreenTicker:
    """Calls ``callback`` every ``interval_s`` seconds while ``screen`` is shown: the screen calls
    :meth:`resume` from ``on_screen_resume`` and :meth:`pause` from ``on_screen_suspend``."""

    def __init__(self, screen: Screen, interval_s: float, callback: Callable[[], object]) -> None:
        self._screen = screen
        self._interval_s = interval_s
        self._callback = callback
        self._timer: Timer | None = None

    def resume(self) -> None:
        """Start the timer (the first time the screen is shown) or resume it."""
        if self._timer is None:
            self._timer = self._screen.set_interval(self._interval_s, self._callback)
        else:
            self._timer.resume()

    def pause(self) -> None:
        """Pause the timer while another screen covers this one."""
        if self._timer is not None:
            self._timer.pause()
