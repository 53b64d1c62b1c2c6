"""Benchmark of ``titan-console`` (CPU): first frame, CPU of monitoring a run, step latency,
ingest rate and History queries, against the targets of the console issue, in one run.

Run from the repository root: ``.venv/bin/python bench/console.py [--out FILE]``. The console
runs headless (Textual's pilot, no terminal); run records are written with the trainer's own
writer, :class:`titan.telemetry.records.RunRecord`. Writes ``bench/results/console.json``.

``--scale RUNS`` measures the console at scale instead, against :data:`SCALE_TARGETS` (open in
about a second, sort, filter, page and a monitor key in about 200 ms, an ingest of unchanged run
dirs next to nothing, no lock error), and writes ``bench/results/console-scale-<RUNS>.json``: a
runs root of RUNS runs of 8 steps (10 events each: 1M events at 100k runs) made by
:mod:`bench.synthetic_history` (real run dirs, the database filled in bulk as an ingest leaves
it) and one run of 1M steps:

- ``run_list_open_s``: from creating the console to its first screen, the run list, drawn
  (it reads the records of the :data:`tui.run_list.RECENT_RUNS` run dirs written to last;
  ``run_list_rows``);
- ``history_open_s``: History's screen in a headless app of its own, from creating the app to
  its first page drawn; then, once the ingest that follows has ended, ``history_sort_s``,
  ``history_filter_s``, ``history_page_s``: from the key to the new page drawn (medians), with
  ``history_max_loop_lag_s`` the event loop's worst delay meanwhile (a 20 ms timer running
  throughout: what the UI thread was busy for at most, drawing a page included), and
  ``history_sort_cpu_s`` and the like the process's CPU seconds for a key (all threads: on a
  shared machine the wall-clock figures also hold the time other processes had the cores);
- ``ingest_unchanged_s``: an ingest when no run dir changed (one ``stat`` each), and per run;
  ``ingest_new_run_s``: per run, for 100 new run dirs (a batch);
- ``summarize_s``: ``titan summarize`` over the runs root (a subprocess, 80 columns), printing
  ``summarize_lines`` lines (the 50 most recent runs and a line saying how many are hidden);
- ``loss_curve_1m_steps_query_s``: History's downsampled curve of the 1M-step run;
- ``monitor_curves_key_s``: the monitor's curves tab (key ``2``) drawn with 1M steps appended to
  its :class:`tui.curve.Curve`, which keeps ``monitor_curve_points`` points in
  ``monitor_curve_bytes`` (tracemalloc), with ``monitor_curves_key_cpu_s`` the CPU seconds
  (the garbage of the appends collected before the console starts);
  ``monitor_curves_key_one_step_s``: the same key with one step (the tab's first showing);
- ``summarize_lock_failures`` of ``summarize_calls`` ``titan summarize`` subprocesses (4 at once)
  while History, open on ``sample_runs/``, ingests every 50 ms.

``--real RUNS`` measures ingest and summaries on records of real size, against
:data:`REAL_TARGETS`, and writes ``bench/results/console-real-<RUNS>.json``: a runs root of RUNS
copies of the run dirs of ``sample_runs/`` (about 92 events and 55 kB each) and
:data:`LONG_RUNS` runs of :data:`LONG_STEPS` steps written with the trainer's writer (the
``run_start`` and a step of ``sample_runs/llama3-1b-h200``, renumbered):

- ``ingest_first_s``: the first ingest of that runs root (no database yet), in this process,
  with ``ingest_first_cpu_s`` its CPU seconds; ``ingest_long_run_s``: the ingest of the runs of
  10k steps added afterwards, per run;
- ``summarize_100_s``: ``titan summarize`` (a subprocess, 80 columns) over a runs root of 100
  copies of ``sample_runs/``, no database yet.

CPU figures are the process's CPU time (all threads: UI and run-dir polling) over wall time, as
a fraction of one core, each over ``IDLE_S`` or more seconds of one console session:

- ``run_list_cpu_fraction_of_core``: the console at rest on the run list, no monitor open;
- ``monitor_idle_cpu_fraction_of_core``: the monitor open on a live run that writes nothing
  (the console's own idle baseline while monitoring: polling the run dir every 0.1 s, the clock
  of the elapsed time once a second);
- ``monitor_1hz_cpu_fraction_of_core``: the same monitor while the run writes one step a second;
- ``monitor_cpu_over_idle_fraction_of_core`` (the target, <= 1 % of a core): 1 Hz minus idle,
  what following the steps costs above the monitor's idle baseline;
- ``monitor_cpu_over_run_list_fraction_of_core``: 1 Hz minus the run list, the whole cost of
  having the monitor open on that run (reported, no target).

``--flood`` measures the monitor against a run that writes faster than it can be read, against
:data:`FLOOD_TARGETS`, and writes ``bench/results/console-flood.json``. A writer process (this
script with ``--write``) appends ``step`` events to a live run's ``events.jsonl`` while a headless
console follows it on the overview tab; a key (``2`` then ``1``, the curves tab and back) is
pressed every :data:`KEY_EVERY_S` throughout:

- ``stream``: :data:`STREAM_EVENTS` events in :data:`STREAM_S` seconds, one line per write;
- ``one_write``: :data:`ONE_WRITE_EVENTS` events in a single write;
- ``follow_2hz``: two steps a second for :data:`FOLLOW_S` seconds (the CPU of following a run).

``--follow ROUNDS`` measures only ``follow_2hz``, against :data:`FOLLOW_TARGETS`, ROUNDS times
with the monitor's shipped draw interval (``tui.screens.monitor._DRAW_INTERVAL_S``) and, in
turn within the same run, ROUNDS times with :data:`BASELINE_DRAW_INTERVAL_S` (a draw at most
every 0.25 s, the interval before), and writes ``bench/results/console-follow.json``: the median
CPU fraction of each, the monitor's idle baseline, and the ratio of the two medians (the
machine is shared: only the ratio compares like with like).

Each flood case reports ``key_p50_s`` / ``key_p99_s`` (from a key press to the screen refreshed
after the tab's action; ``key_ui_cpu_p50_s`` / ``key_ui_cpu_p99_s``: the UI thread's CPU seconds
meanwhile, what the key cost apart from the time the shared machine gave the process),
``newest_step_lag_s`` (from the writer's last write to the monitor's step counter showing the
last step; None when not within :data:`FLOOD_WAIT_S`, with ``step_shown_at_timeout``),
``loop_stall_max_s`` (the event loop's worst delay of a 20 ms timer, from the first write to the
last step shown) and ``memory_growth_bytes`` (the process's peak resident memory over its
resident memory before the first write, sampled with the timer).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from textual import events  # noqa: E402
from textual.app import App  # noqa: E402

from bench import synthetic_history  # noqa: E402
from titan.checkpoint.resume import TOKENIZER_FILE  # noqa: E402
from titan.telemetry.events import RunEnd, RunStart, Step  # noqa: E402
from titan.telemetry.records import EVENTS_FILE, RunRecord, load_events  # noqa: E402
from tui.app import TitanConsole  # noqa: E402
from tui.curve import Curve  # noqa: E402
from tui.history_queries import HistoryQuery, HistoryStore  # noqa: E402
from tui.screens import history as history_screen  # noqa: E402
from tui.screens import monitor as monitor_screen  # noqa: E402
from tui.screens.history import HistoryScreen  # noqa: E402
from tui.screens.launch import LaunchScreen  # noqa: E402
from tui.screens.monitor import MonitorScreen  # noqa: E402
from tui.screens.planner import PlannerScreen  # noqa: E402
from tui.screens.runs import RunsScreen  # noqa: E402
from tui.widgets.history_table import HistoryTable  # noqa: E402
from tui.widgets.run_table import RunTable  # noqa: E402
from tui.widgets.stat import Stat  # noqa: E402

SIZE = (120, 40)
TARGETS = {
    "first_frame_s": 1.0,
    "monitor_cpu_over_idle_fraction_of_core": 0.01,
    "step_latency_p95_s": 0.25,
    "ingest_events_per_s": 10_000,
    "history_rows_query_s": 0.2,
    "loss_curve_query_s": 0.2,
}
IDLE_S = 10.0
LATENCY_STEPS = 20
# The burst is offered at twice the ingest target, so that the figure is what the console
# keeps up with, not the pace of the writer.
BURST_EVENTS, BURST_RATE = 100_000, 20_000
DB_RUNS, DB_STEPS = 1000, 1000
SCALE_TARGETS = {
    "run_list_open_s": 1.0,
    "history_open_s": 1.0,
    "history_sort_s": 0.2,
    "history_filter_s": 0.2,
    "history_page_s": 0.2,
    "ingest_unchanged_per_run_s": 1e-4,
    "loss_curve_1m_steps_query_s": 0.2,
    "monitor_curves_key_s": 0.2,
    "summarize_lock_failures": 0,
}
CURVE_STEPS, SUMMARIZE_CALLS, NEW_RUNS = 1_000_000, 100, 100
FLOOD_TARGETS = {
    "stream_newest_step_lag_s": 1.0,
    "stream_key_p99_s": 0.2,
    "stream_memory_growth_bytes": 50e6,
    "one_write_loop_stall_max_s": 0.2,
    "one_write_memory_growth_bytes": 100e6,
    "follow_2hz_cpu_fraction_of_core": 0.015,
}
STREAM_EVENTS, STREAM_S, ONE_WRITE_EVENTS = 50_000, 5.0, 500_000
FOLLOW_S, KEY_EVERY_S, FLOOD_WAIT_S = 20.0, 0.25, 60.0
FOLLOW_TARGETS = {"follow_2hz_cpu_fraction_of_core": 0.015}
BASELINE_DRAW_INTERVAL_S = 0.25
REAL_TARGETS = {"ingest_first_s": 10.0, "summarize_100_s": 3.0}
LONG_RUNS, LONG_STEPS, SUMMARIZE_RUNS = 2, 10_000, 100
SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"
# The machine is shared: its 1-minute load average when the benchmark starts, recorded with
# the figures.
# --forms: each form opens (its first field shown and focused) within 300 ms of its key.
FORMS_TARGETS = {f"{form}_open_s": 0.3 for form in ("launch", "planner", "resume")}
FORM_ROUNDS = 3
LOAD_AT_START = os.getloadavg()[0]


def _start(record: RunRecord, total_steps: int) -> None:
    record.emit(RunStart(config={"preset": "tiny", "layout": "spmd"}, total_steps=total_steps))


def _step(record: RunRecord, step: int) -> None:
    record.emit(
        Step(
            step=step,
            loss=10.0 / step,
            lr=1e-3,
            tokens=2048,
            tokens_per_s=2e3,
            step_time_s=1.0,
            tokens_seen=2048 * step,
        )
    )


class _Drawn:
    """Records, for each step drawn by the monitor, the delay from the event's time."""

    def __init__(self, screen: MonitorScreen) -> None:
        self.latencies: list[float] = []
        self._last = 0
        draw = screen._show_state

        def timed() -> None:
            draw()
            state = screen.state
            if state.step != self._last and state.last_event_at is not None:
                self._last = state.step
                self.latencies.append(time.time() - state.last_event_at)

        screen._show_state = timed


