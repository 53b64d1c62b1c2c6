"""What ``titan train`` shows while it works.

In a terminal: a rich progress bar with step, loss, tokens/s, elapsed and remaining time, and a
spinner/bar for tokenization. Otherwise (a pipe, a log file, the console's subprocess): one plain
line every ``log_every`` steps, so logs stay small and readable.
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
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from titan.inert import inert
from titan.observability.events import Eval, Step


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
        self._task = None

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        """A spinner (terminal) or one line (log) while ``message`` is being done (shown inert,
        never as markup: it may name a path)."""
        if self.interactive:
            with self.console.status(Text(inert(message))):
                yield
        else:
            print(f"titan: {inert(message)}", flush=True)
            yield

    def tokenize(self, build: Callable[[Callable[[int], None]], Any]) -> Any:
        """Run ``build(report)``, where ``report(documents_done)`` advances a progress line."""
        if not self.interactive:
            return build(lambda done: None)
        with Progress(
            SpinnerColumn(),
            TextColumn("tokenizing the corpus"),
            TextColumn("{task.completed:,} documents"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as bar:
            task = bar.add_task("tokenize", total=None)
            return build(lambda done: bar.update(task, completed=done))

    def step(self, event: Step) -> None:
        """Show one ``step`` event."""
        if self.interactive:
            self._ensure_bar(event.step - 1)
            fields = f"loss {event.loss:.4f}  {event.tokens_per_s:,.0f} tok/s"
            self._bar.update(self._task, completed=event.step, fields=fields)
        elif event.step % self.log_every == 0 or event.step == self.total_steps:
            print(
                f"step {event.step}/{self.total_steps}  loss {event.loss:.4f}  "
                f"grad_norm {event.grad_norm:.3f}  lr {event.lr:.2e}  "
                f"{event.tokens_per_s:,.0f} tok/s",
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

    def _ensure_bar(self, start: int) -> None:
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

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, status: str, step: int, run_dir: Path) -> None:
        """The run's closing line."""
        print(f"titan: run {status} at step {step}: {inert(run_dir)}", file=sys.stderr, flush=True)
