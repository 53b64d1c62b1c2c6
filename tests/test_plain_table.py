"""The console's PlainTable draws and sizes plain cells exactly as Textual's DataTable does."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import DataTable

from tui.plain import cell
from tui.widgets.plain_table import PlainTable

ROWS = [("run-1", "completed", "[b]tiny[/b]"), ("a-much-longer-run-id", "failed", "-")] * 3


class _Tables(App[None]):
    def compose(self) -> ComposeResult:
        for table in (DataTable(zebra_stripes=True), PlainTable(zebra_stripes=True)):
            table.cursor_type = "row"
            yield table

    def on_mount(self) -> None:
        for table in self.query(DataTable):
            table.add_columns("run", "status", "preset")
            for i, row in enumerate(ROWS):
                table.add_row(*(cell(value) for value in row), key=str(i))


def _lines(table: DataTable) -> list[list[tuple[str, object]]]:
    """The text and style of each segment of the header and every row, as drawn."""
    return [
        [(s.text, s.style) for s in table.render_line(y).simplify()] for y in range(len(ROWS) + 1)
    ]


async def test_plain_table_lines_are_datatables_lines_segment_for_segment():
    app = _Tables()
    drawn, widths = [], []
    async with app.run_test(size=(60, 20)) as pilot:
        for table in app.query(DataTable):  # each with the focus and the cursor on row 2
            table.move_cursor(row=2)
            table.focus()
            await pilot.pause()
            drawn.append(_lines(table))
            widths.append([c.content_width for c in table.ordered_columns])
    assert drawn[1] == drawn[0] and widths == [[20, 9, 11]] * 2
    assert "[b]tiny[/b]" in "".join(text for text, _ in drawn[1][1])  # inert, as typed
