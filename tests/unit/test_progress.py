"""What ``titan train`` shows while it works: every long phase names itself with its elapsed
time, sizes are written in the unit that fits, a diffusion run's throughput is in images."""

from __future__ import annotations

import io
import time

from rich.console import Console

from titan.data.tokenize import TokenizeProgress
from titan.telemetry.events import Step
from titan.trainer.progress import TrainProgress


def _terminal_progress() -> tuple[TrainProgress, io.StringIO]:
    progress = TrainProgress(total_steps=2, log_every=1)
    screen = io.StringIO()
    progress.console = Console(file=screen, force_terminal=True, width=100)
    progress.interactive = True
    return progress, screen


def test_a_phase_in_a_terminal_shows_its_name_and_the_elapsed_time_ticking():
    progress, screen = _terminal_progress()
    with progress.status("compiling the train step"):
        time.sleep(2.2)
    shown = screen.getvalue()
    assert "compiling the train step" in shown
    assert "0:00:00" in shown and "0:00:02" in shown  # the clock moved while it compiled


def test_a_phase_during_the_training_bar_shows_beside_the_bar():
    """A phase after the first step (the pinned host reservation) shows its spinner, elapsed
    time and name while the training bar is live (nested live displays), inert; the bar goes
    on after it, its remaining time measured from the steps after the pause."""
    progress, screen = _terminal_progress()
    progress.total_steps = 10
    progress.step(_step(step=1, tokens=2048, tokens_per_s=20480.0))
    time.sleep(0.1)
    progress.step(_step(step=2, tokens=2048, tokens_per_s=20480.0))
    (task,) = progress._bar.tasks
    started = task.start_time
    assert task.speed is not None
    with progress.status("reserving [bold]pinned[/bold] host memory"):
        time.sleep(1.2)
    # the remaining time's rate starts after the pause; the elapsed time does not
    assert (task.speed, task.start_time, task.completed) == (None, started, 2)
    progress.step(_step(step=3, tokens=4096, tokens_per_s=40960.0))
    progress.close()
    shown = screen.getvalue()
    assert "reserving [bold]pinned[/bold] host memory" in shown
    assert "0:00:01" in shown.split("reserving", 1)[1]
    assert "40,960 tok/s" in shown.rsplit("reserving", 1)[1]


def test_a_phase_in_a_log_is_one_line(capsys):
    progress = TrainProgress(total_steps=2, log_every=1)
    with progress.status("compiling the train step"):
        pass
    assert capsys.readouterr().out == "titan: compiling the train step\n"


def test_tokenize_lines_write_small_corpora_in_megabytes(capsys):
    progress = TrainProgress(total_steps=2, log_every=1)
    done = TokenizeProgress(
        documents=10, tokens=1_000, bytes_done=12_000_000, bytes_total=24_000_000, elapsed_s=11
    )
    progress.tokenize(lambda report: report(done))
    line = capsys.readouterr().out
    assert line == "titan: tokenizing: 50% of 24 MB, ETA 11s, 1,000 tokens, 91 tokens/s\n"


def _step(**fields) -> Step:
    values = {"step": 2, "loss": 1.5, "grad_norm": 0.5, "lr": 1e-3, "step_time_s": 0.1}
    return Step(**{**values, **fields})


def test_step_lines_give_tokens_or_images_per_second(capsys):
    progress = TrainProgress(total_steps=2, log_every=1)
    progress.step(_step(tokens=2048, tokens_per_s=20480.0))
    progress.step(_step(tokens=16, tokens_per_s=160.0, images_per_s=640.0))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("lr 1.00e-03  20,480 tok/s")
    assert lines[1].endswith("lr 1.00e-03  640 img/s")
