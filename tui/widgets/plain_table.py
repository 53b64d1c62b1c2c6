"""A ``DataTable`` of inert plain cells (:func:`tui.plain.cell`) drawn without Rich's layout.

Textual's ``DataTable`` draws every visible cell anew after each change (new rows, the cursor
leaving a row, the focus): each through Rich's padding and styling, about 0.1 ms a cell, so
that a page of History (12 columns, 30 rows shown) cost some 40 ms of the UI thread each time
(bench/console.py --scale). A plain one-line cell that fits its column comes out of that as
one segment: its text padded to the column's width, in the cell's style. :class:`PlainTable`
makes that segment directly, with the same style, so the table looks the same; any other cell
(a header, a number, a styled or too long text) goes through ``DataTable`` as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual._types import SegmentLines
from textual.widgets import DataTable
from textual.widgets.data_table import Column, RowKey

from tui.plain import PlainText


class PlainTable(DataTable[str]):
    """A ``DataTable`` whose :class:`~tui.plain.PlainText` cells are drawn as one segment each
    (single-line rows, no fixed rows or columns; otherwise exactly as ``DataTable``)."""

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
        row through ``DataTable``, which then sets the table's virtual size."""
        measured = []
        columns = self.ordered_columns
        for row_key in new_rows:
            cells = self._data.get(row_key)
            row = self.rows.get(row_key)
            values = [None] if cells is None else [cells.get(c.key) for c in columns]
            if (
                row is None
                or row.label is not None
                or row.auto_height
                or not all(type(value) is PlainText for value in values)
            ):
                measured.append(row_key)
                continue
            for column, value in zip(columns, values, strict=True):
                # Rich's measure of a Text: its longest line (rich.text.Text.__rich_measure__).
                width = max(map(cell_len, value.plain.splitlines()), default=0)
                column.content_width = max(column.content_width, width)
        super()._update_dimensions(measured)

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> SegmentLines:
        """The cell's lines: a plain cell's padded text in one segment, styled as
        ``DataTable._render_cell`` styles it (base, cell position, cursor and hover)."""
        text = self._plain_text(row_index, column_index, width)
        if text is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        key = (
            row_key,
            column_key,
            base_style,
            cursor,
            hover,
            self._show_hover_cursor,
            self._update_count,
            self._pseudo_class_state,
        )
        lines = self._cell_render_cache.get(key)
        if lines is None:
            component_style, post_style = self._get_styles_to_render_cell(
                False,
                False,
                False,
                hover,
                cursor,
                self.show_cursor,
                self._show_hover_cursor,
                self.cursor_foreground_priority == "css",
                self.cursor_background_priority == "css",
            )
            style = (
                base_style
                + Style.from_meta({"row": row_index, "column": column_index})
                + component_style
                + post_style
            )
            pad = " " * self.cell_padding
            fill = " " * (width - 2 * self.cell_padding - cell_len(text))
            lines = [[Segment(f"{pad}{text}{fill}{pad}", style)]]
            self._cell_render_cache[key] = lines
        return lines

    def _plain_text(self, row_index: int, column_index: int, width: int) -> str | None:
        """The text of a data cell drawn as it is in ``width`` cells with padding, else None."""
        if row_index < 0 or column_index < 0 or self.fixed_rows or self.fixed_columns:
            return None
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None or self.rows[row_key].height != 1:
            return None
        value = self._data[row_key].get(column_key)
        if type(value) is not PlainText:
            return None
        return value.one_line(width - 2 * self.cell_padding)
