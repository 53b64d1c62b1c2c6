"""The History table: a page of the ingested runs, sorted by any column and filtered by text in
SQL (:class:`tui.history_queries.HistoryQuery`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets.data_table import ColumnKey

from titan.formatting import format_bounded, format_clock
from tui.history_queries import HistoryPage, HistoryQuery, HistoryRow
from tui.plain import LAYOUT_WIDTH, PRESET_WIDTH, STATUS_WIDTH, PlainText, plain, short
from tui.widgets.plain_table import PlainTable

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
# The HistoryRow field behind each column (the sort key, a tui.history_queries.SORT_FIELDS name).
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
# The order in which the columns keep their place when the table is too narrow for all of
# them: the run, its status and its figures first; the rest give way from the end (a run's
# detail, enter, shows every value).
KEEP_ORDER = (
    "run_id",
    "status",
    "best_loss",
    "tokens_per_s",
    "mfu",
    "steps",
    "ettr",
    "tokens_per_j",
    "devices",
    "preset",
    "layout",
    "started_at",
)


def _cells(row: HistoryRow) -> tuple[str, ...]:
    def num(value: float | None, spec: str) -> str:
        return format_bounded(value, spec)

    started = format_clock(row.started_at, "%Y-%m-%d %H:%M")
    return (
        row.run_id,
        short(row.status, STATUS_WIDTH),
        short(row.preset or "-", PRESET_WIDTH),
        short(row.layout or "-", LAYOUT_WIDTH),
        num(row.devices, "d"),
        num(row.steps, ",d"),
        num(row.tokens_per_s, ",.0f"),
        num(row.mfu, ".1%"),
        num(row.tokens_per_j, ",.2f"),
        num(row.ettr, ".1%"),
        num(row.best_loss, ".3f"),
        started,
    )


class HistoryTable(PlainTable):
    """One page of History (:class:`~tui.history_queries.HistoryPage`), rows keyed by run id. The
    table never queries: ``o`` (sort by the next column), ``O`` (reverse), a filter, ``]``/``[`` and
    moving past the first or last row of the page post :class:`QueryChanged`, and the screen
    fetches that page in a worker and calls :meth:`show`. ``space`` marks a run for comparison;
    ``enter`` selects (``DataTable.RowSelected``). Cells are inert plain text
    (:func:`tui.plain.cell`); the run column comes first and is never truncated, a long status,
    preset or layout is cut, ending in "…" (:func:`tui.plain.short`). The columns that do not
    fit the table's width give way whole, in :data:`KEEP_ORDER` from its end, so that no
    heading or value is cut at the edge; :attr:`hidden` names them, and
    :class:`ColumnsChanged` says when they change."""

    BINDINGS = [
        Binding("enter", "select_cursor", "Detail"),
        Binding("o", "sort_next", "Sort"),
        Binding("O", "sort_reverse", "Reverse", show=False),
        Binding("space", "mark", "Mark", show=False),
        Binding("right_square_bracket", "page(1)", "Next page", show=False),
        Binding("left_square_bracket", "page(-1)", "Previous page", show=False),
    ]

    @dataclass
    class QueryChanged(Message):
        """The rows to show changed (sort, filter or page): fetch ``query``'s page."""

        query: HistoryQuery

    @dataclass
    class ColumnsChanged(Message):
        """The columns shown changed (the table's width, or its values' widths)."""

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.page = HistoryPage(HistoryQuery(), [], 0, 0, 0)
        self.requested = HistoryQuery()  # newest first
        self.marked: list[str] = []
        self._cursor_to: int | None = None  # the row the cursor goes to on the next page
        self._column_keys: list[ColumnKey] = []
        self._shown: tuple[int, ...] = tuple(range(len(COLUMNS)))  # indexes into COLUMNS
        self._width = 0  # the width the shown columns were fitted to

    def on_mount(self) -> None:
        self._column_keys = self.add_columns(*self._labels())

    def on_resize(self) -> None:
        if self.size.width != self._width:
            self._redraw()

    @property
    def hidden(self) -> list[str]:
        """The headings of the columns left out for want of width, in table order (the sort
        column's with its arrow, as it would be drawn)."""
        return [label for i, label in enumerate(self._labels()) if i not in self._shown]

    @property
    def filter_text(self) -> str:
        return self.requested.text

    @property
    def current(self) -> bool:
        """Whether the page shown is the one last requested."""
        return self.page.query == self.requested

    def _labels(self) -> list[str]:
        """The column headings, the sort column's with its order (``▲`` ascending, ``▼``
        descending; ``^`` and ``v`` with ``--ascii``)."""
        column = _FIELDS.index(self.requested.sort)
        ascending, descending = ("^", "v") if getattr(self.app, "ascii_only", False) else "▲▼"
        arrow = descending if self.requested.descending else ascending
        return [f"{name} {arrow}" if i == column else name for i, name in enumerate(COLUMNS)]

    @property
    def sorted_by(self) -> str:
        """The sort column and order (``steps ascending``)."""
        column = COLUMNS[_FIELDS.index(self.requested.sort)]
        return f"{column} {'descending' if self.requested.descending else 'ascending'}"

    def _request(self, cursor_to: int | None = None, **changes: Any) -> None:
        """Ask for another page: the query with ``changes``; the cursor then goes to row
        ``cursor_to`` (-1: the last) of it, else stays on its run when listed."""
        self.requested = dataclasses.replace(self.requested, **changes)
        self._cursor_to = cursor_to
        self._relabel()
        self.post_message(self.QueryChanged(self.requested))

    def set_filter(self, text: str) -> None:
        """Show only the runs with ``text`` in their run id, status, preset or layout
        (case-insensitive), from the first page."""
        self._request(text=text.strip().lower(), offset=0)

    def action_sort_next(self) -> None:
        column = (_FIELDS.index(self.requested.sort) + 1) % len(COLUMNS)
        self._request(sort=_FIELDS[column], descending=False, offset=0)

    def action_sort_reverse(self) -> None:
        self._request(descending=not self.requested.descending, offset=0)

    def action_page(self, pages: int) -> None:
        """The next (``1``) or previous (``-1``) page, when there is one."""
        offset = self.page.offset + pages * self.requested.limit
        if 0 <= offset < self.page.matched and offset != self.page.offset:
            self._request(0 if pages > 0 else -1, offset=max(offset, 0))

    def action_cursor_down(self) -> None:
        """Down a row; from the page's last row to the next page."""
        if self.row_count and self.cursor_row == self.row_count - 1:
            self.action_page(1)
        else:
            super().action_cursor_down()

    def action_cursor_up(self) -> None:
        """Up a row; from the page's first row to the previous page."""
        if self.cursor_row == 0 and self.page.offset > 0:
            self.action_page(-1)
        else:
            super().action_cursor_up()

    def show(self, page: HistoryPage) -> None:
        """Draw ``page`` (the cursor as :meth:`_request` asked, else on the same run)."""
        self.page = page
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

    def _relabel(self) -> None:
        """Put the sort arrow on the headings; they are drawn with the next page (DataTable
        keeps drawn cells until its rows change: a refresh now would draw the old ones)."""
        labels = self._labels()
        for key, label in zip(self._column_keys, (labels[i] for i in self._shown), strict=True):
            heading = self.columns[key]
            heading.label = Text(label)
            heading.content_width = max(heading.content_width, cell_len(label))

    def _fit(self, rows: list[tuple[PlainText, ...]]) -> None:
        """Choose the columns that fit the table's width (all of them before it has one), in
        :data:`KEEP_ORDER`, and make them the table's columns when they changed."""
        self._width = width = self.size.width
        labels = self._labels()
        if width:
            width -= self.styles.scrollbar_size_vertical  # room for the scrollbar, shown or not
            needs = [
                max((cell_len(cells[i].plain) for cells in rows), default=0)
                for i in range(len(COLUMNS))
            ]
            shown: list[int] = []
            for name in KEEP_ORDER:
                i = _FIELDS.index(name)
                need = max(needs[i], cell_len(labels[i])) + 2 * self.cell_padding
                if need > width and shown:  # the run column stays, however narrow
                    break
                shown.append(i)
                width -= need
            fitted = tuple(sorted(shown))
        else:
            fitted = tuple(range(len(COLUMNS)))
        if fitted == self._shown:
            return
        self._shown = fitted
        self.clear(columns=True)
        self._column_keys = self.add_columns(*(labels[i] for i in fitted))
        self.post_message(self.ColumnsChanged())

    def _redraw(self) -> None:
        selected = None
        if self.row_count:
            selected = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        rows: list[tuple[str, tuple[PlainText, ...]]] = []
        for row in self.page.rows:
            texts = _cells(row)
            mark = "* " if row.run_id in self.marked else ""
            rows.append((row.run_id, tuple(plain(t) for t in (mark + texts[0], *texts[1:]))))
        self._fit([cells for _, cells in rows])
        self._relabel()
        self.clear()
        for heading in self.columns.values():  # sized afresh: by its label, then the new rows
            heading.content_width = heading.label.cell_len
        for run_id, cells in rows:
            self.add_row(*(cells[i] for i in self._shown), key=run_id)
        if self._cursor_to is not None and self.row_count:
            self.move_cursor(row=self._cursor_to % self.row_count)
            self._cursor_to = None
        elif selected is not None and selected in self.rows:
            self.move_cursor(row=self.get_row_index(selected))
