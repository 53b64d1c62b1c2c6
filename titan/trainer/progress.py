"""What ``titan train`` shows while it works.

In a terminal: a rich progress bar with step, loss, tokens/s, elapsed and remaining time, and a
bar for tokenization (bytes read, tokens/s, ETA). Otherwise (a pipe, a log file, the console's
subprocess): one plain line every ``log_every`` steps (and every 10 s of tokenization), so logs
stay small and readable.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from titan.data.tokenize import TokenizeProgress
from titan.formatting import format_duration, format_size
from titan.inert import inert
from titan.telemetry.events import Eval, Step

TOKENIZE_LOG_EVERY_S = 10.0


def _line(done: TokenizeProgress) -> str:
    """``45% of 2.1 GB, ETA 1m40s, 123,456 tokens, 1,234,567 tokens/s`` (the ETA early, so
    that a narrow terminal, which cuts the line's end, still shows it)."""
    share = done.bytes_done / done.bytes_total if done.bytes_total else 1.0
    return (
        f"{share:.0%} of {format_size(done.bytes_total)}, ETA {format_duration(done.eta_s)}, "
        f"{done.tokens:,} tokens, {done.tokens_per_s:,.0f} tokens/s"
    )


def _throughput(event: Step) -> str:
    """``12,345 tok/s``, or ``1,234 img/s`` for a diffusion run (its rows are images)."""
    if event.images_per_s is not None:
        return f"{event.images_per_s:,.0f} img/s"
    return f"{_metric(event, 'tokens_per_s', ',.0f')} tok/s"


def _metric(event: Step, name: str, spec: str) -> str:
    """The step's ``name`` formatted by ``spec``; for a value the step has not (None): what
    its ``nonfinite`` field says of it (``nan``, ``inf``), else ``-``."""
    value = getattr(event, name)
    if value is None:
        return (event.nonfinite or {}).get(name, "-")
    return format(value, spec)


def _skipped(event: Step) -> str:
    """``  (update skipped)`` for a step whose update was not applied, else ``""``."""
    return "  (update skipped)" if event.skipped else ""


class _TokenizeLog:
    """Plain progress lines of tokenization, one every :data:`TOKENIZE_LOG_EVERY_S` seconds."""

    def __init__(self) -> None:
        self._next = TOKENIZE_LOG_EVERY_S

    def report(self, done: TokenizeProgress) -> None:
        if done.elapsed_s >= self._next:
            self._next = done.elapsed_s + TOKENIZE_LOG_EVERY_S
            print(f"titan: tokenizing: {_line(done)}", flush=True)


class TrainProgress:
    """Progress display of one run.

    Args:
        total_steps: the run's final step.
        log_every: plain-log interval in steps (when not in a terminal).
    """

    def __init__(self, total_steps: int, log_every: int) -> None:
        self.console = Console(stderr=True)
        self.interactive = self.console.is_terminal
        self.total_steps = total_steps
        self.log_every = log_every
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        """A spinner with the elapsed time ticking (terminal) or one line (log) while
        ``message`` is being done (shown inert, never as markup: it may name a path)."""
        if self.interactive:
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            ) as spinner:
                spinner.add_task(inert(message), total=None)
                yield
            if self._bar is not None:  # shown under the training bar: a pause of the steps
                self._restart_rate()
        else:
            print(f"titan: {inert(message)}", flush=True)
            yield

    def tokenize(self, build: Callable[[Callable[[TokenizeProgress], None]], Any]) -> Any:
        """Run ``build(report)``, where ``report(progress)`` after each chunk advances a bar
        (terminal: bytes read, tokens, tokens/s, ETA) or prints a line every
        :data:`TOKENIZE_LOG_EVERY_S` seconds (no terminal)."""
        if not self.interactive:
            return build(_TokenizeLog().report)
        with Progress(
            TextColumn("tokenizing"),
            BarColumn(),
            TextColumn("{task.fields[fields]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as bar:
            task = bar.add_task("tokenize", total=None, fields="")

            def report(done: TokenizeProgress) -> None:
                bar.update(
                    task, completed=done.bytes_done, total=done.bytes_total, fields=_line(done)
                )

            return build(report)

    def step(self, event: Step) -> None:
        """Show one ``step`` event."""
        if self.interactive:
            bar, task = self._ensure_bar(event.step - 1)
            fields = f"loss {_metric(event, 'loss', '.4f')}  {_throughput(event)}{_skipped(event)}"
            bar.update(task, completed=event.step, fields=fields)
        elif event.step % self.log_every == 0 or event.step == self.total_steps:
            print(
                f"step {event.step}/{self.total_steps}  loss {_metric(event, 'loss', '.4f')}  "
                f"grad_norm {_metric(event, 'grad_norm', '.3f')}  lr {_metric(event, 'lr', '.2e')}"
                f"  {_throughput(event)}{_skipped(event)}",
                flush=True,
            )

    def eval(self, event: Eval) -> None:
        """Show one ``eval`` event (one line, above the progress bar when there is one)."""
        perplexity = "" if event.perplexity is None else f"  perplexity {event.perplexity:.2f}"
        print(
            f"eval after step {event.step}: loss {event.loss:.4f}{perplexity}  "
            f"{event.tokens:,} tokens  {event.seconds:.2f} s",
            flush=True,
        )

    def _ensure_bar(self, start: int) -> tuple[Progress, TaskID]:
        """The training bar and its task, made (from step ``start``) when there is none."""
        if self._bar is None:
            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[fields]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task(
                "train", total=self.total_steps, completed=start, fields=""
            )
            self._bar.start()
        assert self._task is not None  # added with the bar
        return self._bar, self._task

    def _restart_rate(self) -> None:
        """The training bar's remaining time is measured from the next steps on (rich's rate
        would otherwise span the pause for its 30 s window); its elapsed time is kept."""
        assert self._bar is not None and self._task is not None
        task = next(t for t in self._bar.tasks if t.id == self._task)
        started = task.start_time
        self._bar.reset(self._task, completed=int(task.completed), **task.fields)
        task.start_time = started

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, status: str, step: int, run_dir: Path) -> None:
        """The run's closing line."""
        print(f"titan: run {status} at step {step}: {inert(run_dir)}", file=sys.stderr, flush=True)
