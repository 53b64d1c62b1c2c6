"""Stop signals in every phase of ``titan train``: SIGTERM, SIGINT (Ctrl-C) and SIGHUP.

One :class:`StopFlag` is installed when ``titan train`` starts, before JAX is imported, and
held until it ends. It works in two modes:

- **Start-up** (corpus scan, tokenizer, model build, tokenization, restore, trace: before
  ``run_start``). A signal raises :class:`StopRequested` in the main thread at once, and every
  phase boundary checks the flag too, for a native library that turns the exception into an
  error of its own (sentencepiece's trainer reports it as a ``RuntimeError``) or drops it.
  ``titan train`` then prints one line and exits :data:`~titan.exit_codes.EXIT_STOPPED`; no
  ``run_end`` is written, a fresh run's dir is removed and a resumed run's record is left as it
  was (nothing in it has changed yet).
- **Running** (from just before ``run_start``, :meth:`StopFlag.start`). A signal only sets the
  flag: the loop finishes the step in flight, checkpoints and records ``run_end`` ``stopped``.

``--debug-signal-in PHASE`` (a testing aid) sends SIGINT to the process itself in that
start-up phase: at its first progress report for the tokenizer's training and the corpus's
tokenization (inside the native call; at the phase's end when a cache served it), on entry for
the others.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from titan.exit_codes import EXIT_OK, EXIT_STOPPED

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# --debug-signal-in choices: the start-up phases, by the name the stop line gives them.
PHASES = {
    "scan": "scanning the corpus",
    "tokenizer": "preparing the tokenizer",
    "build": "building the model",
    "tokenize": "tokenizing the corpus",
    "restore": "restoring the state",
    "trace": "tracing the step",
}
FRESH_RUN_PHASES = {"restore": "initialising the state"}  # a new run's name for a resume's phase
INNER_PHASES = ("tokenizer", "tokenize")  # the debug signal comes from inside the native call


class StopRequested(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an error
    """A stop signal arrived during start-up (a ``BaseException``, as ``KeyboardInterrupt``
    is, so that no ``except Exception`` on the way swallows it)."""


@dataclass
class StopFlag:
    """Set by SIGTERM, SIGINT or SIGHUP (the terminal or SSH session went away).

    Args:
        debug_signal_in: a :data:`PHASES` key: send SIGINT to this process in that phase.
    """

    debug_signal_in: str = ""
    requested: bool = False
    signal_name: str = ""
    phase: str = "starting"
    running: bool = False
    _raised: bool = False
    _previous: dict = dataclasses.field(default_factory=dict)
    _terminal_fds: list = dataclasses.field(default_factory=list)

    def install(self) -> None:
        """Handle the stop signals from now on. Again takes them back from whatever replaced
        the handlers since (``jax.distributed.initialize`` installs its own for SIGTERM);
        :meth:`uninstall` still puts back those found the first time."""
        first = not self._previous
        if first:  # known now: once the terminal hangs up, isatty() on it fails too
            self._terminal_fds = [fd for fd in (1, 2) if os.isatty(fd)]
            _quiet_unraisable_stops()
        for sig in SIGNALS:
            previous = signal.signal(sig, self._handle)
            if first:
                self._previous[sig] = previous
        if self not in _INSTALLED:
            _INSTALLED.append(self)

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self in _INSTALLED:
            _INSTALLED.remove(self)

    def redeliver(self) -> None:
        """The :class:`StopRequested` of a signal was raised where Python could not pass it on
        (inside a garbage-collection callback, such as JAX's, or a finalizer) and was dropped:
        raise it again from the main thread's next bytecode, after :data:`REDELIVER_S`, once
        the callback is over, by the same signal simulated there
        (:func:`_thread.interrupt_main`). A command without phase checks would otherwise run
        to its end."""
        self._raised = False
        signum = signal.Signals[self.signal_name]
        timer = threading.Timer(REDELIVER_S, self._interrupt, (signum,))
        timer.daemon = True
        timer.start()

    def _interrupt(self, signum: signal.Signals) -> None:
        if self in _INSTALLED and not self._raised and not self.running:
            _thread.interrupt_main(signum)

    def start(self) -> None:
        """The run is starting (``run_start`` comes next): a signal now stops it after a step.

        Raises:
            StopRequested: a signal arrived before.
        """
        self.check()
        self.running = True
        self.install()  # taken back from a library that set its own during start-up

    def check(self) -> None:
        """Raises StopRequested if a signal arrived during start-up."""
        if self.requested and not self.running:
            self._raised = True  # a stop dropped before is not raised again in the clean-up
            raise StopRequested(self.signal_name)

    @contextlib.contextmanager
    def during(self, key: str, fresh: bool = False) -> Iterator[Callable[..., None]]:
        """The start-up phase ``key`` (a :data:`PHASES` key; of a new run, not a resume:
        ``fresh``, named as :data:`FRESH_RUN_PHASES` says), checked on entry and exit. Yields
        a progress callback for the phase's native work (its first call sends the debug signal
        of an inner phase)."""
        self.phase = FRESH_RUN_PHASES.get(key, PHASES[key]) if fresh else PHASES[key]
        self.check()
        fire = [self.debug_signal_in == key]

        def report(*_: Any) -> None:
            if fire[0]:
                fire[0] = False
                os.kill(os.getpid(), signal.SIGINT)
            self.check()

        if key not in INNER_PHASES:
            report()
        yield report
        report()  # the native call reported nothing (a cached tokenizer or token file)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            _detach_from_terminal(self._terminal_fds)
        if not self._raised and not self.running:
            self._raised = True  # once: a second signal lets clean-up finish
            raise StopRequested(self.signal_name)


# The stop flags whose handlers are installed, newest last (the one a dropped stop belongs to).
_INSTALLED: list[StopFlag] = []
# Seconds between a dropped stop and its second raise: a garbage-collection pass is over by then.
REDELIVER_S = 0.01


def _drop_unraisable_stop(unraisable: Any, previous: Callable[[Any], None]) -> None:
    """``sys.unraisablehook``: a :class:`StopRequested` raised where Python cannot pass it on
    (a signal handled inside a garbage-collection callback or a finalizer, such as JAX's) is
    not printed as a traceback: the installed flag raises it again (:meth:`StopFlag.redeliver`;
    ``titan train``'s next phase check would too). Everything else is passed on."""
    if not isinstance(unraisable.exc_value, StopRequested):
        previous(unraisable)
    elif _INSTALLED:
        _INSTALLED[-1].redeliver()


def _quiet_unraisable_stops() -> None:
    """Install :func:`_drop_unraisable_stop`, unless the hooks chained through ``previous``
    (this module's and the checkpointer's) hold it already."""
    hook: Any = sys.unraisablehook
    while isinstance(hook, functools.partial):
        if hook.func is _drop_unraisable_stop:
            return
        hook = hook.keywords.get("previous")
    sys.unraisablehook = functools.partial(_drop_unraisable_stop, previous=sys.unraisablehook)


def _detach_from_terminal(fds: list[int]) -> None:
    """After a hangup the terminal is gone and writing to it fails (EIO): the standard streams
    in ``fds`` that pointed at it now go to /dev/null, so the run can still checkpoint and end."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


_CUT_SHORT = threading.Event()


def mark_cut_short() -> None:
    """Say that a stop signal cut the command short, its clean-up done and its line printed:
    the ``titan`` script (:func:`titan.cli.entry`) then ends the process at once. The
    interpreter's shutdown would wait for work abandoned in other threads (the coordination
    service's barrier, its errors printed after the line) and meet XLA's threads still
    compiling (a SIGSEGV after the line).

    Not while child processes of this one live (a tokenizer's workers, still encoding the
    chunks they were handed): the shutdown then waits for them and releases their
    semaphores, where ending at once would leave them running and multiprocessing's
    resource tracker printing a warning after the line."""
    import multiprocessing  # only on a stop: not on every command's start (about 7 ms)

    if not multiprocessing.active_children():
        _CUT_SHORT.set()


def cut_short() -> bool:
    """Whether :func:`mark_cut_short` was called."""
    return _CUT_SHORT.is_set()


def stopped_at_start(stop: StopFlag, exit_zero_on_stop: bool, resumed: bool) -> int:
    """Say in one line that a signal stopped start-up (:func:`mark_cut_short`); returns the
    exit code (:data:`EXIT_STOPPED`, 0 with ``--exit-zero-on-stop``)."""
    left = "the run's record is as it was" if resumed else "nothing recorded"
    print(
        f"titan train: stopped by {stop.signal_name or 'a signal'} while {stop.phase}, before "
        f"the run started: {left}",
        file=sys.stderr,
        flush=True,
    )
    mark_cut_short()
    return EXIT_OK if exit_zero_on_stop else EXIT_STOPPED
