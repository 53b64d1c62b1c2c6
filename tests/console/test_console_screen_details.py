"""Smaller console fixes, each on the real console through Textual's pilot: the launch form's
error after a preset change, the planner's focused field, SIGHUP, and one count of a run's
steps in the run list and History."""

from __future__ import annotations

import html
import os
import signal
from pathlib import Path

import pytest
from console_helpers import fill_form, open_planner, wait_until
from samples import copy_sample_runs
from textual.widgets import Select, Static

from tui.app import TitanConsole
from tui.screens.confirm import ConfirmScreen
from tui.screens.launch import LaunchScreen
from tui.screens.planner import PlannerScreen
from tui.widgets.history_table import HistoryTable
from tui.widgets.option_input import OptionInput
from tui.widgets.process_table import ProcessTable
from tui.widgets.run_table import RunTable

SIZE = (80, 24)
STALL_RUN = "tiny-watchdog-stall"


async def _refused_launch(app: TitanConsole, pilot) -> tuple[Static, str]:
    """Launch the form with --steps 0: the error widget and the error it shows."""
    await pilot.pause()
    fill_form(app, {"steps": "0"})
    await pilot.press("ctrl+r")
    await pilot.pause()
    error = app.screen.query_one("#launch-error", Static)
    return error, str(error.render())


@pytest.mark.slow
async def test_changing_the_preset_clears_the_launch_error(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        error, before = await _refused_launch(app, pilot)
        rows = list(app.screen.query(OptionInput))
        invalid_before = [r.option_name for r in rows if r.has_class("-invalid")]
        app.screen.query_one("#preset", Select).value = "cpu smoke test"
        await pilot.pause()
        after = str(error.render())
        invalid_after = [r for r in rows if r.has_class("-invalid")]
        steps = next(r for r in rows if r.option_name == "steps")
        screen = app.screen
    assert isinstance(screen, LaunchScreen)
    assert before.startswith("--steps") and invalid_before == ["steps"]
    assert after == "" and invalid_after == []
    assert steps.text == "20"


@pytest.mark.slow
async def test_the_planners_focused_field_stands_out(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, PlannerScreen)
        rows = list(app.screen.query(OptionInput))
        rows[1].control.focus()
        await pilot.pause()
        focused, other = rows[1].control, rows[2].control
        colours = (focused.styles.background, other.styles.background)
        bold = focused.styles.text_style.bold
    assert colours[0] != colours[1]
    assert bold


async def test_sighup_exits_the_console_like_quit(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        os.kill(os.getpid(), signal.SIGHUP)
        await wait_until(pilot, lambda: app._exit, lambda: "still running", 5)
    assert app.return_code == 0


async def test_the_run_list_and_history_count_the_same_steps(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    app = TitanConsole(root)
    async with app.run_test(size=(120, 30)) as pilot:
        runs = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: runs.row_count == 4, lambda: "not listed", 20)
        listed = str(runs.get_row(str(root / STALL_RUN))[1])
        await pilot.press("h")
        table = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: table.row_count == 4, lambda: "not in history", 20)
        [row] = [r for r in table.page.rows if r.run_id == STALL_RUN]
    # Both count the last step event (23); the watchdog's run_end names the step in flight.
    assert listed == f"{row.steps}/40" == "23/40"


async def test_editing_a_field_clears_the_launch_error(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        error, before = await _refused_launch(app, pilot)
        fill_form(app, {"steps": "5"})
        await pilot.pause()
        after = str(error.render())
        invalid = [r.option_name for r in app.screen.query(OptionInput) if r.has_class("-invalid")]
    assert before.startswith("--steps")
    assert after == "" and invalid == []


@pytest.mark.slow
async def test_the_planner_sends_its_plan_to_the_launch_form(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("p")
        planner = app.screen
        await wait_until(pilot, lambda: planner.report is not None, lambda: "no plan", 30)
        options = planner.report["train_options"]
        await pilot.press("ctrl+t")
        await wait_until(
            pilot, lambda: isinstance(app.screen, LaunchScreen), lambda: "no launch form", 10
        )
        form = {row.option_name: row.text for row in app.screen.query(OptionInput)}
    for name in ("preset", "layout", "dp", "fsdp", "tp", "pp", "microbatches", "batch_size"):
        assert form[name] == str(options[name])
    assert form["steps"] == str(options["steps"]) and int(form["steps"]) > 0


@pytest.mark.slow
async def test_the_planner_does_not_send_a_plan_its_form_no_longer_shows(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        planner = await open_planner(app, pilot)
        fill_form(app, {"gpus": "-3"})
        await pilot.press("ctrl+t")  # before the bad field's error is shown
        pending = app.screen
        help_line = planner.query_one("#plan-help", Static)
        await wait_until(pilot, lambda: "--gpus" in str(help_line.render()), lambda: "no error", 30)
        await pilot.press("ctrl+t")  # with the error on show, the last valid plan dimmed
        await pilot.pause()
        errored = app.screen
        fill_form(app, {"gpus": "64"})
        await wait_until(pilot, lambda: planner.current, lambda: "no plan again", 30)
        await pilot.press("ctrl+t")
        await wait_until(
            pilot, lambda: isinstance(app.screen, LaunchScreen), lambda: "no launch form", 10
        )
    assert pending is planner and errored is planner


async def test_the_processes_tab_of_a_run_without_heartbeat_files_says_so(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    app = TitanConsole(root, open_run=root / "llama3-1b-h200")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.screen.status == "completed", lambda: "?", 20)
        await pilot.press("7")
        await pilot.pause(0.2)
        title = app.screen.query_one(ProcessTable).border_title
        shown = html.unescape(app.export_screenshot()).replace("\xa0", " ")
    assert title == "no heartbeat file (processes/*.json) in the run dir"
    assert "no heartbeat file" in shown


async def test_f1_shows_the_keys_over_a_confirmation(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.push_screen(ConfirmScreen("Stop the run?"))
        await pilot.pause()
        await pilot.press("f1")
        await pilot.pause()
        stack = [type(s).__name__ for s in app.screen_stack]
        shown = html.unescape(app.export_screenshot()).replace("\xa0", " ")
    assert stack[-2:] == ["ConfirmScreen", "KeysScreen"]
    assert "Yes" in shown and "No" in shown
