"""The run list (tui/screens/runs.py) keeps up with its runs by itself, and keeps each run's
status, step and loss in view at 80 columns, with colours a 16-colour terminal keeps apart."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from console_helpers import append_events, event, wait_until
from rich.color import Color, ColorSystem
from rich.style import Style
from samples import copy_sample_runs
from textual.filter import ANSIToTruecolor
from textual.widgets import Static

from titan.telemetry.heartbeat import PROCESSES_DIR, ProcessId
from titan.telemetry.records import write_json_atomic
from tui import run_list
from tui.app import TitanConsole
from tui.screens import runs as runs_screen
from tui.widgets.history_table import HistoryTable
from tui.widgets.run_table import STATUS_STYLES, RunTable

LONG_PRESET = "custom(" + ", ".join(f"{k}=4096" for k in ("d_model", "d_ff", "vocab")) + ")" * 3


def _live_run(run_dir: Path, process: subprocess.Popen, preset: str = "tiny") -> None:
    """A run whose run_start names ``process`` (alive on this host), with a fresh heartbeat."""
    started = psutil.Process(process.pid).create_time()
    identity = ProcessId(ProcessId.current().host, process.pid, process.pid, started)
    (run_dir / PROCESSES_DIR).mkdir(parents=True)
    now = time.time()
    start = event("run_start", now, config={"preset": preset}, total_steps=100)
    start["process"] = identity.as_dict()
    append_events(run_dir, [start, event("step", now, step=3, loss=4.25)])
    beat = {**identity.as_dict(), "processes": 1, "step": 3, "status": "running", "beat": now}
    write_json_atomic(run_dir / PROCESSES_DIR / "0.json", beat)


def _status_line(app: TitanConsole) -> str:
    return str(app.screen.query_one("#runs-status", Static).content)


def _screen_text(app: TitanConsole) -> str:
    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]*>", "", svg)).replace("\xa0", " ")


async def test_a_killed_run_leaves_the_running_count_within_one_refresh(tmp_path, monkeypatch):
    monkeypatch.setattr(runs_screen, "REFRESH_INTERVAL_S", 1.0)
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _live_run(tmp_path / "live", process)
        app = TitanConsole(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.screen.query_one(RunTable)
            await wait_until(pilot, lambda: table.row_count == 1, lambda: "not listed", 20)
            before = (_status_line(app), str(table.get_row_at(0)[0]))
            process.send_signal(signal.SIGKILL)
            process.wait()
            killed_at = time.monotonic()
            # No key pressed: the list's own timer lists the runs again.
            await wait_until(
                pilot, lambda: str(table.get_row_at(0)[0]) == "dead", lambda: _status_line(app), 20
            )
            seen_after_s = time.monotonic() - killed_at
            after = _status_line(app)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert before == ("1 running · 1 run · o: order (newest)", "running")
    assert after == "0 running · 1 run · o: order (newest)"
    assert seen_after_s < 1.0 + 5.0  # one refresh, and the time the listing took under load


async def test_at_80_columns_a_long_preset_leaves_status_step_and_loss_and_the_footer_keys(
    tmp_path,
):
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _live_run(tmp_path / "custom-shape-run", process, preset=LONG_PRESET)
        app = TitanConsole(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.screen.query_one(RunTable)
            await wait_until(pilot, lambda: table.row_count == 1, lambda: "not listed", 20)
            # The footer lists its keys once the screen's bindings settle: later under load.
            await wait_until(
                pilot, lambda: "q Quit" in _screen_text(app), lambda: _screen_text(app), 20
            )
            lines = _screen_text(app).splitlines()
            status = app.screen.query_one("#runs-status", Static).region
            footer_at = app.screen.query_one("Footer").region.y
            line = _status_line(app)
    finally:
        process.kill()
        process.wait()
    # The status line sits above the footer (both at the bottom, it was drawn under it).
    assert status.height == 1 and status.bottom <= footer_at
    assert line.startswith("1 running") and any(line[:20] in shown for shown in lines)
    [row] = [line for line in lines if "custom-shape-run" in line]
    assert row.split()[:3] == ["running", "3/100", "4.250"]
    assert "custom(d_model=4096, d_ff=4…" in row  # cut at 28 characters, the rest in the monitor
    [footer] = [line for line in lines if "q Quit" in line]
    assert "h History" in footer and "q Quit" in footer


async def test_o_orders_the_run_list_and_slash_filters_it(tmp_path):
    for name, status, at in (("a-run", "completed", 1000.0), ("b-run", "failed", 2000.0)):
        start = event("run_start", at, config={"preset": "tiny"}, total_steps=8)
        (tmp_path / name).mkdir()
        append_events(tmp_path / name, [start, event("run_end", at + 1, status=status, step=0)])
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: table.row_count == 2, lambda: "not listed", 20)

        def names() -> list[str]:
            return [str(table.get_row_at(i)[3]) for i in range(table.row_count)]

        newest = names()
        await pilot.press("o")
        by_run = names()
        await pilot.press("slash", *"fail", "enter")
        filtered = (names(), _status_line(app))
        colours = [table.get_row_at(i)[0].style for i in range(table.row_count)]
        table_focused = table.has_focus
        await pilot.press("escape")  # from the table, not only from the filter's field
        cleared = (names(), _status_line(app))
    assert (newest, by_run) == (["b-run", "a-run"], ["a-run", "b-run"])
    assert table_focused and cleared == (["a-run", "b-run"], "0 running · 2 runs · o: order (run)")
    assert filtered == (["b-run"], "0 running · 1 matching 'fail' · 2 runs · o: order (run)")
    assert colours == [STATUS_STYLES["failed"]]


async def test_the_states_that_mean_different_things_stay_apart_on_a_16_colour_terminal(tmp_path):
    # As Textual draws them (ANSI names through its ANSI theme), then as a terminal of 16 or 256
    # colours is sent them.
    meanings = ("completed", "running", "stopped", "stalled", "failed", "dead")
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(80, 24)):
        [to_theme] = [f for f in app._filters if isinstance(f, ANSIToTruecolor)]
        drawn = {
            state: to_theme.truecolor_style(Style.parse(STATUS_STYLES[state]), Color.parse("black"))
            for state in meanings
        }
    for system in (ColorSystem.STANDARD, ColorSystem.EIGHT_BIT):
        sent = {state: style.color.downgrade(system).number for state, style in drawn.items()}
        assert len(set(sent.values())) == len(meanings), (system, sent)
    assert drawn["failed"].color.downgrade(ColorSystem.STANDARD).number == 9  # bright red
    assert drawn["completed"].color.downgrade(ColorSystem.STANDARD).number == 10  # bright green


@pytest.mark.slow
async def test_keys_help_on_history_lists_its_table_keys_and_j_k_move_the_cursor(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    app = TitanConsole(root)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: runs.row_count == 4, lambda: "not listed", 20)
        await pilot.press("j", "j")
        moved = runs.cursor_row
        await pilot.press("k")
        back = runs.cursor_row
        await pilot.press("G")
        last = runs.cursor_row
        await pilot.press("g")
        first = runs.cursor_row
        await pilot.press("h")
        history = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: history.row_count == 4, lambda: "not in history", 30)
        await pilot.press("f1")
        await pilot.pause()
        table = app.screen.query_one("DataTable")
        described = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
    assert (moved, back, last, first) == (2, 1, 3, 0)
    assert {"Detail", "Sort", "Reverse", "Mark", "Next page", "Previous page"} <= described
    assert {"Down", "Up", "First row", "Last row", "Filter", "Compare"} <= described


async def test_keys_help_lists_back_over_history_but_not_over_the_run_list(tmp_path):
    app = TitanConsole(tmp_path)

    async def described() -> set[str]:
        await pilot.press("f1")
        await pilot.pause()
        table = app.screen.query_one("DataTable")
        rows = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
        await pilot.press("escape")
        await pilot.pause()
        return rows

    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        on_run_list = await described()
        await pilot.press("h")
        await pilot.pause()
        on_history = await described()
    assert "Back" not in on_run_list and "Attach" in on_run_list
    assert "Back" in on_history


def _long_record(run_dir: Path, steps: int, attempts: int = 2) -> None:
    """A record of ``attempts`` attempts of ``steps`` steps each, the last one completed."""
    run_dir.mkdir()
    lines = []
    for attempt in range(attempts):
        first = attempt * steps
        start = event("run_start", first, config={"preset": "tiny"}, total_steps=attempts * steps)
        start["resumed_from_step"] = first or None
        lines += [
            start,
            *(
                event("step", s, step=s, loss=9.0 - s / 1e5)
                for s in range(first + 1, first + steps + 1)
            ),
        ]
    lines.append(event("run_end", attempts * steps + 1, status="completed", step=attempts * steps))
    append_events(run_dir, lines)


def _listed(runs_root: Path, cache: run_list.RecordCache, **options) -> dict[str, Any]:
    listing = run_list.list_runs(runs_root, cache=cache, **options)
    return {s.run_dir.name: s for s in listing.summaries}


def test_a_long_record_is_listed_at_once_and_read_a_slice_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(run_list, "READ_SLICE_BYTES", 1 << 16)
    _long_record(tmp_path / "long", 5_000)
    _long_record(tmp_path / "short", 2)
    size = (tmp_path / "long" / "events.jsonl").stat().st_size
    cache: run_list.RecordCache = {}
    first = _listed(tmp_path, cache, budget_s=0.0)
    # A budget of 0 reads one slice, of the smallest record: each summary says how much is left.
    assert first["short"].unread_bytes == 0
    assert (first["long"].read_bytes, first["long"].unread_bytes) == (0, size)
    whole = _listed(tmp_path, cache)
    assert (whole["long"].read_bytes, whole["long"].unread_bytes) == (size, 0)
    state = whole["long"].state
    assert (state.step, state.attempts, state.resumed_from_step) == (10_000, 2, 5_000)
    assert whole["long"].liveness.state == whole["short"].liveness.state == "completed"
    # A resume appends: the next listing reads what it appended, nothing before it.
    folded = cache[tmp_path / "long"].state
    append_events(tmp_path / "long", [event("run_start", 20_000, total_steps=10_001)])
    grown = (tmp_path / "long" / "events.jsonl").stat().st_size
    again = _listed(tmp_path, cache)
    assert (again["long"].read_bytes, again["long"].state.attempts) == (grown, 3)
    assert cache[tmp_path / "long"].state is folded  # folded on, not read anew
    assert state.attempts == 2  # the listing before handed out a copy, left as it was
    # A record replaced by another (a run dir made again) is read anew.
    (tmp_path / "long" / "events.jsonl").unlink()
    _long_record(tmp_path / "other", 3)
    os.replace(tmp_path / "other" / "events.jsonl", tmp_path / "long" / "events.jsonl")
    replaced = _listed(tmp_path, cache)
    assert (replaced["long"].state.step, replaced["long"].state.attempts) == (6, 2)


@pytest.mark.slow
async def test_the_run_list_shows_a_long_record_as_reading_until_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(run_list, "READ_SLICE_BYTES", 1 << 12)
    monkeypatch.setattr(runs_screen, "LISTING_BUDGET_S", 0.0)  # a slice per listing
    _long_record(tmp_path / "long", 1_000)
    app = TitanConsole(tmp_path)
    seen: list[str] = []
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RunTable)

        def status() -> str:
            shown = str(table.get_row_at(0)[0]) if table.row_count else ""
            if not seen or seen[-1] != shown:
                seen.append(shown)
            return shown

        await wait_until(pilot, lambda: status() == "completed", lambda: str(seen), 60)
        row = [str(c) for c in table.get_row_at(0)[:3]]
    reading = [s for s in seen if s.startswith("reading ")]
    assert reading and reading[0] != reading[-1]  # it went on reading, listing as it went
    assert row == ["completed", "2000/2000", "8.980"]


def test_an_events_file_that_cannot_be_read_is_listed_as_read(tmp_path):
    (tmp_path / "odd" / "events.jsonl").mkdir(parents=True)  # a directory where the file goes
    (tmp_path / "odd" / "stderr.log").write_text("")  # what makes it a run dir
    [listed] = run_list.list_runs(tmp_path).summaries
    assert listed.unread_bytes == 0  # else the list would list again at once, for ever


def test_a_record_made_anew_in_its_place_is_read_from_its_start(tmp_path, monkeypatch):
    monkeypatch.setattr(run_list, "READ_SLICE_BYTES", 1 << 12)
    _long_record(tmp_path / "run", 600, attempts=1)  # its one run_start in the first slice
    cache: run_list.RecordCache = {}
    _listed(tmp_path, cache, budget_s=0.0)  # one slice of it read
    path = tmp_path / "run" / "events.jsonl"
    old = path.read_bytes()
    # The same inode (as a file system may give a file made after one removed), other content:
    # a run of another preset and length, at least as long as what was read.
    new = old.replace(b'"preset": "tiny"', b'"preset": "big1"').replace(
        b'"total_steps": 600', b'"total_steps": 999'
    )
    with path.open("r+b") as f:
        f.write(new)
    read = _listed(tmp_path, cache)["run"]
    assert (read.state.preset, read.state.total_steps) == ("big1", 999)


def test_the_filter_and_the_status_order_take_the_status_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(run_list, "READ_SLICE_BYTES", 1 << 12)
    _long_record(tmp_path / "long", 2_000)
    _long_record(tmp_path / "short", 2)
    listing = run_list.list_runs(tmp_path, cache={}, budget_s=0.0)
    reading = runs_screen.arrange(listing.summaries, "status", "reading")
    assert [s.run_dir.name for s in reading] == ["long"]
    assert [s.status for s in runs_screen.arrange(listing.summaries, "status", "")] == [
        "completed",
        "reading 0%",
    ]
