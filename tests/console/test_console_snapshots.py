"""Snapshots of the console's screens at 80x24 and 160x50 (pytest-textual-snapshot; refresh
with ``pytest tests/console/test_console_snapshots.py --snapshot-update`` after a deliberate
change)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from samples import copy_sample_runs

from tui.app import TitanConsole

SIZES = [(80, 24), (160, 50)]


@pytest.fixture()
def sample_runs_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``sample_runs/`` copied to ``./runs`` of a temporary working dir, in UTC, so that the
    screens show the same paths and times on every machine."""
    copy_sample_runs(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield Path("runs")
    monkeypatch.undo()
    time.tzset()


async def _settle(pilot, ready) -> None:
    deadline = time.monotonic() + 20
    while not ready() and time.monotonic() < deadline:
        await pilot.pause(0.1)
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_planner_snapshot(snap_compare, tmp_path: Path, size: tuple[int, int]):
    async def open_planner(pilot):
        await pilot.press("p")
        pilot.app.focused.cursor_blink = False  # the first field's cursor, drawn steadily
        await _settle(pilot, lambda: pilot.app.screen.report is not None)

    assert snap_compare(TitanConsole(tmp_path), terminal_size=size, run_before=open_planner)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_history_snapshot(snap_compare, sample_runs_here: Path, size: tuple[int, int]):
    async def open_history(pilot):
        await pilot.press("h")
        await _settle(pilot, lambda: pilot.app.screen.loaded)

    app = TitanConsole(sample_runs_here)
    assert snap_compare(app, terminal_size=size, run_before=open_history)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_monitor_watchdog_snapshot(snap_compare, sample_runs_here: Path, size: tuple[int, int]):
    async def show_watchdog(pilot):
        await _settle(pilot, lambda: pilot.app.screen.state.end_status is not None)
        await pilot.press("3")
        await pilot.pause(0.3)

    app = TitanConsole(sample_runs_here, open_run=sample_runs_here / "tiny-watchdog-stall")
    assert snap_compare(app, terminal_size=size, run_before=show_watchdog)