async def _first_frame(root: Path) -> tuple[float, int]:
    """Seconds from creating the app to the run list of ``root`` drawn, and its rows (polled
    with :func:`_until`: the pilot's pause makes every widget process a message, work that
    competed with the listing's worker and that no terminal asks for)."""
    start = time.perf_counter()
    app = TitanConsole(root)
    async with app.run_test(size=SIZE):
        table = app.screen.query_one(RunTable)
        await _until(lambda: table.row_count > 0)
        return time.perf_counter() - start, table.row_count


async def _cpu_while(pilot, seconds: float) -> float:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await pilot.pause(seconds)
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


async def _monitor(root: Path) -> dict:
    run_dir = root / "live-run"
    run_dir.mkdir()
    record = RunRecord(run_dir, run_dir.name)
    _start(record, 10_000_000)
    app = TitanConsole(root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(1.0)
        run_list = await _cpu_while(pilot, IDLE_S)
        screen = MonitorScreen(run_dir)
        await app.push_screen(screen)
        await pilot.pause(1.0)
        drawn = _Drawn(screen)
        idle = await _cpu_while(pilot, IDLE_S)  # the monitor's baseline: no new event

        stop = threading.Event()

        def one_hertz() -> None:
            step = 0
            while not stop.wait(1.0):
                step += 1
                _step(record, step)

        writer = threading.Thread(target=one_hertz)
        writer.start()
        busy = await _cpu_while(pilot, max(IDLE_S, LATENCY_STEPS + 0.5))
        stop.set()
        writer.join()
        latencies = sorted(drawn.latencies)

        # Burst: BURST_RATE events/s; input lag measured as event-loop delay of a 20 ms timer.
        first = screen.state.step + 1
        lags: list[float] = []

        def burst() -> None:
            for i in range(BURST_EVENTS):
                _step(record, first + i)
                if i % 1000 == 999:
                    time.sleep(max(0.0, (i + 1) / BURST_RATE - (time.perf_counter() - t0)))

        t0 = time.perf_counter()
        writer = threading.Thread(target=burst)
        writer.start()
        while screen.state.step < first + BURST_EVENTS - 1:
            before = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - before - 0.02)
        ingest_s = time.perf_counter() - t0
        writer.join()
    record.close()
    return {
        "run_list_cpu_fraction_of_core": run_list,
        "monitor_idle_cpu_fraction_of_core": idle,
        "monitor_1hz_cpu_fraction_of_core": busy,
        "monitor_cpu_over_idle_fraction_of_core": busy - idle,
        "monitor_cpu_over_run_list_fraction_of_core": busy - run_list,
        "step_latency_p50_s": statistics.median(latencies),
        "step_latency_p95_s": latencies[int(0.95 * (len(latencies) - 1))],
        "latency_samples": len(latencies),
        "ingest_events_per_s": BURST_EVENTS / ingest_s,
        "ingest_max_loop_lag_s": max(lags),
        "ingest_p95_loop_lag_s": sorted(lags)[int(0.95 * (len(lags) - 1))],
    }


