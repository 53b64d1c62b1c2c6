"""A child's native abort, said in one line by ``titan launch``.

A process that aborts inside a native library dies of SIGABRT after the runtime has printed its
abort text on stderr: libstdc++'s ``terminate called after throwing an instance of 'T'`` and
its ``what():`` line (an uncaught C++ exception, such as gloo's ``EnforceNotMet`` when the
processes' collectives do not pair up), or absl's fatal log line (``F<mmdd> <time> <thread>
<file>:<line>] <message>``, an XLA ``CHECK``) and its stack trace; Python's fault handler, when
enabled, adds a dump of every thread. The launcher keeps that text off the terminal
(:meth:`AbortText.take`: the first abort line of a child and everything after it, the process
being about to die) and, once the child has died of a signal, says one line naming the process,
the signal and the reason the abort text gave (:meth:`AbortText.death_line`). The run's record
gets its ``run_end`` ``failed`` from the surviving processes, which find the process lost
(:mod:`titan.trainer.peers`).
"""

from __future__ import annotations

import re
import signal

# libstdc++'s verbose terminate handler (__gnu_cxx::__verbose_terminate_handler).
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_WHAT = re.compile(r"\s+what\(\):\s+(?P<what>.*)")
# absl / glog fatal log line: severity F, date mmdd, time, thread id, file:line].
_FATAL_LOG = re.compile(r"F\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] (?P<message>.*)")
_PYTHON_FATAL = re.compile(r"Fatal Python error: (?P<message>.*)")


class AbortText:
    """The native abort text in one child's output, taken off the terminal.

    Attributes:
        reason: one line: the exception type and its message, the fatal log message, or
            Python's fatal error; None until an abort line was seen.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._exception: str | None = None

    def take(self, line: str) -> bool:
        """Whether ``line`` is part of a native abort (not to be shown); notes its reason."""
        if self.reason is None:
            return self._starts(line)
        what = _WHAT.match(line)
        if self._exception is not None and what:
            self.reason = f"{self._exception}: {what['what'].strip()}"
            self._exception = None
        return True

    def _starts(self, line: str) -> bool:
        if terminate := _TERMINATE.match(line):
            self.reason = self._exception = terminate["type"]
            return True
        fatal = _FATAL_LOG.match(line) or _PYTHON_FATAL.match(line)
        if fatal:
            self.reason = fatal["message"].strip()
            return True
        return False

    def death_line(self, index: int, pid: int, returncode: int) -> str | None:
        """The one line for child ``index`` (``pid``) that ended with ``returncode``
        (``subprocess`` convention: -S when killed by signal S), or None when it exited."""
        if returncode >= 0:
            return None
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        because = f": {self.reason}" if self.reason else ""
        return f"titan launch: process {index} (pid {pid}) died of {name}{because}\n"
