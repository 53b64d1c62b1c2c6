"""The console's forms and 80-column screens on the real console through Textual's pilot: the
first field focused, typed keys kept from bindings, refused characters told, ``n`` a new launch
form, the stderr panel under a wrapped status, long run-detail values."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from console_helpers import append_events, form_shown, stat, wait_until
from rich.cells import cell_len
from samples import copy_sample_runs
from textual import events
from textual.app import App
from textual.widgets import DataTable, Footer, Input, Select, Static

from titan.formatting import format_span
from tui.app import TitanConsole
from tui.launcher import LaunchedRun
from tui.options import default_texts
from tui.screens.launch import LaunchScreen
from tui.screens.monitor import MonitorScreen
from tui.screens.planner import PlannerScreen
from tui.screens.run_detail import RunDetailScreen
from tui.screens.value import ValueScreen
from tui.widgets.option_input import OptionInput, help_line

SIZE = (80, 24)
STALL_RUN = "tiny-watchdog-stall"
RESUMED_RUN = "tiny-killed-resumed"


def _first_field(screen) -> object:
    return screen.query(OptionInput).first().control


@pytest.mark.slow
async def test_forms_open_with_their_first_field_focused(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        launch_focus, launch_first = app.focused, _first_field(app.screen)
        await pilot.press("ctrl+q")
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        planner_focus, planner_first = app.focused, _first_field(app.screen)
    assert launch_focus is launch_first
    assert planner_focus is planner_first


async def test_typing_in_the_planner_never_fires_a_binding(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        field = app.focused
        assert isinstance(field, Input)
        field.value = ""
        await pilot.press(*"tiny")
        await pilot.pause()
        screen, typed = app.screen, field.value
    assert isinstance(screen, PlannerScreen)
    assert typed == "tiny"


async def test_a_key_typed_on_a_choice_field_opens_it_not_a_binding(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        planner = app.screen
        choice = planner.query(Select).first()
        choice.focus()
        await pilot.pause()
        await pilot.press("h")
        await pilot.pause()
        screen, opened = app.screen, choice.expanded
    assert screen is planner
    assert opened


@pytest.mark.slow
async def test_the_key_that_opens_a_choice_field_searches_it_and_the_footer_leaves_q_out(
    tmp_path: Path,
):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.screen.set_focus(None)
        await pilot.pause()
        unfocused = "q" in app.screen.active_bindings
        preset = app.screen.query_one("#preset", Select)
        preset.focus()
        await pilot.pause()
        focused = "q" in app.screen.active_bindings  # what the footer offers
        await pilot.press("c", "enter")
        await pilot.pause()
        chosen = preset.value
    assert (unfocused, focused) == (True, False)
    assert chosen == "cpu smoke test"


@pytest.mark.slow
async def test_an_integer_field_refuses_letters_visibly(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        steps = app.screen.query_one("#option-steps", OptionInput).control
        steps.value = "1"
        steps.focus()
        await pilot.press("end", "x", "2")
        await pilot.pause()
        value = steps.value
        notices = [n.message for n in app._notifications]
    assert value == "12"
    assert notices == ["--steps takes a whole number: character refused"]


@pytest.mark.slow
async def test_n_opens_a_new_launch_form_over_a_resume_form(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        resume = LaunchScreen(tmp_path, resume=tmp_path / "old", texts=default_texts(tmp_path))
        app.push_screen(resume)
        await pilot.pause()
        app.set_focus(None)
        await pilot.press("n")
        await pilot.pause()
        screen = app.screen
    assert isinstance(screen, LaunchScreen)
    assert screen is not resume and screen.resume is None


async def test_the_stderr_panel_keeps_its_lines_when_the_status_wraps(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    run_dir = root / STALL_RUN
    events_file = run_dir / "events.jsonl"
    lines = events_file.read_text().splitlines()
    run_end = json.loads(lines[-1])
    run_end["error"] = "stalled in step for 9.9 s; " + "the collective never returned " * 10
    events_file.write_text("\n".join([*lines[:-1], json.dumps(run_end)]) + "\n")
    app = TitanConsole(root, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        status = app.screen.query_one("#status")
        await wait_until(pilot, lambda: status.has_class("-wrap"), lambda: "no reason", 20)
        await pilot.pause(0.3)
        stderr = app.screen.query_one("#stderr").region
        footer = app.screen.query_one(Footer).region
    assert stderr.height >= 5  # its border and three lines
    assert stderr.bottom <= footer.y


async def _run_detail(app: TitanConsole, pilot) -> RunDetailScreen:
    """The run detail of the sample H200 run, opened from History and loaded."""
    await pilot.press("h")
    await wait_until(pilot, lambda: app.screen.loaded, lambda: "history not loaded", 30)
    detail = RunDetailScreen(app.history, "llama3-1b-h200")
    app.push_screen(detail)
    await wait_until(pilot, lambda: detail.detail is not None, lambda: "no detail", 20)
    return detail


async def test_a_cut_run_detail_value_reads_in_full_on_enter(tmp_path: Path):
    app = TitanConsole(copy_sample_runs(tmp_path / "runs"))
    async with app.run_test(size=SIZE) as pilot:
        detail = await _run_detail(app, pilot)
        table = detail.query_one("#detail-summary", DataTable)
        keys = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        memory = keys.index("device memory (GB per device)")
        cut = str(table.get_row_at(memory)[1])
        widths = [column.get_render_width(table) for column in table.ordered_columns]
        full = table.values[str(memory)]
        table.focus()
        table.move_cursor(row=memory)
        await pilot.press("enter")
        await pilot.pause()
        popup = app.screen
        shown = str(popup.query_one("#value-text", Static).render()) if popup is not detail else ""
        await pilot.press("escape")
        await pilot.pause()
        back = app.screen
    assert cell_len(full) > SIZE[0]  # cut in the table at 80 columns, with an ellipsis
    assert cut.endswith("…") and full.startswith(cut[:-1])
    assert sum(widths) <= SIZE[0] - table.styles.scrollbar_size_vertical
    assert isinstance(popup, ValueScreen) and popup.value == full
    assert " ".join(shown.split()) == full
    assert back is detail


def _stand_in_child(run_dir: Path, code: str, *, resumed: bool) -> LaunchedRun:
    """A real child process in ``run_dir``'s place of ``titan train`` (running ``code``), as
    :func:`tui.launcher.start_run` records it: its own process group, stderr to the run dir."""
    argv = [sys.executable, "-c", code]
    with open(run_dir / "stderr.log", "ab") as err:
        process = subprocess.Popen(argv, stderr=err, start_new_session=True)
    return LaunchedRun(run_dir.resolve(), argv, process, resumed=resumed)


@pytest.mark.slow
async def test_a_run_reads_resuming_until_the_new_attempts_run_start(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    run_dir = root / RESUMED_RUN
    app = TitanConsole(root, open_run=run_dir)
    child = _stand_in_child(run_dir, "import time; time.sleep(60)", resumed=True)
    try:
        async with app.run_test(size=SIZE) as pilot:
            first = app.screen
            ended = lambda: first.check_action("resume", ())  # noqa: E731
            await wait_until(pilot, ended, lambda: "resume not offered", 20)
            # The resume form, as R opens it (a sample run's saved data paths are not here).
            form = LaunchScreen(root, resume=run_dir, texts=default_texts(root))
            await app.push_screen(form)
            app.screen.post_message(LaunchScreen.Launched([child]))
            await wait_until(
                pilot,
                lambda: app.screen is not first and isinstance(app.screen, MonitorScreen),
                lambda: "no monitor",
                10,
            )
            second = app.screen
            await pilot.pause(0.3)
            shown = (second.status, stat(app, "status"), second.check_action("resume", ()))
            process = stat(app, "process")
            await pilot.press("R")
            await pilot.pause()
            after_r = app.screen
            await pilot.press("escape")
            await pilot.pause()
            below = (app.screen, first.status, first.check_action("resume", ()))
            run_start = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
            append_events(run_dir, [{**run_start, "time": time.time()}])
            await wait_until(pilot, lambda: first.status != "resuming", lambda: first.status, 20)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.process.wait(timeout=30)
    assert shown == ("resuming", "resuming", False)
    assert process == "the resume's process runs; its run_start is not written yet"
    assert after_r is second
    assert below == (first, "resuming", False)


@pytest.mark.slow
async def test_a_refused_resume_is_said_and_the_monitor_below_is_drawn_anew(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    run_dir = root / RESUMED_RUN
    refusal = "titan train: error: --steps 40 leaves nothing to train"
    app = TitanConsole(root, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        first = app.screen
        ended = lambda: first.check_action("resume", ())  # noqa: E731
        await wait_until(pilot, ended, lambda: "resume not offered", 20)
        code = f"import sys; sys.stderr.write({refusal!r} + '\\n'); sys.exit(2)"
        child = _stand_in_child(run_dir, code, resumed=True)
        await app.push_screen(LaunchScreen(root, resume=run_dir, texts=default_texts(root)))
        app.screen.post_message(LaunchScreen.Launched([child]))
        notices = lambda: [n.message for n in app._notifications]  # noqa: E731
        said = lambda: f"Not started: {refusal}" in notices()  # noqa: E731
        await wait_until(pilot, said, lambda: str(notices()), 20)
        await pilot.press("escape")
        await pilot.pause(0.3)
        below = (app.screen is first, stat(app, "status"), first.check_action("resume", ()))
        status = first.status
    assert below == (True, status, True)
    assert status != "resuming"


async def test_a_failed_start_up_does_not_offer_resume(tmp_path: Path):
    run_dir = tmp_path / "runs" / "tiny-failed"
    run_dir.mkdir(parents=True)
    app = TitanConsole(tmp_path / "runs")
    child = _stand_in_child(
        run_dir, "import sys; sys.exit('too few devices for 2 stages')", resumed=False
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.post_message(LaunchScreen.Launched([child]))
        await wait_until(
            pilot, lambda: isinstance(app.screen, MonitorScreen), lambda: "no monitor", 10
        )
        monitor = app.screen
        failed = lambda: monitor.status == "failed"  # noqa: E731
        await wait_until(pilot, failed, lambda: monitor.status, 20)
        offered = monitor.check_action("resume", ())
    assert not run_dir.exists()
    assert not offered


async def test_history_export_never_overwrites_an_earlier_export(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    mine = root / "history.csv"
    mine.write_text("kept,as,written\n")
    app = TitanConsole(root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        await wait_until(pilot, lambda: app.screen.loaded, lambda: "history not loaded", 30)
        await pilot.press("x")
        second = root / "history-2.csv"
        await wait_until(pilot, lambda: app._notifications, lambda: "no notice", 20)
        notices = [n.message for n in app._notifications]
    assert mine.read_text() == "kept,as,written\n"
    assert len(list(csv.DictReader(second.open()))) == 4
    assert notices == [f"4 runs written to {second}"]


async def _ranking(app: TitanConsole, pilot) -> DataTable:
    """The planner's ranking, once ``--search`` has ranked the default plan's layouts."""
    await pilot.press("p")
    planner = app.screen
    planner.query_one("#option-search", OptionInput).control.value = "1"
    searched = lambda: planner.report is not None and planner.report["search"]  # noqa: E731
    await wait_until(pilot, searched, lambda: "no search", 30)
    await pilot.pause(0.3)
    return planner.query_one("#plan-ranked", DataTable)


async def test_the_planner_ranking_shows_tokens_per_s_and_time_at_80_columns(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        ranked = await _ranking(app, pilot)
        planner = app.screen
        labels = [str(column.label) for column in ranked.columns.values()]
        shown = [column.get_render_width(ranked) for column in ranked.columns.values()][:2]
        visible = ranked.scrollable_content_region.width
        best = ranked.get_row_at(0)[:2]
        plan = planner.report["plans"][0]
    assert labels[:2] == ["tokens/s", "time"]
    assert sum(shown) <= visible  # both columns whole on screen (render widths hold padding)
    assert best == [f"{plan['tokens_per_s']:,.0f}", format_span(plan["total_s"])]


async def test_j_k_g_and_G_move_the_cursor_of_the_planner_ranking(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        ranked = await _ranking(app, pilot)
        ranked.focus()
        rows = []
        for key in ("j", "j", "k", "G", "g"):
            await pilot.press(key)
            rows.append(ranked.cursor_row)
        last = ranked.row_count - 1
    assert last > 2
    assert rows == [1, 2, 1, last, 0]


async def test_run_detail_opens_on_its_rows_and_each_tab_key_focuses_its_table(tmp_path: Path):
    app = TitanConsole(copy_sample_runs(tmp_path / "runs"))
    async with app.run_test(size=SIZE) as pilot:
        detail = await _run_detail(app, pilot)
        await pilot.pause()
        summary = detail.query_one("#detail-summary", DataTable)
        focused_at_open = app.focused
        await pilot.press("j", "j", "G", "g", "j", "enter")
        await pilot.pause()
        popup = app.screen
        await pilot.press("escape", "3")
        await pilot.pause()
        environment = detail.query_one("#detail-environment", DataTable)
        focused_on_3 = app.focused
        await pilot.press("f1")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        described = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
    assert focused_at_open is summary
    assert isinstance(popup, ValueScreen) and popup.value == summary.values["1"]
    assert focused_on_3 is environment
    assert {"Value in full", "Down", "Up", "First row", "Last row"} <= described


async def test_a_fields_help_names_its_default_once():
    async with App().run_test():  # widgets are made within an app
        said = OptionInput("preset", "--model", "a shape (default: 'tiny')", "tiny", default="tiny")
        unsaid = OptionInput("steps", "--steps", "optimizer steps", "20", default=20)
    assert help_line(said) == "--model: a shape (default: 'tiny')"
    assert help_line(unsaid) == "--steps: optimizer steps (default: 20)"


async def test_keys_read_in_one_burst_each_reach_the_field_focused_after_the_keys_before(
    tmp_path: Path,
):
    """``n tab tab 9`` read at once (tui.typed_keys): the form opens, and 9 goes to its third
    field, as typed slowly."""
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for key in ("n", "tab", "tab", "9"):
            app.post_message(events.Key(key, key if len(key) == 1 else None))
        form = await form_shown(app, pilot, LaunchScreen)
        await wait_until(pilot, lambda: _texts(form)[2] == "9", lambda: str(_texts(form)), 30)
        texts = _texts(form)
    assert texts[:3] == ["tiny", "titan", "9"]


def _texts(form: LaunchScreen) -> list[str]:
    return [row.text for row in form.query(OptionInput)]
