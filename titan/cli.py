"""The ``titan`` command: subcommands built on argparse.

User errors (bad values, impossible layouts, missing files) print one line and exit 2: argparse's
own errors through :class:`Parser`, a :class:`titan.errors.TitanError` raised by a command here,
and an operating-system error no command turned into one (a path that cannot be read or
written), named by its path and the OS's reason.

A stop signal (SIGINT, SIGTERM, SIGHUP) ends a command with one line and
:data:`~titan.exit_codes.EXIT_STOPPED`: a :class:`~titan.stopping.StopFlag`, installed before
the parser imports the commands, raises :class:`~titan.stopping.StopRequested` at the first
signal, the command's clean-up runs (a second signal does not cut it short), and whatever it
was writing is removed. ``train`` and ``launch`` install their own handlers on top while they
run (:mod:`titan.stopping`, :mod:`titan.launch.local`).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from titan import installed_version
from titan.errors import TitanError
from titan.exit_codes import EXIT_STOPPED, EXIT_USAGE
from titan.inert import inert
from titan.stopping import StopFlag, StopRequested, cut_short, mark_cut_short

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by a closed pipe
# Each module defines add_parser(subparsers), which sets ``run`` (args -> exit code) as the
# subparser's default. Modules must import quickly: no JAX at import time.
COMMAND_MODULES = (
    "titan.commands.train",
    "titan.commands.ops",
    "titan.commands.plan",
    "titan.commands.summarize_perf_report",
    "titan.commands.launch",
    "titan.commands.import_export",
    "titan.commands.generate",
    "titan.commands.sample",
    "titan.commands.tokenize",
)


def _command_modules() -> list[Any]:
    return [importlib.import_module(name) for name in COMMAND_MODULES]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit code 2, each named by the
    command that met it: an argument a subcommand does not know is ``titan plan: error: ...``,
    not the top parser's ``titan: error: ...`` (argparse leaves it to the top one)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # the innermost command met them: every word after its name was its own
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        if getattr(parsed, COMMAND_NAME, None) is None:  # the innermost parser returns first
            setattr(parsed, COMMAND_NAME, self.prog)
        return parsed, extras


# The namespace attribute that holds the command run, ``titan import hf`` (:class:`Parser`).
COMMAND_NAME = "_command_name"


def _error_text(command: str, err: TitanError) -> str:
    """``err``'s text, inert, without a leading ``command`` that it names itself (a message
    written to be read alone: ``titan import hf: no safetensors in DIR``)."""
    text = inert(err)
    if text.startswith((f"{command}:", f"{command} ")):
        return text[len(command) :].lstrip(": ")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The full ``titan`` parser (used by ``main`` and by tests of ``--help``)."""
    parser = Parser(prog="titan", description="Titan: train Llama-class models with JAX.")
    parser.add_argument("--version", action="version", version=f"titan {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in _command_modules():
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``titan`` console script. Returns the process exit code."""
    stop = _stop_flag()
    command = "titan"
    try:
        args = build_parser().parse_args(argv)
        command = getattr(args, COMMAND_NAME)
        return args.run(args)
    except StopRequested as err:
        return _stopped(command, str(err))
    except TitanError as err:
        # The message may quote a record or a path: shown inert (no terminal escapes).
        print(f"{command}: error: {_error_text(command, err)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader of the output went away (``| head``): stop quietly, as Unix tools do. The
        # interpreter's final flush of stdout would fail again, so stdout goes to /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as err:
        print(f"{command}: error: {inert(os_error_line(err))}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:
        if stop.requested:  # a native library turned the stop into an error of its own
            return _stopped(command, stop.signal_name)
        raise
    finally:
        stop.uninstall()


def _stopped(command: str, signal_name: str) -> int:
    """Say in one line that a signal stopped ``command``; returns :data:`EXIT_STOPPED`."""
    print(f"{command}: stopped by {signal_name or 'a signal'}", file=sys.stderr, flush=True)
    mark_cut_short()
    return EXIT_STOPPED


def entry() -> NoReturn:
    """The ``titan`` console script: exits with :func:`main`'s code. A command that a signal
    cut short (its clean-up done: :func:`titan.stopping.mark_cut_short`) ends at once, its
    output flushed, without the interpreter's shutdown."""
    code = main()
    if cut_short():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _stop_flag() -> StopFlag:
    """The command's stop flag, installed unless this runs outside the main thread (where
    Python sets no handler)."""
    stop = StopFlag()
    if threading.current_thread() is threading.main_thread():
        stop.install()
    return stop


def os_error_line(err: OSError) -> str:
    """``<path>: <reason> (<errno name>)`` of an operating-system error, in one line."""
    code = errno.errorcode.get(err.errno or 0, "")
    reason = " ".join(str(err.strerror or err).split()) + (f" ({code})" if code else "")
    paths = [str(p) for p in (err.filename, err.filename2) if p is not None]
    return ": ".join([" -> ".join(paths), reason] if paths else [reason])


if __name__ == "__main__":
    entry()
