"""Command-line tables that fit the terminal: columns chosen by priority, the key never wrapped.

A Rich table wider than the terminal squeezes every column to an ellipsis (run ids become
``tiny…``). :func:`fitted_table` instead keeps the columns that fit, in priority order (lowest
first; priority 0 is always kept), shows them in their own order, never wraps a ``key`` column
(it is cut with ``…`` only beyond 40% of the width, so that a run id of hundreds of
characters leaves room for the figures), and says in the caption which columns were left out
and that ``--wide`` shows all. The width of a column is its widest cell or heading (at most
``max_width`` for a column that may wrap) plus Rich's padding and rule: 3 characters, and 1 for
the table's edge.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Characters a column takes besides its cells: one space of padding each side and one rule.
COLUMN_CHROME = 3
# The share of the width a key column may take before its cells are cut with an ellipsis.
KEY_SHARE = 0.4


@dataclass(frozen=True)
class Column:
    """One column of a :func:`fitted_table`.

    Attributes:
        name: the heading. priority: 0 always shown; higher numbers are left out first.
        justify: ``left`` or ``right``. key: never wrapped (a run id); cut with ``…`` beyond
            :data:`KEY_SHARE` of the width (whole with ``--wide``).
        max_width: the widest this column is counted when fitting (its cells wrap beyond).
    """

    name: str
    priority: int
    justify: Literal["left", "right"] = "right"
    key: bool = False
    max_width: int | None = None


def console(fallback_width: int) -> Console:
    """A Rich console at the terminal's width; when the output is not a terminal (a pipe, a
    file), ``$COLUMNS`` when set, else ``fallback_width`` columns."""
    shown = Console()
    if shown.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return shown
    return Console(width=fallback_width)


def _plain(cell: Text | str) -> str:
    """A cell's text as shown (a string cell is Rich markup)."""
    return cell.plain if isinstance(cell, Text) else Text.from_markup(cell).plain


def _width(column: Column, cells: Sequence[Text | str], width: int | None) -> int:
    """The characters the column's heading and widest cell take (at most ``max_width``; a key
    column at most :data:`KEY_SHARE` of ``width``, its heading at least)."""
    widest = max([cell_len(column.name), *(cell_len(_plain(c)) for c in cells)])
    if column.key and width is not None:
        return min(widest, max(cell_len(column.name), int(width * KEY_SHARE) - COLUMN_CHROME))
    return min(widest, column.max_width) if column.max_width else widest


def fitted_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    width: int | None,
    caption: str | Text = "",
    **table_args: Any,
) -> tuple[Table, int]:
    """A Rich table of the ``columns`` (and the cells of ``rows``, one per column) that fit in
    ``width`` characters (all of them when ``width`` is None: ``--wide``). Returns the table and
    the width it needs (to print it uncropped).

    Args:
        caption: the table's caption (a string is Rich markup; record text comes as a
            :class:`rich.text.Text`, shown as written); a note of the columns left out is
            added to it.
        table_args: passed to :class:`rich.table.Table` (title, box, ...).
    """
    widths = [
        _width(c, [row[i] for row in rows], width) + COLUMN_CHROME for i, c in enumerate(columns)
    ]
    kept, used = set(), 1
    for i in sorted(range(len(columns)), key=lambda i: columns[i].priority):
        if columns[i].priority == 0 or width is None or used + widths[i] <= width:
            kept.add(i)
            used += widths[i]
    hidden = [c.name for i, c in enumerate(columns) if i not in kept]
    if hidden:
        note = f"left out at {width} columns: {', '.join(hidden)} (--wide shows all)"
        shown = Text.from_markup(caption) if isinstance(caption, str) else caption
        caption = Text.assemble(shown, "\n", note) if caption else note
    table = Table(caption=caption or None, **table_args)
    for i in sorted(kept):
        c = columns[i]
        table.add_column(
            c.name,
            justify=c.justify,
            no_wrap=c.key or c.max_width is None,
            overflow="ellipsis" if c.key else "fold",
            min_width=widths[i] - COLUMN_CHROME if c.key else None,
            max_width=widths[i] - COLUMN_CHROME if c.key else None,
        )
    for row in rows:
        table.add_row(*(row[i] for i in sorted(kept)))
    return table, used


def print_fitted(out: Console, table: Table, width: int) -> None:
    """Print a :func:`fitted_table` whole: at its own ``width`` when wider than ``out`` (with
    ``--wide``), never cropped."""
    out.width = max(out.width, width)  # Console.print's width is capped at the console's
    out.print(table, crop=False)
