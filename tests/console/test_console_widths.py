"""Whole words at 80x24, through Textual's pilot: a table too narrow for all its columns leaves
whole columns out, in its order of priority (the run, its status and its figures first),
instead of cutting the last one at the edge (on the sample runs with a custom shape's name);
the planner's totals break a long value between words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from console_helpers import wait_until
from rich.cells import cell_len
from samples import copy_sample_runs
from textual.widgets import DataTable, Static

from titan.telemetry.records import EVENTS_FILE
from tui.app import TitanConsole
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.history_table import HistoryTable
from tui.widgets.plan_tables import PlanTables, totals_rows

CUSTOM_SHAPE = "d_model=256,n_layers=4,n_heads=4,n_kv_heads=2,ffn_dim=688,vocab_size=4096"


def _runs_with_a_custom_shape(root: Path) -> Path:
    """The sample runs, one of them renamed to a custom shape's ``--model`` text."""
    copy_sample_runs(root)
    events = root / "tiny-killed-resumed" / EVENTS_FILE
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    for line in lines:
        if line["type"] == "run_start":
            line["config"]["preset"] = CUSTOM_SHAPE
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def _overflow(table: HistoryTable) -> int:
    """Cells by which the table's columns pass its width, the scrollbar's room left."""
    room = table.size.width - table.styles.scrollbar_size_vertical
    return sum(c.get_render_width(table) for c in table.ordered_columns) - room


def _cut(table: HistoryTable) -> list[str]:
    """The cells (and headings) wider than their column and not ending in an ellipsis."""
    cut = []
    for column in table.ordered_columns:
        texts = [str(column.label)] + [str(table.get_cell(r, column.key)) for r in table.rows]
        cut += [t for t in texts if cell_len(t) > column.content_width and not t.endswith("…")]
    return cut


@pytest.mark.parametrize("size", [(80, 24), (120, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_history_leaves_columns_out_whole_in_priority_order(
    tmp_path: Path, size: tuple[int, int]
):
    root = _runs_with_a_custom_shape(tmp_path / "runs")
    app = TitanConsole(root)
    async with app.run_test(size=size) as pilot:
        await pilot.press("h")
        table = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: table.row_count == 4, lambda: "not listed", 20)
        await pilot.pause()
        headings = [str(c.label).split(" ")[0] for c in table.ordered_columns]
        overflow, cut, hidden = _overflow(table), _cut(table), table.hidden
        status = str(app.screen.query_one("#history-status", Static).render())
        await pilot.press("enter")  # every value of the run, in its detail
        await pilot.pause()
        detail = isinstance(app.screen, RunDetailScreen)
    assert overflow <= 0 and cut == []
    # the run, its status and its figures keep their place; the preset gives way before them
    assert headings[:2] == ["run", "status"]
    assert {"best", "tok/s", "MFU", "steps"} <= set(headings)
    assert "preset" in hidden and "preset" not in headings
    assert f"{', '.join(hidden)}: enter (detail)" in status
    assert detail


async def test_the_planners_totals_break_long_values_between_words(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("p")
        screen = app.screen
        await wait_until(pilot, lambda: screen.report is not None, lambda: "no plan", 20)
        await pilot.pause()
        table = screen.query_one("#plan-totals", DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        right = table.region.x + sum(c.get_render_width(table) for c in table.ordered_columns)
        room = screen.query_one(PlanTables).scrollable_content_region.right
        expected = totals_rows(screen.report["plans"][0])
    values: dict[str, list[str]] = {}
    for key, line in rows:  # a value's next lines have an empty key
        values.setdefault(key or list(values)[-1], []).append(line)
    assert [(key, " ".join(lines)) for key, lines in values.items()] == expected
    assert len(rows) > len(expected)  # the layout and the MFU do not fit one line at 80
    assert right <= room
