"""No lock errors: ``titan summarize`` runs again and again while the console's History ingests
the same runs root (DuckDB lets one process open the file at a time; both wait their turn)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from console_helpers import wait_until
from helpers import file_tree
from records import read_only
from samples import copy_sample_runs, sample_run_dirs

from titan.analysis import summarize
from titan.errors import TitanError
from tui.app import TitanConsole
from tui.history_queries import HistoryQuery, HistoryStore
from tui.screens import history as history_screen
from tui.widgets.history_table import HistoryTable

# Subprocesses of `titan summarize` (the benchmark, bench/console.py --scale, runs 100; a
# subprocess costs about a second of CPU on the 2-core CI machines, so the test runs fewer).
CALLS, AT_ONCE = 24, 4


async def _summarize(root: Path) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "titan.cli",
        "summarize",
        "--json",
        str(root),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_summarize_never_meets_the_lock_while_history_ingests(tmp_path, monkeypatch):
    root = copy_sample_runs(tmp_path / "runs")
    monkeypatch.setattr(history_screen, "REFRESH_INTERVAL_S", 0.05)  # ingest all the time
    monkeypatch.setattr(history_screen, "INGEST_SPACING", 0.0)
    console_calls, console_errors = [], []
    ingest = HistoryStore.ingest

    def counted(store: HistoryStore, *args):
        console_calls.append(1)
        try:
            return ingest(store, *args)
        except TitanError as err:
            console_errors.append(str(err))
            raise

    monkeypatch.setattr(HistoryStore, "ingest", counted)
    app = TitanConsole(root)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("h")
        table = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: table.row_count == 4, lambda: "not listed", 30)
        before = len(console_calls)
        results = []
        for start in range(0, CALLS, AT_ONCE):
            batch = [_summarize(root) for _ in range(min(AT_ONCE, CALLS - start))]
            results += await asyncio.gather(*batch)
        during = len(console_calls) - before
    failures = [(rc, err) for rc, _, err in results if rc != 0]
    assert failures == [] and console_errors == []
    assert all(len(json.loads(out)) == 4 for _, out, _ in results)
    assert during >= CALLS  # the console held the database again and again meanwhile


def test_history_keys_in_a_burst_open_the_database_once_then_let_it_go(tmp_path, monkeypatch):
    store = HistoryStore(copy_sample_runs(tmp_path / "runs"))
    store.ingest()
    first_three = [row.run_id for row in store.page(HistoryQuery(limit=3)).rows]
    opened: list[Path] = []
    connect = summarize.connect
    monkeypatch.setattr(
        summarize, "connect", lambda root, **kw: opened.append(root) or connect(root, **kw)
    )
    pages = [store.page(HistoryQuery(offset=i, limit=1), hold_s=0.2) for i in range(3)]
    burst = len(opened)
    deadline = time.monotonic() + 10
    while len(opened) == burst and time.monotonic() < deadline:  # until a page opens its own
        store.page(HistoryQuery(limit=1))
        time.sleep(0.05)
    assert [page.rows[0].run_id for page in pages] == first_three
    assert (burst, len(opened)) == (1, 2)  # held for the burst, closed after it


# A process that holds the database (DuckDB's file lock) until its stdin closes.
_HOLDER = (
    "import duckdb, sys; con = duckdb.connect(sys.argv[1]); print('held', flush=True); "
    "sys.stdin.read(); con.close()"
)


@pytest.mark.slow
async def test_history_ingests_again_within_seconds_of_a_long_lock_being_released(
    tmp_path, monkeypatch
):
    root = copy_sample_runs(tmp_path / "runs")
    HistoryStore(root).ingest()  # the database exists: another process can hold it
    monkeypatch.setattr(summarize, "LOCK_WAIT_S", 2.0)  # a connect gives up long before...
    held_s = 8.0  # ...the lock is released
    monkeypatch.setattr(history_screen, "REFRESH_INTERVAL_S", 0.5)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        str(summarize.database_path(root)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert (await asyncio.wait_for(holder.stdout.readline(), 60)).strip() == b"held"
        held_at = time.monotonic()
        app = TitanConsole(root)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("h")
            screen = app.screen
            table = screen.query_one(HistoryTable)
            status = screen.query_one("#history-status")
            await wait_until(
                pilot, lambda: "(for more than 2 s)" in str(status.content), lambda: "no error", 30
            )
            shutil.copytree(root / "tiny-killed-resumed", root / "another-run")
            await pilot.pause(max(0.0, held_s - (time.monotonic() - held_at)))
            holder.stdin.close()
            await asyncio.wait_for(holder.wait(), 60)
            released_at = time.monotonic()
            await wait_until(pilot, lambda: table.row_count == 5, lambda: "not ingested", 60)
            recovered_s = time.monotonic() - released_at
            shown = str(status.content)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
    # Before: the failed ingest put the next one off by 5 times its 2 s wait (10 s and more).
    assert recovered_s < 5.0
    assert shown.startswith("5 runs")


# The console's History over a runs root: ingest, then the first page's run ids and count.
_HISTORY = (
    "import sys; from tui.history_queries import HistoryQuery, HistoryStore; "
    "store = HistoryStore(sys.argv[1]); store.ingest(); page = store.page(HistoryQuery()); "
    "print(store.exists(), page.total, *[row.run_id for row in page.rows])"
)


def test_history_lists_a_read_only_runs_root_from_the_cached_database(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    before = file_tree(root)
    prefix = read_only(root)
    command = [*prefix, sys.executable, "-c", _HISTORY, str(root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    exists, total, *run_ids = done.stdout.split()
    assert (exists, int(total)) == ("True", len(sample_run_dirs()))
    assert sorted(run_ids) == [run.name for run in sample_run_dirs()]
    assert summarize.cached_database_path(root).is_file()  # the one `titan summarize` uses
    assert file_tree(root) == before
