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


class _Narrow(App[None]):
    """A table wider than the screen by its headings alone (a scrollbar from the start)."""

    def compose(self) -> ComposeResult:
        table = PlainTable(cursor_type="row")
        table.styles.height = 8  # a new row resizes nothing (History fills its screen)
        table.add_columns("run", "status", "preset", "a-heading-wider-than-the-screen")
        yield table


def _row_text(table: DataTable, y: int) -> str:
    return "".join(s.text for s in table.render_line(y))


async def test_rows_drawn_before_their_columns_are_measured_are_drawn_again_at_full_width():
    """A loaded machine can draw new rows before the table's idle handler measures them (at
    the headings' widths); once measured they are drawn again, never served from the cache
    (Textual's DataTable serves them from it while its size stays the same)."""
    app = _Narrow()
    async with app.run_test(size=(30, 20)) as pilot:
        await pilot.pause()
        table = app.query_one(PlainTable)
        table.add_row(*(cell(v) for v in ("llama3-1b-h200", "running", "-", "-")))
        early = _row_text(table, 1)  # drawn now, before the idle measure
        await pilot.pause()
        assert "llama3-1b-h200" not in early
        assert "llama3-1b-h200" in _row_text(table, 1)


def test_textual_is_the_major_release_whose_datatable_rows_plaintable_draws():
    """PlainTable overrides DataTable's row drawing (members outside Textual's public API), so
    pyproject.toml pins textual below 9; a new major release fails here until PlainTable is
    checked against it (the test above compares the two tables' segments)."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    major = int(version("textual").split(".")[0])
    assert major == 8, f"textual {version('textual')}: check PlainTable, then the pin"
    root = next(p for p in Path(__file__).parents if (p / "pyproject.toml").is_file())
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert "textual>=8,<9" in pyproject["project"]["dependencies"]