def _database(root: Path) -> dict:
    t0 = time.perf_counter()
    for r in range(DB_RUNS):
        run_dir = root / f"run-{r:04d}"
        run_dir.mkdir(parents=True)
        record = RunRecord(run_dir, run_dir.name)
        _start(record, DB_STEPS)
        for step in range(1, DB_STEPS + 1):
            _step(record, step)
        record.emit(RunEnd(status="completed", step=DB_STEPS))
        record.close()
    write_s = time.perf_counter() - t0
    store = HistoryStore(root)
    t0 = time.perf_counter()
    report = store.ingest()
    ingest_s = time.perf_counter() - t0
    rows_s, curve_s = [], []
    for i in range(5):
        t0 = time.perf_counter()
        rows = store.page(HistoryQuery(limit=DB_RUNS)).rows
        rows_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        curve = store.loss_curve(f"run-{i * 97:04d}")
        curve_s.append(time.perf_counter() - t0)
    return {
        "db_runs": len(rows),
        "db_events": report.events,
        "db_write_records_s": write_s,
        "db_ingest_s": ingest_s,
        "history_rows_query_s": statistics.median(rows_s),
        "loss_curve_query_s": statistics.median(curve_s),
        "loss_curve_points": len(curve),
    }


class _HistoryApp(App[None]):
    """History's screen on its own, over ``store``."""

    ascii_only = False

    def __init__(self, store: HistoryStore) -> None:
        super().__init__()
        self.store = store

    def on_mount(self) -> None:
        self.push_screen(HistoryScreen(self.store))


