"""Console v2: planner, history (DuckDB), monitor panels, watchdog stall of a real run, launch
presets and copies, driven through Textual's pilot at 80x24."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean

import pytest
from console_helpers import (
    append_events,
    event,
    kill_children,
    launch_from_form,
    parsed,
    tiny_form_texts,
    wait_until,
)
from rich.color import Color
from rich.console import Console
from samples import SAMPLE_RUNS, copy_sample_runs
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.widgets import DataTable, Input, Select, Static

from titan.analysis import summarize
from titan.config import TrainConfig
from titan.errors import TitanError
from titan.telemetry.events import PipelineTiming
from tui.app import TitanConsole
from tui.history_queries import HistoryQuery, HistoryStore, config_diff
from tui.launcher import start_run
from tui.options import MAX_COPIES, copies_of
from tui.planner_form import plan_argv, start_texts
from tui.run_state import RunState
from tui.run_watch import RunWatcher
from tui.screens.compare import CompareScreen
from tui.screens.history import HistoryScreen
from tui.screens.launch import LaunchScreen
from tui.screens.planner import PlannerScreen
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.history_table import HistoryTable
from tui.widgets.loss_chart import LossChart
from tui.widgets.option_input import OptionInput
from tui.widgets.pipeline_panel import timeline
from tui.widgets.plan_tables import PlanTables, totals_rows
from tui.widgets.sparkline import SparklineColumns
from tui.widgets.stat import Stat

SIZE = (80, 24)
# Wide enough for every History column (at 80 columns some give way: test_console_widths.py).
WIDE = (160, 24)
STALL_RUN = "tiny-watchdog-stall"
RESUMED_RUN = "tiny-killed-resumed"
GPU_RUN = "llama3-1b-h200"


@pytest.fixture()
def sample_root(tmp_path: Path) -> Path:
    """A copy of ``sample_runs/`` (the console writes its database into the runs root)."""
    return copy_sample_runs(tmp_path / "sample_runs")


def _rows(table: DataTable) -> list[list[str]]:
    return [table.get_row_at(i) for i in range(table.row_count)]


def _value(app: TitanConsole, stat_id: str) -> str:
    return app.screen.query_one(f"#{stat_id}", Stat).value


@pytest.fixture()
def tiny_form(corpus_dir: Path) -> dict[str, str]:
    """Form texts of a small real run (one device, the test corpus)."""
    return tiny_form_texts(corpus_dir)


# --- planner --------------------------------------------------------------------------------


@pytest.mark.slow
async def test_planner_form_shows_the_numbers_of_titan_plan_json(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        screen = app.screen
        assert isinstance(screen, PlannerScreen)
        await wait_until(pilot, lambda: screen.report is not None, lambda: "no plan", 10)
        first = screen.report
        totals = _rows(screen.query_one("#plan-totals", DataTable))
        verdict = str(screen.query_one("#plan-verdict").content)
        screen.query_one("#option-gpus", OptionInput).control.value = "0"
        await wait_until(
            pilot,
            lambda: str(screen.query_one("#plan-help").content).startswith("--gpus"),
            lambda: "no error shown",
            10,
        )
        error = str(screen.query_one("#plan-help").content)
        stale = screen.query_one(PlanTables).has_class("-stale")
        screen.query_one("#option-gpus", OptionInput).control.value = "64"
        screen.query_one("#option-search", OptionInput).control.value = "1"
        await wait_until(pilot, lambda: screen.report["search"], lambda: "no search", 20)
        ranked = _rows(screen.query_one("#plan-ranked", DataTable))
        searched = screen.report
        fresh = not screen.query_one(PlanTables).has_class("-stale")
    argv = [sys.executable, "-m", "titan.cli", "plan", *plan_argv(start_texts()), "--json"]
    cli = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    search = ["titan.cli", "plan", *plan_argv({**start_texts(), "search": "1"}), "--json"]
    cli_search = json.loads(
        subprocess.run(
            [sys.executable, "-m", *search, "--top", "10"], capture_output=True, check=True
        ).stdout
    )
    assert first["plans"] == cli["plans"]
    values: dict[str, list[str]] = {}
    for key, line in totals:  # a long value goes on over the next rows, their key empty
        values.setdefault(key or list(values)[-1], []).append(line)
    assert [(k, " ".join(lines)) for k, lines in values.items()] == totals_rows(cli["plans"][0])
    plan = cli["plans"][0]
    total_gb, capacity_gb = plan["memory_bytes"]["total"] / 1e9, plan["capacity_bytes"] / 1e9
    margin_gb = plan["fit_bytes"] / 1e9
    assert total_gb < margin_gb < capacity_gb
    assert plan["fits"] and verdict == (  # titan plan's words
        f"fits: {total_gb:,.2f} GB estimated, {margin_gb:,.2f} GB with the margin, of "
        f"{capacity_gb:,.2f} GB usable"
    )
    assert error == "--gpus must be >= 1, got 0 (the dimmed results are for the last valid input)"
    assert stale and fresh
    assert searched["plans"] == cli_search["plans"]
    assert searched["layouts_fit"] == cli_search["layouts_fit"]
    assert [row[2] for row in ranked] == [p["layout"] for p in cli_search["plans"]]


# --- history --------------------------------------------------------------------------------


async def _open_history(pilot) -> HistoryTable:
    """Press ``h`` and wait until the four sample runs are listed; returns the table."""
    await pilot.press("h")
    table = pilot.app.screen.query_one(HistoryTable)
    await wait_until(pilot, lambda: table.row_count == 4, lambda: "not listed", 20)
    return table


async def test_history_lists_sample_runs_filters_sorts_and_exports(sample_root: Path):
    app = TitanConsole(sample_root)
    async with app.run_test(size=WIDE) as pilot:
        table = await _open_history(pilot)
        screen = app.screen
        listed = _rows(table)
        # The console holds the database only while it queries: the CLI can use it meanwhile.
        assert len(summarize.summarize(sample_root)) == 4
        await pilot.press(*"oooooo")  # from "started" to run, status, preset, layout, dev, steps
        await wait_until(pilot, lambda: table.current, lambda: "not sorted", 10)
        by_steps = ([row[5] for row in _rows(table)], table.sorted_by)
        await pilot.press("slash", *"stall", "enter")
        await wait_until(pilot, lambda: table.current, lambda: "not filtered", 10)
        filtered = [row[0] for row in _rows(table)]
        await pilot.press("x")
        csv_path = sample_root / "history.csv"
        await wait_until(pilot, csv_path.exists, lambda: "no export", 10)
        await pilot.pause(0.2)
    exported = list(csv.DictReader(csv_path.open()))
    assert isinstance(screen, HistoryScreen)
    assert [row[:6] for row in listed] == [
        [GPU_RUN, "completed", "llama3-1b", "spmd", "1", "80"],
        [STALL_RUN, "failed", "tiny", "spmd", "1", "23"],
        [RESUMED_RUN, "completed", "tiny", "spmd", "8", "40"],
        ["tiny-20261129-185806-39fc", "completed", "tiny", "spmd", "1", "200"],
    ]
    assert [row[10] for row in listed] == ["4.679", "5.615", "5.149", "3.771"]
    assert by_steps == (["23", "40", "80", "200"], "steps ascending")
    assert filtered == [STALL_RUN]
    assert [(r["run_id"], r["status"], r["steps"]) for r in exported] == [
        (STALL_RUN, "failed", "23")
    ]


async def test_history_marks_the_sort_column_and_counts_the_filtered_runs(sample_root: Path):
    app = TitanConsole(sample_root)
    async with app.run_test(size=WIDE) as pilot:
        table = await _open_history(pilot)
        screen = app.screen

        def headings() -> list[str]:
            return [str(column.label) for column in table.ordered_columns]

        def count() -> str:
            return str(screen.query_one("#history-status", Static).content).split(" · ")[0]

        newest_first = (headings()[-1], count())
        await pilot.press("o", "O")  # by run, then reversed
        by_run = (headings()[0], headings()[-1])
        await pilot.press("slash", *"stall", "enter")
        await wait_until(pilot, lambda: table.current, lambda: "not filtered", 10)
        await pilot.pause(0.1)
        filtered = count()
        await pilot.press("slash", "escape")
        await wait_until(pilot, lambda: table.current, lambda: "not cleared", 10)
        await pilot.pause(0.1)
        cleared = count()
    assert newest_first == ("started ▼", "4 runs")
    assert by_run == ("run ▼", "started")
    assert filtered == "1 of 4 runs"
    assert cleared == "4 runs"


async def test_history_compares_two_runs_and_opens_a_run_detail(sample_root: Path):
    app = TitanConsole(sample_root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        table = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: table.row_count == 4, lambda: "not listed", 20)
        await pilot.press("down", "space", "down", "space", "c")
        compare = app.screen
        await wait_until(pilot, lambda: bool(compare.diff), lambda: "no diff", 10)
        diff_rows = _rows(compare.query_one(DataTable))
        curves = [(label, len(xs)) for label, xs, _ in compare.query_one("CurvePlot").series]
        await pilot.press("escape", "up", "enter")
        detail = app.screen
        await wait_until(pilot, lambda: detail.detail is not None, lambda: "no detail", 10)
        await pilot.press("5")
        stalls_log = list(detail.query_one("#detail-stalls").lines)
        summary = dict(_rows(detail.query_one("#detail-summary", DataTable)))
    assert isinstance(compare, CompareScreen) and isinstance(detail, RunDetailScreen)
    assert [row[0] for row in diff_rows] == [
        "debug_stall_at_step",
        "watchdog_abort",
        "watchdog_floor",
    ]
    assert diff_rows[-1] == ["watchdog_floor", "5.0", "300.0"]
    assert curves == [(STALL_RUN, 23), (RESUMED_RUN, 40)]
    assert stalls_log[:2] == ["1 stall(s)", "step 25: 9.9 s (stall allowance 9.4 s)"]
    assert (summary["status"], summary["stalls"], summary["ETTR"]) == (
        "failed (stall)",
        1,
        "52.6%",
    )


def _renamed_run(root: Path, source: str, run_id: str) -> None:
    """A copy of sample run ``source`` under ``root`` as ``run_id`` (its records too)."""
    target = root / run_id
    shutil.copytree(SAMPLE_RUNS / source, target)
    for name in ("events.jsonl", "config.json"):
        path = target / name
        path.write_text(path.read_text().replace(f'"{source}"', f'"{run_id}"'))


async def test_compare_shows_both_runs_columns_at_80_columns_with_long_run_ids(tmp_path: Path):
    long_ids = [f"{'x' * 40}-{source}" for source in (STALL_RUN, RESUMED_RUN)]
    for source, run_id in zip((STALL_RUN, RESUMED_RUN), long_ids, strict=True):
        _renamed_run(tmp_path, source, run_id)
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        store = HistoryStore(tmp_path)
        store.ingest()
        await app.push_screen(CompareScreen(store, *long_ids))
        compare = app.screen
        await wait_until(pilot, lambda: bool(compare.diff), lambda: "no diff", 10)
        await pilot.pause(0.5)
        table = compare.query_one(DataTable)
        columns = [str(column.label) for column in table.columns.values()]
        width, shown = table.virtual_size.width, table.scrollable_content_region.width
    assert columns == ["config", "A", "B"]
    assert width <= shown, (width, shown)  # no column pushed off to the right
    assert compare.sub_title == f"A {long_ids[0]} vs B {long_ids[1]}"


def test_history_store_downsamples_the_loss_curve_and_diffs_configs(sample_root: Path):
    store = HistoryStore(sample_root)
    store.ingest()
    run = "tiny-20261129-185806-39fc"
    full = store.loss_curve(run)
    coarse = store.loss_curve(run, max_points=50)
    events = [json.loads(line) for line in (sample_root / run / "events.jsonl").open()]
    losses = [e["loss"] for e in events if e["type"] == "step"]
    assert [loss for _, loss in full] == pytest.approx(losses)
    # 200 steps in 25 buckets of 8: each bucket's lowest and highest point, in step order.
    steps = [e["step"] for e in events if e["type"] == "step"]
    buckets = [list(zip(steps, losses, strict=True))[i : i + 8] for i in range(0, 200, 8)]
    kept = sorted(
        {p for b in buckets for p in (min(b, key=lambda p: p[1]), max(b, key=lambda p: p[1]))}
    )
    assert coarse == [(s, pytest.approx(v)) for s, v in kept] and len(coarse) <= 50
    assert min(v for _, v in coarse) == pytest.approx(min(losses))
    # Placement and options one record does not hold are not differences between the runs.
    a = {"a": 1, "b": 2, "run_id": "x", "runs_root": "/r"}
    b = {"a": 1, "b": 3, "c": 4, "run_id": "y", "runs_root": "/s"}
    assert config_diff(a, b) == [("b", 2, 3)]


async def test_escape_in_the_history_filter_clears_it_and_stays_on_history(sample_root: Path):
    app = TitanConsole(sample_root)
    async with app.run_test(size=SIZE) as pilot:
        table = await _open_history(pilot)
        screen = app.screen
        field = screen.query_one("#history-filter", Input)
        await pilot.press("slash", *"stall", "enter")
        # the page comes from a worker: wait for it (one run matches "stall")
        await wait_until(pilot, lambda: table.row_count == 1, lambda: str(table.row_count), 20)
        await pilot.press("slash", "escape")
        await wait_until(pilot, lambda: table.row_count == 4, lambda: str(table.row_count), 20)
        cleared = (app.screen is screen, table.row_count, field.value, field.display)
        table_focused = table.has_focus
        await pilot.press("escape")
        left = app.screen is not screen
    assert cleared == (True, 4, "", False)
    assert table_focused and left


# --- monitor panels -------------------------------------------------------------------------


def _gpu_run(run_dir: Path, t0: float) -> None:
    """A record of a 2-GPU H100 MPMD run with power, FLOPs and a timed pipeline step."""
    start = event(
        "run_start",
        t0,
        config={"preset": "tiny", "watchdog_floor": 5.0, "watchdog_factor": 10.0},
        layout={"devices": 2},
        env={"device_kinds": ["NVIDIA H100 80GB HBM3"], "device_count": 2},
        power={"available": True, "reason": None},
        total_steps=10,
    )
    pipeline = event(
        "pipeline",
        t0 + 1,
        stages=2,
        schedule="gpipe",
        microbatches=2,
        theoretical_bubble=1 / 3,
        actions=[["F0c0", "F1c0", "B0c0", "B1c0"], ["F0c1", "F1c1", "B0c1", "B1c1"]],
    )
    step = event(
        "step",
        t0 + 2,
        step=1,
        loss=5.0,
        lr=1e-3,
        tokens=1000,
        tokens_seen=1000,
        step_time_s=2.0,
        tokens_per_s=500.0,
        model_flops_per_token={"causal": 2e9, "full": 3e9},
        mfu={"causal": 0.25, "full": 0.375, "peak_flops": 4e12, "peak_kind": "datasheet"},
        energy_j=2400.0,
        joules_per_token=2.4,
        peak_memory_bytes=50_000_000_000,
    )
    # 30 GB of state in, donated to the 30 GB out, 12 GB of temporaries: 42 GB
    gb = 10**9
    memory = {"argument_bytes": 30 * gb, "output_bytes": 30 * gb, "alias_bytes": 30 * gb}
    memory |= {"temp_bytes": 12 * gb, "generated_code_bytes": 0}
    compile_event = event("compile", t0 + 1, what="stage", seconds=1.0, memory=memory)
    timing = event(
        "pipeline_timing",
        t0 + 3,
        step=1,
        step_time_s=6.0,
        actions=[
            [0, 0, 0, "F", 0.0, 1.0],
            [0, 0, 1, "F", 1.0, 2.0],
            [1, 1, 0, "F", 1.0, 2.0],
            [1, 1, 1, "F", 2.0, 3.0],
            [1, 1, 0, "B", 3.0, 4.0],
            [1, 1, 1, "B", 4.0, 5.0],
            [0, 0, 0, "B", 4.0, 5.0],
            [0, 0, 1, "B", 5.0, 6.0],
        ],
    )
    append_events(run_dir, [start, compile_event, pipeline, step, timing])


async def test_monitor_panels_show_power_flops_and_the_pipeline_bubble(tmp_path: Path):
    run_dir = tmp_path / "gpu-run"
    run_dir.mkdir()
    _gpu_run(run_dir, time.time() - 5)
    app = TitanConsole(tmp_path, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.screen.state.step == 1, lambda: "no step", 10)
        await pilot.press("4")
        await pilot.pause()
        power = {n: _value(app, n) for n in ("pw-watts", "pw-energy", "pw-jpt")}
        watts_tone = app.screen.query_one("#pw-watts", Stat).query_one(".stat-value").classes
        await pilot.press("5")
        await pilot.pause()
        flops = {n: _value(app, n) for n in ("fl-tflops", "fl-mfu", "fl-tokens", "fl-memory")}
        await pilot.press("6")
        await pilot.pause()
        pipeline = str(app.screen.query_one("PipelinePanel").content).splitlines()
        await pilot.press("3")
        watchdog = {n: _value(app, n) for n in ("wd-phase", "wd-threshold", "wd-stalls")}
    assert power == {  # 2400 J over 2 s on 2 devices: 600 W each, 86% of the H100's 700 W
        "pw-watts": "600 W of 700 W TDP (86%) x 2",
        "pw-energy": "0.0007 kWh (2,400 J)",
        "pw-jpt": "2.4 J/token · 0.4 tokens/J over the run",
    }
    assert "-warn" in watts_tone
    assert flops == {
        "fl-tflops": "1.000",
        # the peak it divides by, as titan summarize names it: 4 TFLOP/s over 2 devices
        "fl-mfu": "25.0% (causal attention FLOPs, of NVIDIA H100 80GB HBM3: 2 TFLOP/s per "
        "device (datasheet))",
        "fl-tokens": "500",
        "fl-memory": "peak 50.00 GB · compiled 42.00 GB",
    }
    assert pipeline[0] == "gpipe · 2 stages · 2 microbatches · theoretical bubble 33.3%"
    assert pipeline[1] == "step 1: 6.000 s, measured bubble 33.3%"
    assert watchdog == {"wd-phase": "step", "wd-threshold": "20.0 s", "wd-stalls": "none"}


@pytest.mark.parametrize("points", [1, 2, 40, 500])
def test_column_sparkline_draws_the_bars_and_colours_of_textuals_sparkline(points: int):
    losses = [10.0 / (1 + i) + (i % 7) * 0.1 for i in range(points)]
    options = {
        "width": 50,
        "height": 5,
        "min_color": Color.parse("#00ff00"),
        "max_color": Color.parse("#ff0000"),
        "summary_function": fmean,
    }
    console = Console(width=60, color_system="truecolor", force_terminal=True)

    def cells(renderable) -> list[tuple[str, object]]:
        segments = console.render(renderable)
        return [(c, s.style.color if s.style else None) for s in segments for c in s.text]

    drawn = cells(SparklineColumns(losses, **options))
    assert drawn == cells(SparklineRenderable(losses, **options))
    rows = "".join(char for char, _ in drawn).split("\n")
    assert (len(rows), len(rows[-1])) == (5, 50)  # five rows; the bottom one is never blank


def test_column_sparkline_of_no_data_is_blank():
    console = Console(width=60, color_system="truecolor", force_terminal=True)
    drawn = "".join(s.text for s in console.render(SparklineColumns([], width=50, height=2)))
    assert drawn == " " * 50 + "\n" + " " * 50


async def test_ascii_draws_the_console_borders_with_ascii(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    borders = {}
    for ascii_only in (False, True):
        app = TitanConsole(tmp_path, open_run=run_dir, ascii_only=ascii_only)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            borders[ascii_only] = {
                name: app.screen.query_one(f"#{name}").styles.border.top[0]
                for name in ("loss-chart", "stderr", "wd-stacks")
            }
    assert borders[False] == dict.fromkeys(("loss-chart", "stderr", "wd-stacks"), "round")
    assert borders[True] == dict.fromkeys(("loss-chart", "stderr", "wd-stacks"), "ascii")


def test_timeline_draws_busy_cells_and_measures_the_bubble():
    timing = PipelineTiming(
        step=1, step_time_s=4.0, actions=[[0, 0, 0, "F", 0.0, 2.0], [1, 1, 0, "B", 2.0, 4.0]]
    )
    rows, bubble = timeline(timing, stages=2, width=8)
    assert rows == ["FFFF····", "····BBBB"]
    assert bubble == pytest.approx(0.5)


def test_run_state_takes_the_watchdog_allowance_from_the_run_options():
    state = RunState()
    state.apply(
        parsed([event("run_start", 0.0, config={"watchdog_floor": 1.0, "watchdog_factor": 4.0})])
    )
    assert (state.phase, state.threshold_s()) == ("compile", 30.0)
    state.apply(parsed([event("step", 1.0, step=1, loss=3.0, step_time_s=0.5)]))
    assert (state.phase, state.threshold_s()) == ("step", 2.0)
    state.apply(
        parsed([event("stall", 5.0, phase="data_wait", elapsed_s=3.0, threshold_s=2.0, step=2)])
    )
    assert (state.phase, len(state.stalls)) == ("data_wait", 1)


# --- a real run that stalls -----------------------------------------------------------------


@pytest.mark.slow
async def test_a_stall_of_a_real_run_appears_in_the_watchdog_panel(
    tmp_path: Path, tiny_form: dict[str, str]
):
    app = TitanConsole(tmp_path / "runs", show_launch_form=True)
    stalling = {
        **tiny_form,
        "steps": "50",
        "checkpoint_every": "50",
        "debug_stall_at_step": "3",
        "watchdog_floor": "1",
        "watchdog_abort": "true",  # a switch: the form shows a true / false Select
    }
    try:
        async with app.run_test(size=SIZE) as pilot:
            monitor = await launch_from_form(app, pilot, stalling)
            await pilot.press("3")
            await pilot.pause()
            stalls = _value(app, "wd-stalls")
            status = _value(app, "status")
            stack_lines = list(monitor.query_one("#wd-stacks").lines)
    finally:
        kill_children(app)
    assert status == "failed: stalled in step for " + status.split(" for ")[-1]
    assert stalls.startswith("1 · step 3: ")
    assert any("_debug_stall" in line for line in stack_lines)


# --- launch presets and copies --------------------------------------------------------------


@pytest.mark.slow
async def test_a_form_preset_fills_the_fields(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, LaunchScreen)
        app.screen.query_one("#preset", Select).value = "mpmd 2 stages"
        await pilot.pause()
        texts = {r.option_name: r.text for r in app.screen.query(OptionInput)}
    assert (texts["layout"], texts["pp"], texts["microbatches"]) == ("mpmd", "2", "4")
    assert texts["steps"] == str(TrainConfig().optimizer.steps)


def test_copies_get_their_own_seeds_and_run_ids():
    configs = copies_of(TrainConfig.of(seed=7, run_id="sweep"), "3")
    assert [(c.run.seed, c.run.run_id) for c in configs] == [
        (7, "sweep-1"),
        (8, "sweep-2"),
        (9, "sweep-3"),
    ]
    assert copies_of(TrainConfig(), "1") == [TrainConfig()]
    for copies in (0, MAX_COPIES + 1, 10**9):
        with pytest.raises(TitanError, match=f"copies must be from 1 to 64, got {copies}$"):
            copies_of(TrainConfig(), str(copies))
    assert len(copies_of(TrainConfig(), str(MAX_COPIES))) == MAX_COPIES
    # what Textual's integer field lets through while it is typed: refused in one line
    for partial in ("-", "+", "1_", ""):
        with pytest.raises(TitanError, match=f"whole number .* got '{re.escape(partial)}'$"):
            copies_of(TrainConfig(), partial)


def test_launch_refuses_missing_data_before_making_a_run_dir(tmp_path: Path):
    config = TrainConfig.of(data=str(tmp_path / "nope"), runs_root=str(tmp_path / "runs"))
    with pytest.raises(TitanError, match="--data .*nope: no such file or directory"):
        start_run(config)
    assert not (tmp_path / "runs").exists()


def test_a_history_export_that_cannot_be_written_is_one_line(sample_root: Path, tmp_path: Path):
    store = HistoryStore(sample_root)
    store.ingest()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(TitanError, match=r"^history not exported: cannot write .*a-file/h\.csv"):
        store.export(blocked / "h.csv", HistoryQuery())
    assert store.export(tmp_path / "h.csv", HistoryQuery()) == 4


def test_the_watcher_reads_a_record_replaced_under_it_from_its_start(tmp_path: Path):
    """A record copied over the one read (shorter, or longer with other first bytes), or
    removed: what was read is dropped, not shown as the run's state."""
    completed = (SAMPLE_RUNS / "tiny-20261129-185806-39fc" / "events.jsonl").read_bytes()
    stalled = (SAMPLE_RUNS / "tiny-watchdog-stall" / "events.jsonl").read_bytes()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = run_dir / "events.jsonl"
    record.write_bytes(completed)
    watcher = RunWatcher(run_dir)
    state = _read_to_end(watcher)
    assert (state.end_status, state.step) == ("completed", 200)
    record.write_bytes(stalled)
    state = _read_to_end(watcher)
    assert (state.end_status, state.step) == ("failed", 23)
    record.write_bytes(completed + completed)
    state = _read_to_end(watcher)
    assert (state.attempts, state.step) == (2, 200)
    shutil.rmtree(run_dir)
    state = _read_to_end(watcher)
    assert (state.attempts, state.end_status) == (0, None)


