"""Progress of a command's long work on stderr: a transient bar in a terminal (what is done, of
how much, and the elapsed time), nothing elsewhere, where a log gets the command's result line
alone. ``titan train`` has its own (:mod:`titan.trainer.progress`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Item = TypeVar("Item")


@contextlib.contextmanager
def progress_bar(what: str) -> Iterator[Callable[[int, int], None]]:
    """``update(done, total)`` for the work ``what`` (plain text, shown as it is), drawn on
    stderr while the block runs when stderr is a terminal; a no-op elsewhere."""
    if not sys.stderr.isatty():  # Rich takes FORCE_COLOR for a terminal: a log file is none
        yield lambda done, total: None
        return
    console = Console(stderr=True)
    columns = (TextColumn(what, markup=False), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def tracked(items: Sequence[Item], what: str, every: int = 1000) -> Iterable[Item]:
    """``items`` in order, with :func:`progress_bar` of ``what`` moved every ``every`` items."""
    with progress_bar(what) as update:
        for index, item in enumerate(items):
            if index % every == 0:
                update(index, len(items))
            yield item
        update(len(items), len(items))
