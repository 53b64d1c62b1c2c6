"""A stop signal ends a command other than ``titan train`` and ``titan launch`` in one line with
exit code 4, and what the command was writing is removed, whichever thread writes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from titan.cli import main
from titan.exit_codes import EXIT_STOPPED
from titan.stopping import StopRequested
from titan.trainer.hf_checkpoints import _staged

PLAN = ["plan", "--model", "tiny", "--gpu", "h200", "--gpus", "8", "--tokens", "1e9"]


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
def test_a_signal_stops_a_command_in_one_line_with_exit_4(signum, capsys, monkeypatch):
    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler raises at once

    monkeypatch.setattr("titan.plan_commands.outcome", signalled)
    before = signal.getsignal(signal.SIGTERM)
    assert main(PLAN) == EXIT_STOPPED
    err = capsys.readouterr().err
    assert err == f"titan plan: stopped by {signal.Signals(signum).name}\n"
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handlers are taken back


class _SignalOnCollection:
    """Sends SIGTERM to this process when collected: a signal handled inside a finalizer, as
    one landing in JAX's garbage-collection callback is, where the stop cannot be raised."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_dropped_inside_a_finalizer_is_raised_again(capsys, monkeypatch):
    def collected_then_working(args) -> int:
        _SignalOnCollection()  # collected at once: its stop is dropped there
        time.sleep(2)  # the command's work goes on: the stop must be raised again meanwhile
        return 0  # a command that ended as if no signal had come

    monkeypatch.setattr("titan.plan_commands.run", collected_then_working)
    printed: list = []  # what would be printed as "Exception ignored in: ..."
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    assert main(PLAN) == EXIT_STOPPED
    assert capsys.readouterr().err == "titan plan: stopped by SIGTERM\n"
    assert printed == []


def test_a_signal_while_the_commands_are_imported_is_one_line_exit_4(capsys, monkeypatch):
    def signalled_parser():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    monkeypatch.setattr("titan.cli.build_parser", signalled_parser)
    assert main(PLAN) == EXIT_STOPPED
    assert capsys.readouterr().err == "titan: stopped by SIGINT\n"


def test_a_stop_waits_for_the_threads_writing_the_output_then_removes_it(tmp_path: Path):
    # orbax writes a checkpoint from its own threads, which a stop in the main thread does not
    # end: one that wrote on after the staging was removed left it behind
    out = tmp_path / "out"
    writers = []
    with pytest.raises(StopRequested):
        with _staged(out, "--out") as staging:

            def write_late() -> None:
                time.sleep(0.5)
                (staging / "checkpoints" / "0").mkdir(parents=True)

            writers.append(threading.Thread(target=write_late))
            writers[0].start()
            raise StopRequested("SIGINT")
    writers[0].join()
    assert list(tmp_path.iterdir()) == []


def test_the_stagings_of_a_killed_process_are_removed_by_the_next(tmp_path: Path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / f".out.tmp{gone}" / "checkpoints").mkdir(parents=True)
    live = tmp_path / f".out.tmp{os.getppid()}"  # a live process's, importing now: kept
    live.mkdir()
    (tmp_path / ".other.tmp1").mkdir()  # another output's: kept
    with _staged(tmp_path / "out", "--out") as staging:
        (staging / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp1", live.name, "out"]