async def test_a_monitor_whose_run_dir_is_removed_says_so_and_drops_what_it_showed(
    tmp_path: Path,
):
    run_dir = tmp_path / "run"
    shutil.copytree(SAMPLE_RUNS / "tiny-20261129-185806-39fc", run_dir)
    app = TitanConsole(tmp_path, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.screen.state.step == 200, lambda: "not read", 20)
        chart = app.screen.query_one(LossChart)
        drawn = lambda: "last" in str(chart.border_subtitle)  # noqa: E731
        await wait_until(pilot, drawn, lambda: "no curve", 10)
        shutil.rmtree(run_dir)
        seen = lambda: _value(app, "status") == f"removed: {run_dir} no longer exists"  # noqa: E731
        await wait_until(pilot, seen, lambda: _value(app, "status"), 10)
        cleared = lambda: chart.border_subtitle == "no steps yet"  # noqa: E731
        await wait_until(pilot, cleared, lambda: str(chart.border_subtitle), 10)
        assert _value(app, "step").startswith("0")


async def test_a_starting_run_shows_what_its_trainer_says_it_is_doing(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    progress = "titan: tokenizing: 67% of 31.5 MB, ETA 6s, 1,000 tokens, 500 tokens/s"
    (run_dir / "stdout.log").write_text(f"titan: preparing the tokenizer\n{progress}\n")
    (run_dir / "stderr.log").write_text("")
    app = TitanConsole(tmp_path, open_run=run_dir)
    async with app.run_test(size=SIZE) as pilot:
        shown = lambda: _value(app, "status") == f"starting: {progress}"  # noqa: E731
        await wait_until(pilot, shown, lambda: _value(app, "status"), 10)
        with open(run_dir / "stdout.log", "a") as out:
            out.write("titan: compiling the train step\n")
        compiling = lambda: _value(app, "status") == "starting: titan: compiling the train step"  # noqa: E731
        await wait_until(pilot, compiling, lambda: _value(app, "status"), 10)


def _read_to_end(watcher: RunWatcher) -> RunState:
    """The state once the watcher has read the record to its end (polls until then)."""
    states = []
    for _ in range(10_000):
        update = watcher.poll()
        if update is not None and update.state is not None:
            states.append(update.state)
        if update is None or not update.unread_bytes:
            break
    assert states, "nothing read"
    return states[-1]


async def test_the_watchdog_panel_says_a_heartbeat_from_the_future_is_ahead_of_this_clock():
    from textual.app import App, ComposeResult

    from tui.widgets.stat import Stat
    from tui.widgets.watchdog_panel import WatchdogPanel

    class One(App):
        def compose(self) -> ComposeResult:
            yield WatchdogPanel()

    state = RunState()
    state.apply(parsed([event("run_start", 0.0), event("step", 1e9, step=1, loss=3.0)]))
    async with One().run_test(size=SIZE) as pilot:
        panel = pilot.app.query_one(WatchdogPanel)
        panel.show(state, now=100.0)  # the record's clock 1e9 s ahead: not "-1e9 s ago"
        await pilot.pause()
        ahead = panel.query_one("#wd-age", Stat).value
        panel.show(state, now=1e9 + 12.0)
        await pilot.pause()
        age = panel.query_one("#wd-age", Stat).value
    assert "999999900 s ahead of this clock" in ahead and "ago" not in ahead
    assert "12 s ago" in age


def test_a_resumed_attempt_shows_no_figure_of_the_attempt_before_until_its_first_step():
    state = RunState()
    state.apply(parsed([event("run_start", 0.0, total_steps=4, start_step=0)]))
    state.apply(parsed([event("step", 1.0, step=2, loss=8.39, tokens_per_s=900.0)]))
    # killed at step 2 with no checkpoint: the resume starts again at step 0
    state.apply(parsed([event("run_start", 5.0, total_steps=1, start_step=0)]))
    assert (state.step, state.loss, state.tokens_per_s) == (0, None, None)
    state.apply(parsed([event("step", 6.0, step=1, loss=8.5, tokens_per_s=1000.0)]))
    assert (state.step, state.loss, state.tokens_per_s) == (1, 8.5, 1000.0)


async def test_a_column_the_sort_arrow_left_gives_its_room_back(sample_root: Path):
    app = TitanConsole(sample_root)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _open_history(pilot)

        def widths() -> list[int]:
            return [column.get_render_width(table) for column in table.ordered_columns]

        await pilot.press("o")  # sorted by run: its heading takes the arrow
        await wait_until(pilot, lambda: table.current, lambda: "not sorted", 10)
        await pilot.pause(0.1)
        first = widths()
        for _ in range(len(first)):  # the arrow round every column, back to the run column
            await pilot.press("o")
            await wait_until(pilot, lambda: table.current, lambda: "not sorted", 10)
        await pilot.pause(0.1)
        again = widths()
    assert again == first  # no column kept the arrow's width once it moved on
