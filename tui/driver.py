"""The console's terminal driver: Textual's Linux driver, whose output outlives the terminal.

Textual draws through a writer thread fed by a queue of 30 writes. When the terminal goes away
(its SSH session dropped, its emulator closed) a write fails with ``EIO`` and ends that thread;
the next 30 writes fill the queue and the UI thread then waits on it for ever, handling no
signal: such a console ignored SIGTERM and needed SIGKILL. Here the failed write drops the
output from then on and raises SIGHUP in the console, which exits like ``q`` (a console that
leads its terminal's session gets the kernel's SIGHUP as well; one under a wrapper may not).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TextIO

from textual.app import App
from textual.drivers.linux_driver import LinuxDriver


class TerminalOutput:
    """The text stream Textual's writer thread writes the screen to, raising nothing: after the
    first ``OSError`` of a write or flush (the terminal is gone) it drops all output and raises
    SIGHUP in this process, once.

    Args:
        stream: the terminal's stream (Textual's: ``sys.__stderr__``).
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> None:
        """Write ``text`` to the terminal, unless it is lost."""
        self._guarded(self._stream.write, text)

    def flush(self) -> None:
        """Flush the terminal's stream, unless it is lost."""
        self._guarded(self._stream.flush)

    def fileno(self) -> int:
        """The terminal's file descriptor."""
        return self._stream.fileno()

    def _guarded(self, call: Callable[..., object], *args: str) -> None:
        if self.lost:
            return
        try:
            call(*args)
        except OSError:
            self.lost = True
            os.kill(os.getpid(), signal.SIGHUP)


class ConsoleDriver(LinuxDriver):
    """Textual's Linux driver writing through :class:`TerminalOutput` (same arguments)."""

    def __init__(
        self,
        app: App,
        *,
        debug: bool = False,
        mouse: bool = True,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        stream = self._file
        assert stream is not None, "no sys.__stderr__ to draw on"
        # The writer thread of start_application_mode only writes, flushes and asks fileno.
        self._file = TerminalOutput(stream)  # type: ignore[assignment]
