"""At scale: History over 10k runs paged, sorted and filtered in SQL in a worker; the run list
reading only the most recently written records; ``titan summarize`` listing the most recent."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from console_helpers import wait_until
from textual.widgets import Static

from bench.synthetic_history import run_id, synthesize
from titan.analysis import summarize
from titan.cli import main
from titan.commands.summarize_perf_report import SUMMARY_RUNS
from tui import run_list
from tui.app import TitanConsole
from tui.history_queries import PAGE_ROWS, HistoryPage, HistoryQuery, HistoryStore
from tui.run_list import RECENT_RUNS
from tui.screens.history import HistoryScreen
from tui.widgets.history_table import HistoryTable
from tui.widgets.run_table import RunTable

RUNS = 10_000


@pytest.fixture(scope="module")
def big_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("big") / "runs"
    synthesize(root, RUNS, steps=2)
    return root


def _ids(table: HistoryTable) -> list[str]:
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


@pytest.mark.slow
async def test_history_of_10k_runs_pages_sorts_and_filters_in_a_worker(big_root, monkeypatch):
    threads: list[str] = []
    page = HistoryStore.page

    def recorded(store: HistoryStore, query, *args) -> HistoryPage:
        threads.append(threading.current_thread().name)
        return page(store, query, *args)

    monkeypatch.setattr(HistoryStore, "page", recorded)
    parsed: list[str] = []
    stage_file = summarize._stage_file
    monkeypatch.setattr(
        summarize,
        "_stage_file",
        lambda path, *a: parsed.append(path) or stage_file(path, *a),
    )
    app = TitanConsole(big_root)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("h")
        screen = app.screen
        table = screen.query_one(HistoryTable)

        def settled() -> bool:
            return table.current and table.row_count > 0 and screen.loaded

        async def settle(what: str) -> list[str]:
            await wait_until(pilot, settled, lambda: f"not {what}", 30)
            return _ids(table)

        newest = await settle("listed")
        status = str(screen.query_one("#history-status", Static).content)
        await pilot.press("o")  # sort by run, ascending
        by_run = await settle("sorted")
        await pilot.press("right_square_bracket")
        second_page = (await settle("paged"), table.page.offset)
        await pilot.press("left_square_bracket")
        await settle("paged back")
        table.move_cursor(row=table.row_count - 1)
        await pilot.press("down")  # past the last row: the next page, cursor on its first
        by_cursor = (await settle("scrolled"), table.cursor_row)
        await pilot.press("O")
        reversed_ids = await settle("reversed")
        await pilot.press("slash", *"run-00012", "enter")
        filtered = await settle("filtered")
        filtered_count = str(screen.query_one("#history-status", Static).content)
    assert isinstance(screen, HistoryScreen)
    assert threads and all(name != threading.main_thread().name for name in threads)
    assert parsed == []  # every run dir unchanged since the bulk ingest: none was opened
    assert len(newest) == PAGE_ROWS and newest[:2] == [run_id(RUNS - 1), run_id(RUNS - 2)]
    assert status.startswith(f"{RUNS:,} runs · rows 1-{PAGE_ROWS}")
    assert by_run[:2] == [run_id(0), run_id(1)] and len(by_run) == PAGE_ROWS
    assert second_page == ([run_id(i) for i in range(PAGE_ROWS, 2 * PAGE_ROWS)], PAGE_ROWS)
    assert by_cursor == ([run_id(i) for i in range(PAGE_ROWS, 2 * PAGE_ROWS)], 0)
    assert reversed_ids[:2] == [run_id(RUNS - 1), run_id(RUNS - 2)]
    assert filtered == [run_id(i) for i in range(129, 119, -1)]
    assert filtered_count.startswith(f"10 of {RUNS:,} runs · ")


def test_history_store_sorts_by_status_and_filters_by_preset_in_sql(big_root):
    store = HistoryStore(big_root)
    by_status = store.page(HistoryQuery(sort="status", descending=False, limit=3))
    llama = store.page(HistoryQuery(text="LLAMA3", limit=5, offset=RUNS))
    assert [r.status for r in by_status.rows] == ["completed"] * 3
    assert by_status.matched == RUNS and by_status.total == RUNS
    assert llama.matched == len(range(2, RUNS, 3)) and llama.offset == llama.matched - 5
    assert {r.preset for r in llama.rows} == {"llama3-1b"}


async def test_run_list_of_10k_runs_reads_only_the_most_recently_written(big_root, monkeypatch):
    read: set[Path] = set()  # the run dirs whose record a reader was made for
    tail = run_list.EventTail
    monkeypatch.setattr(run_list, "EventTail", lambda path: read.add(path.parent) or tail(path))
    app = TitanConsole(big_root)
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: table.row_count > 0, lambda: "no runs listed", 30)
        keys = [table.coordinate_to_cell_key((i, 0)).row_key.value for i in (0, 1)]
        status = str(app.screen.query_one("#runs-status", Static).content)
    newest = [run_id(i) for i in range(RUNS - 1, RUNS - RECENT_RUNS - 1, -1)]
    assert (table.row_count, sorted(d.name for d in read)) == (RECENT_RUNS, sorted(newest))
    assert [Path(str(key)).name for key in keys] == newest[:2]
    assert status == (
        f"0 running · {RECENT_RUNS} most recently written of {RUNS:,} runs · "
        "h: History lists all · o: order (newest)"
    )


def test_summarize_of_10k_runs_lists_the_most_recent_and_says_how_many_are_hidden(
    big_root, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["summarize", str(big_root), "--json"]) == 0
    default = capsys.readouterr()
    assert main(["summarize", str(big_root), "--last", "3"]) == 0
    last_three = capsys.readouterr().out.splitlines()
    shown = [d["run_id"] for d in json.loads(default.out)]
    assert shown == [run_id(i) for i in range(RUNS - SUMMARY_RUNS, RUNS)]
    hidden = f"of {RUNS:,} runs shown ({RUNS - SUMMARY_RUNS:,} hidden; --all lists all)"
    assert default.err == f"{SUMMARY_RUNS} most recent {hidden}\n"
    rows = [line for line in last_three if line.startswith("│ run-")]
    assert [row.split()[1] for row in rows] == [run_id(i) for i in range(RUNS - 3, RUNS)]
    assert (
        last_three[-1]
        == f"3 most recent of {RUNS:,} runs shown ({RUNS - 3:,} hidden; --all lists all)"
    )
