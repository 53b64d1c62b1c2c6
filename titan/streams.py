"""Output that outlives its reader: a run whose stdout or stderr is a pipe that closes
(``titan train ... | head``, a ``tee`` that was killed) goes on training, its lines dropped,
since the run record holds everything they say."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class SurvivingStream:
    """A text stream that writes to ``stream`` until its reader goes away, then drops what is
    written: the first :class:`BrokenPipeError` points the file descriptor at ``/dev/null``
    (so that the interpreter's last flush, and any writer of the descriptor itself, find
    somewhere to write), and no later write raises it.

    Args:
        stream: the stream wrapped (``sys.stdout``, ``sys.stderr``); what it does not override
            (``fileno``, ``isatty``, ``encoding``) is the stream's own.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError):  # a stream without a descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def surviving_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`SurvivingStream` for the body; the
    streams before it afterwards."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SurvivingStream(sys.stdout), SurvivingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before
