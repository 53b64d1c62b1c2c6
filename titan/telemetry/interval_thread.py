"""A daemon thread that calls a function at a fixed interval (the watchdog's heartbeat, the
power sampler)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Ticker:
    """Calls ``tick()`` every ``interval_s`` seconds in a daemon thread (it never keeps the
    process alive) until :meth:`stop`.

    Args:
        interval_s: seconds between calls (the first call comes one interval after start).
        tick: the function to call.
        name: the thread's name, as shown in stacks.
    """

    def __init__(self, interval_s: float, tick: Callable[[], None], name: str) -> None:
        self.interval_s = interval_s
        self.tick = tick
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop calling ``tick`` and wait for the thread (no-op if it never started)."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()