async def _until(condition) -> float:
    """Seconds until ``condition()`` holds (checked every 5 ms)."""
    start = time.perf_counter()
    while not condition():
        await asyncio.sleep(0.005)
        if time.perf_counter() - start > 120:
            raise RuntimeError("the console did not answer in 120 s")
    return time.perf_counter() - start


async def _loop_lags(lags: list[float]) -> None:
    """Record the event loop's delay of a 20 ms sleep, until cancelled."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(0.02)
        lags.append(time.perf_counter() - before - 0.02)


async def _history_at_scale(root: Path) -> dict:
    start = time.perf_counter()
    app = _HistoryApp(HistoryStore(root))
    async with app.run_test(size=SIZE) as pilot:
        while not isinstance(app.screen, HistoryScreen):
            await pilot.pause(0.001)
        screen = app.screen
        table = screen.query_one(HistoryTable)
        shown = lambda: table.current and table.row_count > 0 and screen.loaded  # noqa: E731
        await _until(shown)
        opened = time.perf_counter() - start
        await _until(lambda: screen._next_ingest_at > 0)  # the ingest after the first page
        lags: list[float] = []
        sampler = asyncio.create_task(_loop_lags(lags))
        times: dict[str, list[float]] = {"sort": [], "filter": [], "page": []}
        cpu: dict[str, list[float]] = {kind: [] for kind in times}
        for keys, kind in [
            ("o", "sort"),
            ("O", "sort"),
            ("o", "sort"),
            ("O", "sort"),
            ("o", "sort"),
            ("right_square_bracket", "page"),
            ("right_square_bracket", "page"),
            ("left_square_bracket", "page"),
        ]:
            start, cpu_start = time.perf_counter(), time.process_time()
            await pilot.press(keys)
            times[kind].append(time.perf_counter() - start + await _until(shown))
            cpu[kind].append(time.process_time() - cpu_start)
        for text in ("run-0001", "llama3", "failed", "run-00042"):
            await pilot.press("slash", *text)
            start, cpu_start = time.perf_counter(), time.process_time()
            await pilot.press("enter")
            times["filter"].append(time.perf_counter() - start + await _until(shown))
            cpu["filter"].append(time.process_time() - cpu_start)
            await pilot.press("slash", "escape")
            await _until(shown)
        sampler.cancel()
    return {
        "history_open_s": opened,
        **{f"history_{k}_s": statistics.median(v) for k, v in times.items()},
        **{f"history_{k}_cpu_s": statistics.median(v) for k, v in cpu.items()},
        "history_max_loop_lag_s": max(lags),
    }


async def _key_time(pilot, key: str) -> tuple[float, float]:
    """Seconds from pressing ``key`` to the app idle again with the result drawn, and the
    process's CPU seconds meanwhile."""
    start, cpu_start = time.perf_counter(), time.process_time()
    await pilot.press(key)
    await pilot.pause(0)
    return time.perf_counter() - start, time.process_time() - cpu_start


async def _curves_key(root: Path) -> dict:
    """The monitor's curves tab with CURVE_STEPS steps in its curve."""
    run_dir = root / "curve-run"
    run_dir.mkdir()
    record = RunRecord(run_dir, run_dir.name)
    _start(record, CURVE_STEPS)
    _step(record, 1)
    record.close()
    tracemalloc.start()
    curve = Curve()
    start = time.perf_counter()
    for step in range(1, CURVE_STEPS + 1):
        curve.append(step, 10.0 / step + (step % 1000 == 0), 1e-3)
    append_s = time.perf_counter() - start
    curve_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # The million appends in a row leave the collector a full collection due (65-80 ms here
    # after the DuckDB work above), which would land in one of the keys below; a monitor that
    # followed a run for hours paid it along the way.
    gc.collect()
    app = TitanConsole(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run_dir)
        await app.push_screen(screen)
        while not screen.state.curve.count:
            await pilot.pause(0.05)
        key_small_s, _ = await _key_time(pilot, "2")  # one step: what the tab switch costs
        await pilot.press("1")
        screen.state.curve = curve
        key_s, key_cpu_s = await _key_time(pilot, "2")
        drawn = len(screen.query_one("#loss-plot").series[0][1])
    return {
        "monitor_curve_append_1m_steps_s": append_s,
        "monitor_curves_key_s": key_s,
        "monitor_curves_key_cpu_s": key_cpu_s,
        "monitor_curves_key_one_step_s": key_small_s,
        "monitor_curve_points": drawn,
        "monitor_curve_bytes": curve_bytes,
    }


