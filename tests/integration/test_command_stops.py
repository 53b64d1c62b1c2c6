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
from helpers import cli_args, small_run

from titan.analysis import plots
from titan.checkpoint.hf_checkpoints import _staged
from titan.cli import main
from titan.exit_codes import EXIT_STOPPED
from titan.stopping import StopRequested
from titan.telemetry import sinks

SAMPLE_RUN = Path(__file__).resolve().parents[2] / "sample_runs" / "tiny-20261129-185806-39fc"
PLAN = ["plan", "--model", "tiny", "--gpu", "h200", "--gpus", "8", "--tokens", "1e9"]


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
def test_a_signal_stops_a_command_in_one_line_with_exit_4(signum, capsys, monkeypatch):
    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler raises at once

    monkeypatch.setattr("titan.commands.plan.outcome", signalled)
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

    monkeypatch.setattr("titan.commands.plan.run", collected_then_working)
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


def _stopped_after(function):
    """``function``, which sends SIGINT to this process once it has done its work."""

    def stopped(*args, **kwargs):
        done = function(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises at once
        return done

    return stopped


@pytest.mark.parametrize("existing", [False, True])
def test_a_report_stopped_after_its_first_figure_leaves_no_report(
    tmp_path, capsys, monkeypatch, existing
):
    out = tmp_path / "report"
    if existing:  # a folder of the user's: it stays as it was, a file the report names too
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        (out / "loss.png").write_text("my figure")
    plot_loss = plots.plot_loss

    def plotted_beside_another_writer(*args, **kwargs):
        (out / "theirs.txt").write_text("another writer's, meanwhile")  # a live run's, say
        return plot_loss(*args, **kwargs)

    monkeypatch.setattr(plots, "plot_loss", _stopped_after(plotted_beside_another_writer))
    assert main(["report", str(SAMPLE_RUN), "--out", str(out)]) == EXIT_STOPPED
    assert capsys.readouterr().err.endswith("titan report: stopped by SIGINT\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == (
        ["loss.png", "notes.txt", "report", "theirs.txt"] if existing else []
    )
    if existing:
        assert (out / "loss.png").read_text() == "my figure"


def test_a_report_replaces_its_own_files_only_and_removes_a_killed_reports_staging(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True).stdout.strip()  # fmt: skip
    out = tmp_path / "report"
    (out / f".report.tmp{gone}").mkdir(parents=True)  # what a killed report left
    (out / "notes.txt").write_text("mine")
    (out / "report.md").write_text("an earlier report")
    assert main(["report", str(SAMPLE_RUN), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert not [name for name in names if name.startswith(".")], names
    assert {"notes.txt", "report.md", "loss.png"} <= set(names)
    assert (out / "report.md").read_text().startswith("# Run report: ")


@pytest.mark.parametrize("existing", [False, True])
def test_a_tensorboard_export_stopped_midway_leaves_no_event_file(
    tmp_path, capsys, monkeypatch, existing
):
    out = tmp_path / "tb"
    if existing:  # a live run's logdir, say: its own event file stays
        out.mkdir()
        (out / "events.out.tfevents.1.host.titan-live").write_bytes(b"")

    def rows_beside_another_writer(rows, what):
        (out / "theirs.txt").write_text("another writer's, meanwhile")
        return rows

    monkeypatch.setattr(sinks, "tracked", _stopped_after(rows_beside_another_writer))
    assert main(["export", "tensorboard", str(SAMPLE_RUN), "--out", str(out)]) == EXIT_STOPPED
    assert capsys.readouterr().err.endswith("titan export tensorboard: stopped by SIGINT\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == (
        ["events.out.tfevents.1.host.titan-live", "tb", "theirs.txt"] if existing else []
    )


_SCRIPT = """
import atexit, os, signal, sys, time
import titan.commands.plan, titan.commands.tokenize
from titan.cli import entry
atexit.register(lambda: print("shut down", flush=True))
def signalled(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
titan.commands.plan.outcome = signalled
titan.commands.tokenize.token_stream = signalled
sys.argv = ["titan", *sys.argv[1:]]
entry()
"""


@pytest.mark.parametrize("command", ["plan", "tokenize", "train"])
def test_the_titan_script_ends_a_stopped_command_without_the_interpreters_shutdown(
    command, corpus_dir, tmp_path
):
    # the shutdown met XLA's threads still compiling or running a step (SIGSEGV after the
    # line), waited for tokenizer workers to finish the chunks handed to them (seconds) and
    # for the coordination service's barrier (its errors printed after the line)
    train = small_run(corpus_dir, tmp_path / "runs", steps=2, debug_signal_in="build")
    argv, line = {
        "train": (
            ["train", *cli_args(train)],
            "titan train: stopped by SIGINT while building the model, before the run started: "
            "nothing recorded\n",
        ),
        "plan": (PLAN, "titan plan: stopped by SIGTERM\n"),
        "tokenize": (
            ["tokenize", "--data", str(corpus_dir), "--vocab-size", "512"],
            "titan tokenize: interrupted; run it again to resume where it stopped\n",
        ),
    }[command]
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *argv], capture_output=True, text=True, timeout=300
    )
    # no atexit: no shutdown
    assert (done.returncode, done.stdout.replace(PREPARING, "")) == (EXIT_STOPPED, "")
    assert done.stderr == line


PREPARING = "titan: preparing the tokenizer\n"  # tokenize's phase line (stdout, no terminal)


def test_a_command_with_live_child_processes_is_not_cut_short():
    # ending at once would leave a tokenizer's workers running, and multiprocessing's resource
    # tracker warning of leaked semaphores after the stop line: the shutdown waits for them
    script = """
import multiprocessing, time
from titan.stopping import cut_short, mark_cut_short
if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(1,))
    child.start()
    mark_cut_short()
    print(cut_short())
    child.join()
    mark_cut_short()
    print(cut_short())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["False", "True"], done.stderr
