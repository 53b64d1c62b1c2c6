"""The console: launch form, monitor, stop, run list and keys, driven through Textual's pilot at
80x24 with real runs of the trainer (small, one device)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from console_helpers import (
    append_events,
    event,
    kill_children,
    launch_from_form,
    notes_into,
    parsed,
    run_context,
    stat,
    tiny_form_texts,
    wait_until,
)
from samples import SAMPLE_RUNS
from textual.widgets import Input, Label, Log, Select

from titan import cli_command
from titan.cli import build_parser
from titan.config import TrainConfig, option_fields
from titan.errors import TitanError
from titan.telemetry.records import EVENTS_FILE, read_events
from tui.app import TitanConsole, exit_message, main
from tui.launcher import STDERR_LOG, STDOUT_LOG, start_run, train_argv
from tui.options import config_from_texts, default_texts
from tui.run_list import list_runs
from tui.run_state import RunState
from tui.screens.attach import AttachScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.keys import KeysScreen
from tui.screens.launch import LaunchScreen
from tui.screens.monitor import MonitorScreen
from tui.screens.runs import RunsScreen
from tui.widgets.loss_chart import LossChart
from tui.widgets.option_input import OptionInput
from tui.widgets.run_table import RunTable
from tui.widgets.stat import Stat
from tui.widgets.too_small import TooSmall

SIZE = (80, 24)


@pytest.fixture()
def consoles():
    """Make consoles; kill whatever runs they started and left running when the test ends."""
    made: list[TitanConsole] = []

    def make(runs_root: Path, **kwargs) -> TitanConsole:
        made.append(TitanConsole(runs_root, **kwargs))
        return made[-1]

    yield make
    for app in made:
        kill_children(app)


def _only_run_dir(app: TitanConsole) -> Path | None:
    return next(iter(app.launched), None)


@pytest.fixture()
def tiny_form(corpus_dir: Path) -> dict[str, str]:
    """Form texts of a small real run (one device, the test corpus)."""
    return tiny_form_texts(corpus_dir)


# --- the launch form ------------------------------------------------------------------------


def test_form_defaults_are_the_train_config_defaults(tmp_path: Path):
    texts = default_texts(tmp_path)
    assert set(texts) == {f.name for f in option_fields()}
    assert texts["runs_root"] == str(tmp_path)
    assert config_from_texts(texts) == TrainConfig.of(runs_root=str(tmp_path))


def test_form_parse_error_has_the_cli_wording(tmp_path: Path, capsys: pytest.CaptureFixture):
    texts = {**default_texts(tmp_path), "steps": ""}
    with pytest.raises(TitanError) as err:
        config_from_texts(texts)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--steps", ""])
    assert str(err.value) == "argument --steps: invalid int value: ''"
    assert str(err.value) in capsys.readouterr().err


def test_child_argv_passes_only_options_that_differ_from_defaults(tmp_path: Path):
    config = TrainConfig.of(steps=4, lr=0.01, remat="dots", runs_root="ignored", run_id="ignored")
    argv = train_argv(config, tmp_path, "my-run")
    assert argv == [
        *cli_command("train"),
        "--runs-root",
        str(tmp_path),
        "--run-id",
        "my-run",
        "--steps",
        "4",
        "--lr",
        "0.01",
        "--remat",
        "dots",
    ]
    assert build_parser().parse_args(argv[len(cli_command()) :]).lr == 0.01


async def test_an_empty_copies_field_is_named_empty_not_zero(consoles, tmp_path: Path):
    app = consoles(tmp_path / "runs", show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.screen.query_one("#copies", Input).clear()
        await pilot.press("ctrl+r")
        await pilot.pause()
        shown = str(app.screen.query_one("#launch-error").content)
        assert isinstance(app.screen, LaunchScreen)
    assert shown == "copies must be a whole number from 1 to 64, got ''", shown
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
async def test_form_rejects_bad_steps_with_the_cli_message(consoles, tmp_path: Path):
    runs_root = tmp_path / "runs"
    app = consoles(runs_root, show_launch_form=True)
    notes: list[str] = []
    async with app.run_test(size=SIZE, message_hook=notes_into(notes)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, LaunchScreen)
        steps_row = app.screen.query_one("#option-steps")
        steps_row.control.focus()
        steps_row.control.clear()
        await pilot.press("0", "ctrl+r")
        await pilot.pause()
        shown = str(app.screen.query_one("#launch-error").content)
        assert isinstance(app.screen, LaunchScreen)
        assert steps_row.has_class("-invalid")
        assert app.focused is steps_row.control
    cli = subprocess.run(
        [sys.executable, "-m", "titan.cli", "train", "--steps", "0", "--runs-root", str(runs_root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown == "--steps must be >= 1, got 0"
    assert notes == [shown]
    assert cli.returncode == 2
    assert cli.stderr.strip() == f"titan train: error: {shown}"
    assert not runs_root.exists()


# --- launching and monitoring real runs -----------------------------------------------------


@pytest.mark.slow
async def test_form_launches_a_tiny_run_and_the_monitor_shows_its_steps(
    consoles, tmp_path: Path, tiny_form: dict[str, str]
):
    runs_root = tmp_path / "runs"
    app = consoles(runs_root, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await launch_from_form(app, pilot, tiny_form)
        run_dir = _only_run_dir(app)
        shown = {name: stat(app, name) for name in ("status", "step", "process", "checkpoint")}
        losses = list(app.screen.state.curve.losses)
        chart_caption = app.screen.query_one(LossChart).border_subtitle
    launched = app.launched[run_dir]
    events = read_events(run_dir)
    step_losses = [e["loss"] for e in events if e["type"] == "step"]
    assert run_dir.parent == runs_root.resolve()
    child = len(cli_command())  # the interpreter and its flags
    options = launched.argv[child + 5 :]
    assert launched.argv[child : child + 5] == [
        "train",
        "--runs-root",
        str(runs_root.resolve()),
        "--run-id",
        run_dir.name,
    ]
    assert dict(zip(options[::2], options[1::2], strict=True)) == {  # only non-defaults
        "--steps": "4",
        "--batch-size": "4",
        "--seq-len": "32",
        "--warmup-steps": "2",
        "--data": tiny_form["data"],
        "--vocab-size": "512",
        "--checkpoint-every": "2",
        "--dp": "1",
    }
    assert shown == {
        "status": "completed",
        "step": "4 / 4",
        "process": "exited rc 0",
        "checkpoint": "checkpoint at step 4",
    }
    assert losses == step_losses and len(losses) == 4
    assert chart_caption == (  # the lowest loss named as History names it
        f"first {losses[0]:.3f} · best {min(losses):.3f} · last {losses[-1]:.3f}"
    )
    assert (run_dir / STDOUT_LOG).is_file() and (run_dir / STDERR_LOG).is_file()
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "completed"


@pytest.mark.slow
async def test_stop_key_sigterms_a_running_run_and_the_monitor_shows_stopped(
    consoles, tmp_path: Path, tiny_form: dict[str, str]
):
    app = consoles(tmp_path / "runs", show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        long_run = {**tiny_form, "steps": "100000", "checkpoint_every": "100000"}
        long_run["exit_zero_on_stop"] = "true"  # exit 0, not EXIT_STOPPED
        await launch_from_form(app, pilot, long_run, until=lambda monitor: monitor.state.step >= 2)
        assert stat(app, "status") == "running", run_context(_only_run_dir(app))
        assert stat(app, "process").startswith("running (pid ")
        await pilot.press("s", "y")  # stop, then confirm
        await pilot.pause()
        assert app.screen.status in ("stopping", "stopped")
        await wait_until(
            pilot,
            lambda: app.screen.returncode is not None,
            lambda: run_context(_only_run_dir(app)),
            120,
        )
        await pilot.pause(0.3)
        shown = {name: stat(app, name) for name in ("status", "process")}
        stopped_at = app.screen.state.step
        checkpoint = stat(app, "checkpoint")
    run_end = read_events(_only_run_dir(app))[-1]
    assert shown == {"status": "stopped", "process": "exited rc 0"}
    assert run_end["type"] == "run_end" and run_end["status"] == "stopped"
    assert 2 <= stopped_at == run_end["step"] < 100_000
    assert checkpoint == f"checkpoint at step {stopped_at}"
    assert app.running_children() == []


@pytest.mark.slow
async def test_a_run_that_cannot_start_shows_why_from_its_stderr(
    consoles, tmp_path: Path, tiny_form: dict[str, str]
):
    app = consoles(tmp_path / "runs", show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        # --tp 3 fits the devices (the form's check) but not the model: refused at start-up.
        unsplit = {**tiny_form, "tp": "3"}
        await launch_from_form(app, pilot, unsplit)
        shown = {name: stat(app, name) for name in ("status", "process")}
        stderr_lines = list(app.screen.query_one("#stderr", Log).lines)
    why = "titan train: error: --tp 3 (mesh axis 'tensor') does not divide 'vocab' of size 512"
    assert shown["process"] == "exited rc 2"
    assert shown["status"].startswith(f"failed: exited before run_start: {why}")
    assert stderr_lines[-1].startswith(why)
    # Nothing is left in the runs root: no console lists it, History has nothing to ingest.
    assert list_runs(tmp_path / "runs").summaries == []
    assert list((tmp_path / "runs").iterdir()) == []


def test_launch_refuses_an_existing_run_dir(tmp_path: Path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(TitanError, match=r"--run-id 'taken' already exists in"):
        start_run(TrainConfig.of(runs_root=str(tmp_path), run_id="taken"))
    assert list((tmp_path / "taken").iterdir()) == []


# --- the monitor on an existing run dir -----------------------------------------------------


async def test_monitor_follows_events_appended_to_a_run_dir(consoles, tmp_path: Path):
    run_dir = tmp_path / "runs" / "test-run"
    run_dir.mkdir(parents=True)
    t0 = time.time() - 10
    start = event(
        "run_start",
        t0,
        config={"preset": "tiny"},
        model={"name": "tiny"},
        param_count=2_500_000,
        start_step=0,
        total_steps=3,
        resumed_from_step=None,
    )
    steps = [
        event(
            "step", t0 + i, step=i, loss=6.0 - i, tokens=128, tokens_seen=128 * i, tokens_per_s=64.0
        )
        for i in (1, 2, 3)
    ]
    end = event("run_end", t0 + 4, status="completed", step=3)
    third_line = json.dumps(steps[2]) + "\n"
    append_events(run_dir, [start, *steps[:2]], tail=third_line[:20])  # a torn last line
    app = consoles(run_dir.parent, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        # Wait for the rendered panel, not only the state: under load the refresh comes later.
        await wait_until(pilot, lambda: stat(app, "step") == "2 / 3", lambda: "no step 2", 10)
        first = {n: stat(app, n) for n in ("status", "step", "loss", "model", "throughput", "eta")}
        with open(run_dir / EVENTS_FILE, "a", encoding="utf-8") as f:
            f.write(third_line[20:])
        append_events(run_dir, [end])
        # the rendered panels, not only the state, as above
        await wait_until(pilot, lambda: stat(app, "step") == "3 / 3", lambda: "no end", 10)
        await wait_until(pilot, lambda: app.screen.status == "completed", lambda: "no end", 10)
        await wait_until(pilot, lambda: stat(app, "status") == "completed", lambda: "no end", 10)
        last = {n: stat(app, n) for n in ("status", "step", "loss", "process", "eta", "elapsed")}
        losses = list(app.screen.state.curve.losses)
        await pilot.press("escape")
        await pilot.pause()
        back_on_list = isinstance(app.screen, RunsScreen)
    assert first == {
        "status": "running",
        "step": "2 / 3",
        "loss": "4.0000",
        "model": "tiny · 2.50M params",
        "throughput": "64",
        "eta": "0:00:01",
    }
    assert last == {
        "status": "completed",
        "step": "3 / 3",
        "loss": "3.0000",
        "process": "the run has ended",
        "eta": "0:00:00",
        "elapsed": "0:00:04",
    }
    assert losses == [5.0, 4.0, 3.0]
    assert back_on_list


def test_run_state_eta_starts_its_rate_after_the_pinned_host_reservation():
    """The reservation is a pause once per process, after the first step: the ETA's rate is
    measured from the steps after it, not over it."""
    state = RunState()
    state.apply(parsed([event("run_start", 100.0, total_steps=10)]))
    state.apply(parsed([event("step", 101.0, step=1, loss=9.0)]))
    state.apply(parsed([event("pinned_host", 117.0, bytes=1 << 34, seconds=16.0)]))
    state.apply(parsed([event("step", 117.5, step=2, loss=8.0)]))
    assert state.eta_s() is None  # one step after it: no rate yet
    state.apply(parsed([event("step", 118.0, step=3, loss=7.0)]))
    assert state.eta_s() == pytest.approx(7 * 0.5)


def test_run_state_eta_uses_the_recent_step_rate_and_a_resume_keeps_the_losses():
    state = RunState()
    state.apply(parsed([event("run_start", 100.0, config={"preset": "tiny"}, total_steps=10)]))
    state.apply(
        parsed([event("step", 100.0 + 2 * i, step=i, loss=float(10 - i)) for i in (1, 2, 3)])
    )
    assert state.eta_s() == pytest.approx(7 * 2.0)
    state.apply(parsed([event("run_end", 107.0, status="stopped", step=3)]))
    assert (state.status, state.eta_s(), state.elapsed_s(now=1e9)) == ("stopped", 0.0, 7.0)
    assert state.elapsed_s(now=1.0) == 7.0  # ended: now does not count
    early = RunState()
    early.apply(parsed([event("run_start", 100.0, total_steps=10)]))
    assert early.elapsed_s(now=40.0) is None  # the clock set back since: unknown, not -60 s
    state.apply(
        parsed([event("run_start", 200.0, total_steps=10, start_step=3, resumed_from_step=3)])
    )
    state.apply(parsed([event("step", 201.0, step=4, loss=6.0)]))
    assert (state.status, state.step, state.resumed_from_step) == ("running", 4, 3)
    assert state.curve.losses == [9.0, 8.0, 7.0, 6.0]
    # From the first run_start, the gap between the attempts included (titan summarize's wall)
    assert state.elapsed_s(now=210.0) == 110.0


async def test_a_run_that_names_no_process_is_not_offered_stop_and_says_why(
    consoles, tmp_path: Path
):
    run_dir = tmp_path / "test-run"
    run_dir.mkdir()
    append_events(run_dir, [event("run_start", time.time(), total_steps=5)])
    app = consoles(tmp_path, open_run=run_dir)
    notes: list[str] = []
    async with app.run_test(size=SIZE, message_hook=notes_into(notes)) as pilot:
        await wait_until(pilot, lambda: app.screen.status == "running", lambda: "no start", 10)
        await wait_until(pilot, lambda: stat(app, "process") != "-", lambda: "no process", 10)
        offered = {b.binding.action for b in app.screen.active_bindings.values()}
        await pilot.press("s")
        await pilot.pause()
        status, process = app.screen.status, stat(app, "process")
        confirm_shown = isinstance(app.screen, ConfirmScreen)
    assert "signal('stop')" not in offered and "signal('kill')" not in offered
    assert (status, process, confirm_shown, notes) == (
        "running",
        "the record names no process to signal",
        False,
        [],
    )


@pytest.mark.slow
async def test_a_stopped_run_has_no_eta_and_a_long_failure_reason_is_shown_whole(
    consoles, tmp_path: Path
):
    t0 = time.time() - 10
    reason = "stalled in step for 9.9 s: " + "a reason longer than the screen is wide " * 3
    for name, status, error in (("stopped-run", "stopped", None), ("failed-run", "failed", reason)):
        (tmp_path / name).mkdir()
        end = {"status": status, "step": 2, **({"error": error} if error else {})}
        steps = [event("step", t0 + i, step=i, loss=5.0) for i in (1, 2)]
        append_events(
            tmp_path / name,
            [event("run_start", t0, total_steps=10), *steps, event("run_end", t0 + 3, **end)],
        )
    shown = {}
    for name in ("stopped-run", "failed-run"):
        app = consoles(tmp_path, open_run=tmp_path / name)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda a=app: stat(a, "step") == "2 / 10", lambda: "no end", 10)
            status = app.screen.query_one("#status", Stat)
            shown[name] = (stat(app, "status"), stat(app, "eta"), status.size.height)
            width = status.size.width
    assert shown["stopped-run"] == ("stopped", "-", 1)
    assert shown["failed-run"][:2] == (f"failed: {reason}", "-")
    # The reason wraps over the whole width of the overview instead of ending in an ellipsis.
    assert width >= SIZE[0] - 4
    assert shown["failed-run"][2] >= -(-len("failed: " + reason) // (width - 10)) >= 2


# --- run list, keys, command line -----------------------------------------------------------


async def test_run_list_shows_runs_newest_first_and_opens_the_selected_one(
    consoles, tmp_path: Path
):
    for name, started, status in (("old-run", 1000.0, "completed"), ("new-run", 2000.0, None)):
        (tmp_path / name).mkdir()
        events = [event("run_start", started, config={"preset": "tiny"}, total_steps=8)]
        events.append(event("step", started + 1, step=1, loss=5.5))
        if status:
            events.append(event("run_end", started + 2, status=status, step=1))
        append_events(tmp_path / name, events)
    (tmp_path / "not-a-run").mkdir()
    app = consoles(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: table.row_count == 2, lambda: "runs not listed", 10)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        await pilot.press("down", "enter")
        await pilot.pause()
        opened = app.screen.run_dir if isinstance(app.screen, MonitorScreen) else None
    assert rows == [
        ["dead", "1/8", "5.500", "new-run", "tiny"],  # silent for decades, no process
        ["completed", "1/8", "5.500", "old-run", "tiny"],
    ]
    assert opened == tmp_path / "old-run"


async def test_f1_lists_the_screen_keys_and_escape_closes_them(consoles, tmp_path: Path):
    run_dir = tmp_path / "test-run"
    run_dir.mkdir()
    app = consoles(tmp_path, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        keys_screen = app.screen
        table = keys_screen.query_one("DataTable")
        rows = {tuple(table.get_row_at(i)) for i in range(table.row_count)}
        await pilot.press("escape")
        await pilot.pause()
        after = app.screen
    assert isinstance(keys_screen, KeysScreen)
    assert {("1", "Overview"), ("esc", "Back"), ("f1", "Keys"), ("q, ^q", "Quit")} <= rows
    assert ("s", "Stop run") not in rows  # an empty run dir has no process to stop
    assert isinstance(after, MonitorScreen)


def test_help_documents_every_option(capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    for option in ("--runs-root DIR", "--run RUN_DIR", "-h, --help"):
        assert option in text
    assert "Quitting leaves started runs running" in text


def test_run_option_must_name_a_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    for name, problem in (
        ("missing", "no such folder"),
        ("file", "not a folder (give the run's folder)"),
        ("empty", "not a run dir (no events.jsonl there)"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["--run", str(tmp_path / name)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err == f"titan-console: error: --run {tmp_path / name}: {problem}\n"


def test_exit_message_tells_how_to_follow_and_stop_runs_left_running(tmp_path: Path):
    class _Run:
        run_dir = tmp_path / "tiny-run"
        pid = 4242

    text = exit_message([_Run()])
    assert exit_message([]) == ""
    assert "1 training run(s) left running" in text
    assert f"titan-console --run {tmp_path / 'tiny-run'}" in text
    assert "kill -TERM -4242" in text


async def test_attach_opens_the_monitor_of_a_run_dir_typed_after_a(consoles, tmp_path: Path):
    # A sample run copied into a runs root: the console never launched it.
    run_id = "tiny-watchdog-stall"
    runs_root = tmp_path / "runs"
    shutil.copytree(SAMPLE_RUNS / run_id, runs_root / run_id)
    app = consoles(runs_root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("a")
        await pilot.pause()
        attach_shown = isinstance(app.screen, AttachScreen)
        await pilot.press(*"nowhere", "enter")
        await pilot.pause()
        error = str(app.screen.query_one("#attach-error").content)
        app.screen.query_one("#attach-path", Input).value = run_id
        await pilot.press("enter")
        await wait_until(
            pilot,
            lambda: isinstance(app.screen, MonitorScreen) and stat(app, "step") != "0 / ?",
            lambda: f"not attached: {app.screen}",
            10,
        )
        monitor = app.screen
        shown = {n: stat(app, n) for n in ("status", "step", "model", "process")}
        sub_title = monitor.sub_title
    assert attach_shown
    assert error == f"no {EVENTS_FILE} in {(runs_root / 'nowhere').resolve()}"
    assert monitor.run_dir == (runs_root / run_id).resolve()
    assert sub_title == run_id
    assert shown["status"] == "failed: stalled in step for 9.9 s"
    assert shown["step"].startswith("23 / ")  # its last step event, as History counts
    assert shown["model"].startswith("tiny")
    assert shown["process"] == "the run has ended"


@pytest.mark.slow
async def test_launch_form_labels_and_flags_are_apart_from_their_fields(consoles, tmp_path):
    app = consoles(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        bar = app.screen.query_one("#launch-bar")
        labels = {str(label.content): label.region for label in bar.query(Label)}
        preset = bar.query_one("#preset", Select).region
        copies = bar.query_one("#copies", Input).region
        rows = list(app.screen.query(OptionInput))
        gaps = {row.flag: row.control.region.x - row.query_one(Label).region.x for row in rows}
    # "preset defaults", "copies 1": a blank cell between each label and its field.
    assert labels["preset"].x + len("preset") < preset.x
    assert labels["copies"].x + len("copies") < copies.x
    # "--nonfinite-patience 5", never "--nonfinite-patienc5", at 80 columns too.
    assert SIZE[0] == 80 and rows and all(gap > len(flag) for flag, gap in gaps.items())


@pytest.mark.slow
async def test_every_screen_below_80x24_shows_the_terminal_too_small_notice(
    consoles, tmp_path: Path
):
    app = consoles(tmp_path)
    async with app.run_test(size=(70, 20)) as pilot:
        await pilot.pause()
        shown = []
        for name in ("", "launch", "planner", "history"):
            if name:  # each from the run list (keys do nothing under the notice)
                app.action_open(name)
                await pilot.pause()
            notice = app.screen.query_one(TooSmall)
            shown.append((type(app.screen).__name__, notice.display, str(notice.content)))
            if name:
                app.pop_screen()
                await pilot.pause()
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        hidden_at_80x24 = not app.screen.query_one(TooSmall).display
    assert [name for name, _, _ in shown] == [
        "RunsScreen",
        "LaunchScreen",
        "PlannerScreen",
        "HistoryScreen",
    ]
    for _, displayed, text in shown:
        assert displayed
        assert text.startswith("Terminal too small: 70x20.\nThe console needs at least 80x24")
    assert hidden_at_80x24


async def test_a_dead_runs_elapsed_time_stops_at_its_last_event(tmp_path: Path, consoles):
    run_dir = tmp_path / "lost"
    run_dir.mkdir()
    t0 = time.time() - 3600
    start = event("run_start", t0, config={"preset": "tiny"}, total_steps=100)
    steps = [event("step", t0 + 5 * i, step=i, loss=5.0) for i in (1, 2, 3)]
    append_events(run_dir, [start, *steps])  # no run_end, no process: silent for an hour
    os.utime(run_dir / EVENTS_FILE, (t0 + 15, t0 + 15))
    app = consoles(tmp_path, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.screen.status == "dead", lambda: "not dead", 10)
        await wait_until(pilot, lambda: stat(app, "elapsed") != "-", lambda: "no clock", 10)
        first = stat(app, "elapsed")
        await pilot.pause(1.5)
        later = stat(app, "elapsed")
    assert first == later == "0:00:15"


async def test_a_screen_returned_to_after_shrinking_the_terminal_shows_the_notice(
    consoles, tmp_path: Path
):
    app = consoles(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("p")  # the planner, then the terminal shrinks under it
        await pilot.pause()
        await pilot.resize_terminal(50, 15)
        await pilot.pause()
        app.pop_screen()  # back to the run list, left while the terminal was large (esc does
        # nothing under the notice)
        await pilot.pause()
        notice = app.screen.query_one(TooSmall)
        shown = (type(app.screen).__name__, notice.display, str(notice.content))
    assert shown[:2] == ("RunsScreen", True)
    assert shown[2].startswith("Terminal too small: 50x15.")