async def _lock(samples: Path) -> dict:
    """SUMMARIZE_CALLS ``titan summarize`` subprocesses while History ingests every 50 ms."""
    history_screen.REFRESH_INTERVAL_S = 0.05
    history_screen.INGEST_SPACING = 0.0
    argv = [sys.executable, "-m", "titan.cli", "summarize", "--json", str(samples)]
    app = TitanConsole(samples)
    failures = 0
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        table = app.screen.query_one(HistoryTable)
        while table.row_count == 0:
            await pilot.pause(0.05)
        for _ in range(SUMMARIZE_CALLS // 4):
            procs = [
                await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
                )
                for _ in range(4)
            ]
            failures += sum([await p.wait() != 0 for p in procs])
    return {"summarize_calls": SUMMARIZE_CALLS, "summarize_lock_failures": failures}


def _scale(root: Path, runs: int) -> dict:
    start = time.perf_counter()
    synthetic_history.synthesize(root / "big", runs, steps=8)
    made_s = time.perf_counter() - start
    store = HistoryStore(root / "big")
    with store._connection() as con:
        events = con.execute("SELECT count(*) FROM events").fetchone()[0]
    start = time.perf_counter()
    store.ingest()
    unchanged_s = time.perf_counter() - start
    run_list_s, run_list_rows = asyncio.run(_first_frame(root / "big"))
    history = asyncio.run(_history_at_scale(root / "big"))
    start = time.perf_counter()
    summary = subprocess.run(
        [sys.executable, "-m", "titan.cli", "summarize", str(root / "big")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    summarize_s = time.perf_counter() - start
    synthetic_history.write_runs(root / "big", runs, NEW_RUNS, 8)
    start = time.perf_counter()
    store.ingest()
    new_s = (time.perf_counter() - start) / NEW_RUNS
    synthetic_history.write_runs(root / "curve", 0, 1, CURVE_STEPS)
    synthetic_history.ingest_in_bulk(root / "curve", 0, 1)
    curve_store = HistoryStore(root / "curve")
    curve_s = []
    for _ in range(5):
        start = time.perf_counter()
        curve = curve_store.loss_curve(synthetic_history.run_id(0))
        curve_s.append(time.perf_counter() - start)
    (root / "monitor").mkdir()
    monitor = asyncio.run(_curves_key(root / "monitor"))
    shutil.copytree(Path(__file__).resolve().parents[1] / "sample_runs", root / "samples")
    lock = asyncio.run(_lock(root / "samples"))
    return {
        "runs": runs,
        "events": events,
        "synthesize_s": made_s,
        "run_list_open_s": run_list_s,
        "run_list_rows": run_list_rows,
        **history,
        "ingest_unchanged_s": unchanged_s,
        "ingest_unchanged_per_run_s": unchanged_s / runs,
        "ingest_new_run_s": new_s,
        "summarize_s": summarize_s,
        "summarize_lines": len(summary.stdout.splitlines()),
        "loss_curve_1m_steps_query_s": statistics.median(curve_s),
        "loss_curve_points": len(curve),
        **monitor,
        **lock,
    }


def _write(run_dir: Path, events: int, seconds: float) -> None:
    """The flood writer (``--write``): ``events`` step lines (as :func:`_step` writes them)
    appended to ``run_dir``'s record, one write each spread evenly over ``seconds``, or all in
    one write when ``seconds`` is 0; prints the unix time of the last write."""
    template = Step(step=1, loss=1.0, lr=1e-3, tokens=2048, tokens_per_s=2e3, step_time_s=1.0)
    fields = {**template.to_json(), "run_id": run_dir.name}

    def line(step: int) -> bytes:
        values = {"step": step, "loss": 10.0 / step, "tokens_seen": 2048 * step}
        return (json.dumps({**fields, **values, "time": time.time()}) + "\n").encode()

    fd = os.open(run_dir / EVENTS_FILE, os.O_WRONLY | os.O_APPEND)
    blob = memoryview(b"".join(line(step) for step in range(1, events + 1)) if not seconds else b"")
    print("writing", flush=True)
    if seconds == 0:
        while blob:
            blob = blob[os.write(fd, blob) :]
    else:
        start = time.perf_counter()
        for step in range(1, events + 1):
            os.write(fd, line(step))
            if step % 100 == 0:
                time.sleep(max(0.0, step * seconds / events - (time.perf_counter() - start)))
    os.close(fd)
    print(time.time(), flush=True)


def _when_shown(stat: Stat, text: str) -> list[float]:
    """A list that gets the unix time at which ``stat`` first shows a value starting with
    ``text`` (its ``show`` wrapped: the draw itself, not when a poll of the bench sees it)."""
    shown_at: list[float] = []
    show = stat.show

    def timed(value: str, *args, **kwargs) -> None:
        show(value, *args, **kwargs)
        if not shown_at and value.startswith(text):
            shown_at.append(time.time())

    stat.show = timed
    return shown_at


def _rss_bytes() -> int:
    """This process's resident memory, bytes (``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _KeyClock:
    """Presses tab keys as a terminal would (through the driver) and times each, from the key
    sent to the screen refreshed after the monitor's ``show_tab`` action ran."""

    def __init__(self, app: TitanConsole, screen: MonitorScreen) -> None:
        self.seconds: list[float] = []
        self.ui_cpu_s: list[float] = []
        self._app = app
        self._drawn = asyncio.Event()
        action = screen.action_show_tab

        def timed(tab: str) -> None:
            action(tab)
            screen.call_after_refresh(self._drawn.set)

        screen.action_show_tab = timed

    async def press(self, key: str) -> None:
        self._drawn.clear()
        event = events.Key(key, key)
        event.set_sender(self._app)
        start, cpu_start = time.perf_counter(), time.thread_time()
        self._app._driver.send_message(event)
        await asyncio.wait_for(self._drawn.wait(), FLOOD_WAIT_S)
        self.seconds.append(time.perf_counter() - start)
        self.ui_cpu_s.append(time.thread_time() - cpu_start)


async def _flood_samples(lags: list[float], rss: list[int]) -> None:
    """The event loop's delay of a 20 ms sleep and the resident memory, until cancelled."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(0.02)
        lags.append(time.perf_counter() - before - 0.02)
        rss.append(_rss_bytes())


def _percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank); None when empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


async def _flood(root: Path, events: int, seconds: float) -> dict:
    """A monitor following a run while the writer appends ``events`` steps in ``seconds``
    (``root``: a runs root of its own; the run list under the monitor reads its records)."""
    run_dir = root / f"flood-{events}-{seconds:g}"
    run_dir.mkdir(parents=True)
    record = RunRecord(run_dir, run_dir.name)
    _start(record, events)
    record.close()
    app = TitanConsole(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run_dir)
        await app.push_screen(screen)
        step = screen.query_one("#step", Stat)
        await _until(lambda: step.value.startswith("0 / "))
        await pilot.pause(0.5)
        keys = _KeyClock(app, screen)
        argv = [sys.executable, __file__, "--write", str(run_dir), str(events), str(seconds)]
        writer = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        gc.collect()
        rss_before = _rss_bytes()
        await writer.stdout.readline()  # it starts writing
        lags: list[float] = []
        rss: list[int] = []
        sampler = asyncio.create_task(_flood_samples(lags, rss))
        shown_at = _when_shown(step, f"{events} / {events}")
        stopped_at, tab = None, "1"
        while not shown_at:
            if stopped_at is None and writer.returncode is not None:
                stopped_at = float((await writer.stdout.read()).decode())
            elif stopped_at is not None and time.time() - stopped_at > FLOOD_WAIT_S:
                break
            # Tabs 2 and 1 while the writer writes, then the overview, where the step is shown.
            tab = "1" if stopped_at is not None or tab == "2" else "2"
            await keys.press(tab)
            pressed = time.perf_counter()
            while time.perf_counter() - pressed < KEY_EVERY_S and not shown_at:
                await asyncio.sleep(0.005)
        sampler.cancel()
        shown = step.value
        if stopped_at is None:  # shown before the writer's exit was seen
            stopped_at = float((await writer.stdout.read()).decode())
    return {
        "events": events,
        "write_s": seconds,
        "key_p50_s": _percentile(keys.seconds, 0.5),
        "key_p99_s": _percentile(keys.seconds, 0.99),
        "keys": len(keys.seconds),
        "key_ui_cpu_p50_s": _percentile(keys.ui_cpu_s, 0.5),
        "key_ui_cpu_p99_s": _percentile(keys.ui_cpu_s, 0.99),
        "newest_step_lag_s": shown_at[0] - stopped_at if shown_at else None,
        "step_shown_at_timeout": None if shown_at else shown,
        "loop_stall_max_s": max(lags),
        "memory_growth_bytes": max(rss) - rss_before,
    }


async def _follow_2hz(root: Path) -> dict:
    """The CPU of a monitor following a run that writes two steps a second (RunRecord, the
    trainer's writer, in a thread of this process: its share is measured apart and removed)."""
    run_dir = root / "follow-2hz"
    run_dir.mkdir(parents=True)
    record = RunRecord(run_dir, run_dir.name)
    _start(record, 1_000_000)
    app = TitanConsole(root)
    async with app.run_test(size=SIZE) as pilot:
        screen = MonitorScreen(run_dir)
        await app.push_screen(screen)
        await pilot.pause(1.0)
        idle = await _cpu_while(pilot, IDLE_S)
        stop = threading.Event()
        writer_cpu: list[float] = []

        def two_hertz() -> None:
            step, cpu = 0, 0.0
            while not stop.wait(0.5):
                step += 1
                start = time.thread_time()
                _step(record, step)
                cpu += time.thread_time() - start
            writer_cpu.append(cpu)

        writer = threading.Thread(target=two_hertz)
        writer.start()
        await pilot.pause(1.0)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(FOLLOW_S)
        stop.set()
        writer.join()
        cpu = time.process_time() - cpu0 - writer_cpu[0]
        wall = time.perf_counter() - wall0
        steps = screen.query_one("#step", Stat).value
    record.close()
    return {
        "follow_2hz_cpu_fraction_of_core": cpu / wall,
        "follow_2hz_idle_cpu_fraction_of_core": idle,
        "follow_2hz_over_idle_fraction_of_core": cpu / wall - idle,
        "follow_2hz_step_shown": steps,
    }


def _follows(root: Path, rounds: int) -> dict:
    """``follow_2hz`` ROUNDS times at the shipped draw interval and at the baseline's, in
    turn; medians of each and their ratio."""
    shipped = monitor_screen._DRAW_INTERVAL_S
    runs: dict[float, list[dict]] = {shipped: [], BASELINE_DRAW_INTERVAL_S: []}
    for i in range(rounds):
        for interval, results in runs.items():
            monitor_screen._DRAW_INTERVAL_S = interval
            results.append(asyncio.run(_follow_2hz(root / f"{interval}-{i}")))
    monitor_screen._DRAW_INTERVAL_S = shipped

    def median(interval: float, key: str) -> float:
        return statistics.median(r[key] for r in runs[interval])

    cpu, idle = "follow_2hz_cpu_fraction_of_core", "follow_2hz_idle_cpu_fraction_of_core"
    return {
        "draw_interval_s": shipped,
        cpu: median(shipped, cpu),
        idle: median(shipped, idle),
        "baseline_draw_interval_s": BASELINE_DRAW_INTERVAL_S,
        f"baseline_{cpu}": median(BASELINE_DRAW_INTERVAL_S, cpu),
        "cpu_ratio_over_baseline": median(shipped, cpu) / median(BASELINE_DRAW_INTERVAL_S, cpu),
        "rounds": rounds,
        "follow_2hz_step_shown": runs[shipped][-1]["follow_2hz_step_shown"],
    }


def _floods(root: Path) -> dict:
    stream = asyncio.run(_flood(root / "stream", STREAM_EVENTS, STREAM_S))
    one_write = asyncio.run(_flood(root / "one-write", ONE_WRITE_EVENTS, 0.0))
    follow = asyncio.run(_follow_2hz(root / "follow"))
    return {
        **{f"stream_{k}": v for k, v in stream.items()},
        **{f"one_write_{k}": v for k, v in one_write.items()},
        **follow,
    }


def _copy_samples(root: Path, runs: int) -> int:
    """``runs`` copies of the run dirs of ``sample_runs/`` in ``root``; returns their events."""
    samples = sorted(p.parent for p in SAMPLE_RUNS.glob("*/events.jsonl"))
    for i in range(runs):
        shutil.copytree(samples[i % len(samples)], root / f"{samples[i % len(samples)].name}-{i}")
    return sum(len(p.read_bytes().splitlines()) for p in root.glob("*/events.jsonl"))


def _real(root: Path, runs: int) -> dict:
    events = _copy_samples(root / "copies", runs)
    store = HistoryStore(root / "copies")
    start, cpu = time.perf_counter(), time.process_time()
    store.ingest()
    first_s, first_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    sample = load_events(SAMPLE_RUNS / "llama3-1b-h200")
    run_start = next(e for e in sample if isinstance(e, RunStart))
    step = next(e for e in sample if isinstance(e, Step))  # a real step's fields, renumbered
    for n in range(LONG_RUNS):
        (root / "copies" / f"long-{n}").mkdir()
        record = RunRecord(root / "copies" / f"long-{n}", f"long-{n}")
        record.emit(dataclasses.replace(run_start, total_steps=LONG_STEPS))
        for i in range(1, LONG_STEPS + 1):
            record.emit(dataclasses.replace(step, step=i, tokens_seen=(step.tokens or 0) * i))
        record.emit(RunEnd(status="completed", step=LONG_STEPS))
        record.close()
    start = time.perf_counter()
    store.ingest()
    long_s = (time.perf_counter() - start) / LONG_RUNS
    _copy_samples(root / "hundred", SUMMARIZE_RUNS)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "titan.cli", "summarize", str(root / "hundred")],
        capture_output=True,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    return {
        "runs": runs,
        "events": events,
        "ingest_first_s": first_s,
        "ingest_first_cpu_s": first_cpu_s,
        "ingest_long_run_s": long_s,
        "summarize_100_s": time.perf_counter() - start,
    }


async def _form_times(samples: Path) -> dict[str, list[float]]:
    """Per form, the seconds from its key to its first field focused (``open``) and to every
    row mounted (``filled``; the launch form's rows come in parts, :mod:`tui.widgets.option_input`),
    over :data:`FORM_ROUNDS` rounds, each from the run list (``R``: from the monitor of a
    sample run)."""
    times: dict[str, list[float]] = {}
    for run_dir in samples.iterdir():  # a tokenizer file, as a real run has: R resumes it
        (run_dir / TOKENIZER_FILE).touch()
    app = TitanConsole(samples)
    async with app.run_test(size=SIZE) as pilot:
        await _until(lambda: app.screen.query_one(RunTable).row_count > 0)
        for _ in range(FORM_ROUNDS):
            for form, keys in (("launch", ["n"]), ("planner", ["p"]), ("resume", ["enter", "R"])):
                for key in keys[:-1]:
                    await pilot.press(key)
                await _until(lambda: isinstance(app.screen, (RunsScreen, MonitorScreen)))
                await pilot.pause(0.5)
                start = time.perf_counter()
                app.post_message(events.Key(keys[-1], keys[-1] if len(keys[-1]) == 1 else None))
                kind = PlannerScreen if form == "planner" else LaunchScreen
                opened = await _until(lambda k=kind: isinstance(app.screen, k) and app.focused)
                await _until(
                    lambda k=kind: isinstance(app.screen, k) and getattr(app.screen, "filled", True)
                )
                filled = time.perf_counter() - start
                times.setdefault(f"{form}_open_s", []).append(opened)
                times.setdefault(f"{form}_filled_s", []).append(filled)
                while len(app.screen_stack) > 1:
                    app.pop_screen()
                await pilot.pause(0.3)
    return times


def _forms(samples: Path, load: int) -> dict:
    """:func:`_form_times` with ``load`` processes spinning on the CPU meanwhile (medians)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        time.sleep(1 if load else 0)
        times = asyncio.run(_form_times(samples))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    figures: dict = {name: statistics.median(values) for name, values in times.items()}
    figures["spinning_processes"] = load
    return figures


def _result(figures: dict, targets: dict) -> dict:
    higher = {"ingest_events_per_s"}
    return {
        "command": shlex.join(["python", "bench/console.py", *sys.argv[1:]]),
        "figures": figures,
        "targets": targets,
        "met": {
            key: figures[key] is not None
            and (figures[key] >= target if key in higher else figures[key] <= target)
            for key, target in targets.items()
        },
        "machine": f"CPU, 2 cores shared (load average {LOAD_AT_START:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end), headless Textual",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--scale", type=int, default=None, metavar="RUNS", help="History at scale")
    parser.add_argument("--flood", action="store_true", help="the monitor against floods of events")
    parser.add_argument("--write", nargs=3, help=argparse.SUPPRESS)  # the flood's writer process
    parser.add_argument(
        "--follow",
        type=int,
        default=None,
        metavar="ROUNDS",
        help="the CPU of following a run at 2 steps/s, against the earlier draw interval",
    )
    parser.add_argument(
        "--real", type=int, default=None, metavar="RUNS", help="ingest of RUNS copied sample runs"
    )
    parser.add_argument(
        "--forms",
        type=int,
        default=None,
        metavar="SPINNERS",
        help="time each form takes to open, with SPINNERS processes spinning on the CPU",
    )
    args = parser.parse_args()
    if args.write:
        _write(Path(args.write[0]), int(args.write[1]), float(args.write[2]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.forms is not None:
            shutil.copytree(Path(__file__).resolve().parents[1] / "sample_runs", root / "samples")
            result = _result(_forms(root / "samples", args.forms), FORMS_TARGETS)
            out = args.out or Path(f"bench/results/console-forms-{args.forms}.json")
        elif args.flood:
            result = _result(_floods(root), FLOOD_TARGETS)
            out = args.out or Path("bench/results/console-flood.json")
        elif args.follow:
            result = _result(_follows(root, args.follow), FOLLOW_TARGETS)
            out = args.out or Path("bench/results/console-follow.json")
        elif args.real:
            (root / "copies").mkdir()
            (root / "hundred").mkdir()
            result = _result(_real(root, args.real), REAL_TARGETS)
            out = args.out or Path(f"bench/results/console-real-{args.real}.json")
        elif args.scale:
            result = _result(_scale(root, args.scale), SCALE_TARGETS)
            out = args.out or Path(f"bench/results/console-scale-{args.scale}.json")
        else:
            db = _database(root / "db")
            shutil.copytree(Path(__file__).resolve().parents[1] / "sample_runs", root / "samples")
            first_frame, _ = asyncio.run(_first_frame(root / "samples"))
            (root / "live").mkdir()
            live = asyncio.run(_monitor(root / "live"))
            result = _result({"first_frame_s": first_frame, **live, **db}, TARGETS)
            out = args.out or Path("bench/results/console.json")
        # Written before the runs root is removed (minutes for 100k run dirs on a busy disk).
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
