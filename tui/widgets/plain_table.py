"""A ``DataTable`` of inert plain cells (:func:`tui.plain.cell`) drawn without Rich's layout.

Textual's ``DataTable`` draws every visible row anew after each change (new rows, the cursor
moving, the focus), each cell through Rich's padding and styling: some 40 ms of the UI thread
for a page of History (12 columns, 30 rows shown; bench/console.py --scale), and as much to
measure a new page's cells. A plain one-line cell that fits its column comes out of that as
one segment, its text padded to the column's width in the cell's style. :class:`PlainTable`
makes that segment directly, with the same style, and measures such a cell by its length, so
the table looks and sizes the same; any other row (the header, numbers, a styled or too long
text) goes through ``DataTable`` as before.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, cast

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import Column, RowKey

from tui.plain import PlainText

SegmentLines = list[list[Segment]]  # lines of segments, as DataTable's row renderer returns them


@functools.lru_cache(maxsize=4096)
def _position(row_index: int, column_index: int) -> Style:
    """The meta that ``DataTable`` gives a cell's segments (a click reads it)."""
    return Style.from_meta({"row": row_index, "column": column_index})


@functools.lru_cache(maxsize=1024)
def _past_the_columns(row_index: int) -> Style:
    """The meta of the fill right of a row's last column (``DataTable``'s)."""
    return Style.from_meta({"row": row_index, "column": 0, "out_of_bounds": True})


class PlainTable(DataTable[object]):  # cells: PlainText, or any value DataTable formats
    """A ``DataTable`` whose rows of :class:`~tui.plain.PlainText` cells are drawn and measured
    directly (row cursor, single-line rows, no fixed rows or columns, no row labels; otherwise
    exactly as ``DataTable``). ``j``/``k`` move the cursor as the arrows do, ``g``/``G`` to the
    first and last row (as ctrl+home and ctrl+end), as in less and vim."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "scroll_top", "First row", show=False),
        Binding("G", "scroll_bottom", "Last row", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        self._columns_in_order: list[Column] = []
        super().__init__(**kwargs)

    @property
    def ordered_columns(self) -> list[Column]:
        """The columns as added (they are never moved). ``DataTable`` works this list out again
        for every cell it draws or measures, a linear search per column."""
        if len(self._columns_in_order) != len(self.columns):
            self._columns_in_order = super().ordered_columns
        return self._columns_in_order

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """Widen the columns to the new rows' cells: a row of plain cells by the cells' lengths
        (what ``DataTable`` measures them to through Rich, at a tenth of the cost), any other
        row through ``DataTable``, which then sets the table's virtual size.

        New rows are measured when the table is next idle, and on a loaded machine the screen
        can draw them before that, cut to the old widths. ``DataTable`` caches those lines
        under a key that a wider column does not change (unless the table's size changes
        too), so a column that widens here starts every cache anew."""
        measured = []
        columns = self.ordered_columns
        widths = [column.content_width for column in columns]
        for row_key in new_rows:
            cells = self._data.get(row_key)
            row = self.rows.get(row_key)
            values = [None] if cells is None else [cells.get(c.key) for c in columns]
            plain = [value for value in values if type(value) is PlainText]
            if row is None or row.label is not None or row.auto_height or len(plain) < len(values):
                measured.append(row_key)
                continue
            for column, value in zip(columns, plain, strict=True):
                # Rich's measure of a Text: its longest line (rich.text.Text.__rich_measure__).
                width = max(map(cell_len, value.plain.splitlines()), default=0)
                column.content_width = max(column.content_width, width)
        super()._update_dimensions(measured)
        if widths != [column.content_width for column in columns]:
            self._update_count += 1  # a part of every cache key of DataTable's
            self.refresh()

    def _plain_row(self, row_key: RowKey) -> tuple[str, ...] | None:
        """The row's cells, each padded to its column's width less the cell padding, when
        every one is a plain text drawn as it is there (else None: ``DataTable`` draws it)."""
        if (
            row_key is self._header_row_key
            or self.cursor_type != "row"
            or self.fixed_rows
            or self.fixed_columns
            or self._should_render_row_labels
        ):
            return None
        row, cells = self.rows.get(row_key), self._data.get(row_key)
        if row is None or cells is None or row.height != 1:
            return None
        texts: list[str] = []
        for column in self.ordered_columns:
            value = cells.get(column.key)
            room = column.get_render_width(self) - 2 * self.cell_padding
            text = value.one_line(room) if type(value) is PlainText else None
            if text is None:
                return None
            texts.append(text + " " * (room - cell_len(text)))
        return tuple(texts)

    def _render_line_in_row(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Coordinate,
        hover_location: Coordinate,
    ) -> tuple[SegmentLines, SegmentLines]:
        """A row's line: for a row of plain cells, each cell's padded text in one segment,
        styled as ``DataTable._render_cell`` styles it (the row's style, cursor and hover, the
        cell's position as meta), then the fill to the table's width as
        ``DataTable._render_line_in_row`` draws it; any other row through ``DataTable``."""
        texts = self._plain_row(row_key)
        if texts is None:
            return super()._render_line_in_row(
                row_key, line_no, base_style, cursor_location, hover_location
            )
        row_index = self._row_locations.get(row_key)
        assert row_index is not None  # _plain_row found the row
        cursor, hover = cursor_location.row == row_index, hover_location.row == row_index
        state = (self.show_cursor, self._show_hover_cursor)
        # A key of another shape in DataTable's row cache, so that its clears apply here too.
        key = cast(
            Any,
            (
                row_key,
                row_index,
                base_style,
                cursor,
                hover,
                state,
                self._pseudo_class_state,
                texts,
            ),
        )
        lines = self._row_render_cache.get(key)
        if lines is None:
            lines = self._plain_line(row_index, base_style, cursor, hover, texts)
            self._row_render_cache[key] = lines
        return lines

    def _plain_line(
        self, row_index: int, base_style: Style, cursor: bool, hover: bool, texts: tuple[str, ...]
    ) -> tuple[SegmentLines, SegmentLines]:
        """The segments of :meth:`_render_line_in_row` for a row of plain cells."""
        row_style = self._get_row_style(row_index, base_style)
        show = (self.show_cursor, self._show_hover_cursor)
        css_first = (
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        cell_style, post_style = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, *show, *css_first
        )
        fill_style, _ = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, *show, False, False
        )
        pad = " " * self.cell_padding
        style = row_style + cell_style + post_style
        line = [
            [Segment(f"{pad}{text}{pad}", style + _position(row_index, column))]
            for column, text in enumerate(texts)
        ]
        width = sum(map(cell_len, texts)) + 2 * len(pad) * len(texts)
        fill = " " * max(0, self.size.width - width)
        line.append([Segment(fill, row_style + fill_style + _past_the_columns(row_index))])
        return [], line
