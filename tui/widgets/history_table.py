"""The History table: one row per ingested run, sortable by any column, filtered by text."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from tui.history import HistoryRow
from tui.plain import cell

COLUMNS = (
    "run",
    "status",
    "preset",
    "layout",
    "dev",
    "steps",
    "tok/s",
    "MFU",
    "tok/J",
    "ETTR",
    "best loss",
    "started",
)
# The HistoryRow field behind each column (the sort key).
_FIELDS = (
    "run_id",
    "status",
    "preset",
    "layout",
    "devices",
    "steps",
    "tokens_per_s",
    "mfu",
    "tokens_per_j",
    "ettr",
    "best_loss",
    "started_at",
)


def _cells(row: HistoryRow) -> tuple[str, ...]:
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    started = (
        "-"
        if row.started_at is None
        else time.strftime("%Y-%m-%d %H:%M", time.localtime(row.started_at))
    )
    return (
        row.run_id,
        row.status,
        row.preset or "-",
        row.layout or "-",
        num(row.devices, "d"),
        num(row.steps, "d"),
        num(row.tokens_per_s, ",.0f"),
        num(row.mfu, ".1%"),
        num(row.tokens_per_j, ",.1f"),
        num(row.ettr, ".1%"),
        num(row.best_loss, ".3f"),
        started,
    )


class HistoryTable(DataTable[str]):
    """Rows keyed by run id. ``o`` sorts by the next column, ``O`` reverses the order,
    ``space`` marks a run for comparison; ``enter`` selects (``DataTable.RowSelected``). Cells
    are inert plain text (:func:`tui.plain.cell`)."""

    BINDINGS = [
        Binding("enter", "select_cursor", "Detail"),
        Binding("o", "sort_next", "Sort"),
        Binding("O", "sort_reverse", "Reverse"),
        Binding("space", "mark", "Mark"),
    ]

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.all_rows: list[HistoryRow] = []
        self.marked: list[str] = []
        self.filter_text = ""
        self._sort: tuple[int, bool] = (len(COLUMNS) - 1, True)  # newest first
        self._column_keys: list[ColumnKey] = []

    def on_mount(self) -> None:
        self._column_keys = self.add_columns(*self._labels())

    def _labels(self) -> list[str]:
        """The column headings, the sort column's with its order (``▲`` ascending, ``▼``
        descending; ``^`` and ``v`` with ``--ascii``)."""
        column, reverse = self._sort
        ascending, descending = ("^", "v") if getattr(self.app, "ascii_only", False) else "▲▼"
        arrow = descending if reverse else ascending
        return [f"{name} {arrow}" if i == column else name for i, name in enumerate(COLUMNS)]

    def shown_ids(self) -> list[str]:
        """The run ids shown, in table order."""
        return [
            str(self.coordinate_to_cell_key((i, 0)).row_key.value) for i in range(self.row_count)
        ]

    def show(self, rows: Sequence[HistoryRow]) -> None:
        """Replace the runs (the filter and sort stay)."""
        self.all_rows = list(rows)
        self._redraw()

    def set_filter(self, text: str) -> None:
        """Show only the runs with ``text`` in one of their cells (case-insensitive)."""
        self.filter_text = text.strip().lower()
        self._redraw()

    @property
    def sorted_by(self) -> str:
        """The sort column and order (``steps ascending``)."""
        column, reverse = self._sort
        return f"{COLUMNS[column]} {'descending' if reverse else 'ascending'}"

    def action_sort_next(self) -> None:
        self._sort = ((self._sort[0] + 1) % len(COLUMNS), False)
        self._redraw()

    def action_sort_reverse(self) -> None:
        self._sort = (self._sort[0], not self._sort[1])
        self._redraw()

    def action_mark(self) -> None:
        if not self.row_count:
            return
        run_id = str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked = [*self.marked[-1:], run_id]  # the last two marked are compared
        self._redraw()

    def _redraw(self) -> None:
        selected = None
        if self.row_count:
            selected = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        column, reverse = self._sort
        for key, label in zip(self._column_keys, self._labels(), strict=True):
            heading = self.columns[key]
            heading.label = Text(label)
            heading.content_width = max(heading.content_width, cell_len(label))
        field = _FIELDS[column]
        rows = [r for r in self.all_rows if self._matches(r)]
        present = [r for r in rows if getattr(r, field) is not None]
        present.sort(key=lambda r: getattr(r, field), reverse=reverse)
        self.clear()
        for row in present + [r for r in rows if getattr(r, field) is None]:
            cells = _cells(row)
            mark = "* " if row.run_id in self.marked else ""
            self.add_row(*(cell(c) for c in (mark + cells[0], *cells[1:])), key=row.run_id)
        if selected is not None and selected in self.rows:
            self.move_cursor(row=self.get_row_index(selected))

    def _matches(self, row: HistoryRow) -> bool:
        return not self.filter_text or any(self.filter_text in c.lower() for c in _cells(row))
