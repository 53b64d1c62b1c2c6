"""Ingest of run records into DuckDB and the per-run summaries of ``titan summarize``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import file_tree, run_in_process, small_run
from records import crash_then_resume, read_only, titan, write_run
from samples import copy_sample_runs, sample_run_dirs

from titan.analysis import summarize
from titan.analysis.ettr import analyze
from titan.analysis.report import summary_rows
from titan.cli import main
from titan.errors import TitanError
from titan.exit_codes import EXIT_NONFINITE
from titan.telemetry.events import RunEnd, RunStart, Step, parse_event, parse_events
from titan.telemetry.heartbeat import ProcessId
from titan.telemetry.records import EVENTS_FILE, RunRecord


def event_count(con, run_id: str) -> int:
    return con.execute("SELECT count(*) FROM events WHERE run_id = ?", [run_id]).fetchone()[0]


def test_summary_of_a_crash_and_resume_run(tmp_path):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "step":
            e.update(tokens=100, tokens_seen=100 * e["step"], tokens_per_s=100 / e["step_time_s"])
            e.update(energy_j=50.0, mfu={"causal": 0.1 * e["step"], "full": 0.2})
    write_run(tmp_path, "run-a", events)
    [s] = summarize.summarize(tmp_path)
    assert (s.run_id, s.status, s.steps, s.tokens) == ("run-a", "completed", 6, 600)
    assert s.wall_s == pytest.approx(112.5)
    assert s.ettr == pytest.approx(6.0 / 29.0)
    assert s.badput["lost_progress"] == pytest.approx(1.75 / 29.0)
    assert (s.restarts, s.stalls) == (1, 1)
    assert (s.final_loss, s.best_loss) == (3.1, 3.1)
    # 8 step events: tokens/s 100, 100, 66.7, 100 | 100, 100, 71.4, 100 -> median 100.
    assert s.median_tokens_per_s == pytest.approx(100.0)
    # MFU causal of steps 1, 2, 3, 4, 3, 4, 5, 6 (x 0.1): median 0.35.
    assert (s.median_mfu, s.mfu_convention) == (pytest.approx(0.35), "causal")
    assert s.energy_j == 400.0 and s.tokens_per_j == pytest.approx(2.0)


def _with_tokens_seen(events: list[dict]) -> list[dict]:
    for e in events:
        if e["type"] == "step":
            e.update(tokens_seen=100 * e["step"])
    return events


@pytest.mark.parametrize(
    "events, expected",
    [
        # Attempt 0 ran steps 1-4 (loss 3.4 at step 4); attempt 1 resumed from step 2 and, so
        # far, redid step 3 (loss 3.6): steps 1, 2 and the new 3 survive.
        (crash_then_resume()[:11], (3, 300, 3.6, 3.6)),
        # Attempt 1 restored step 2, compiled and failed before a step: the run stands at step
        # 2, with step 2's loss (4.0) its last, as ETTR counts it.
        (
            crash_then_resume()[:10]
            + [{"type": "run_end", "time": 1108.5, "status": "failed", "step": None}],
            (2, 200, 4.0, 4.0),
        ),
    ],
    ids=["redone-in-part", "not-stepped-yet"],
)
def test_steps_a_resume_threw_away_are_not_counted_until_redone(tmp_path, events, expected):
    write_run(tmp_path, "resumed", _with_tokens_seen(events))
    [s] = summarize.summarize(tmp_path)
    assert (s.steps, s.tokens, s.final_loss, s.best_loss) == expected


def test_a_run_found_dead_at_once_counts_its_steps_past_the_checkpoint_as_lost(tmp_path):
    # Attempt 0 of crash_then_resume (checkpoint at step 2, steps 3 and 4 after it), its last
    # event 10 s ago, its process gone: dead now, not once ettr's running window has passed.
    events = crash_then_resume()[:8]
    shift = time.time() - 10 - events[-1]["time"]
    for e in events:
        e["time"] += shift
    gone = subprocess.Popen(["true"])
    gone.wait()
    events[0]["process"] = ProcessId(ProcessId.current().host, gone.pid, 0, 1.0).as_dict()
    write_run(tmp_path, "killed", events)
    [s] = summarize.summarize(tmp_path)
    assert s.status == "dead"
    assert s.badput["lost_progress"] == pytest.approx(1.75 / 16.5)  # steps 3, 4: compute time


def test_missing_mfu_and_energy_are_none_and_shown_as_unknown(tmp_path, capsys):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "run_start":
            e["power"] = {"source": None, "available": False, "reason": "no NVML, no RAPL"}
    events[-3].update(mfu=None, mfu_reason="no peak for cpu")
    write_run(tmp_path, "run-b", events)
    assert main(["summarize", str(tmp_path), "--wide"]) == 0  # every column, at any width
    out = capsys.readouterr().out
    assert "unknown" in out and "unavailable" in out and "run-b" in out
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["median_mfu"] is None and row["energy_j"] is None and row["restarts"] == 1
    assert (row["mfu_reason"], row["energy_reason"]) == ("no peak for cpu", "no NVML, no RAPL")


def test_torn_last_line_waits_for_the_next_ingest(tmp_path):
    events = crash_then_resume()
    complete = "".join(json.dumps({**e, "run_id": "torn"}) + "\n" for e in events)
    torn = json.dumps({**events[-1], "type": "late", "run_id": "torn"})
    path = write_run(tmp_path, "torn", events, tail=torn[:20])
    con = summarize.connect(tmp_path)
    report = summarize.ingest(con, tmp_path)
    assert report.events == len(events) and report.bad_lines == 0
    path.write_text(complete + torn + "\n")
    assert summarize.ingest(con, tmp_path).events == 1
    assert event_count(con, "torn") == len(events) + 1
    seqs = con.execute("SELECT list(seq ORDER BY seq) FROM events").fetchone()[0]
    assert seqs == list(range(len(events) + 1))
    assert summarize.ingest(con, tmp_path).events == 0


def test_a_run_summarised_a_moment_ago_waits_its_turn_then_is_read_whole(tmp_path, monkeypatch):
    events = crash_then_resume()
    path = write_run(tmp_path, "live", events[:-1])
    ended = json.dumps({**events[-1], "run_id": "live"}) + "\n"
    con = summarize.connect(tmp_path)
    summarize.ingest(con, tmp_path)
    [before] = summarize.summaries(con)
    # A summary costing an hour per byte: the run is not summarised again within the process.
    monkeypatch.setattr(summarize, "SUMMARY_S_PER_BYTE", 3600.0)
    with path.open("a") as f:
        f.write(ended)
    waited = summarize.ingest(con, tmp_path)
    [meanwhile] = summarize.summaries(con)
    monkeypatch.setattr(summarize, "REFRESH_THROTTLE", 0)
    caught_up = summarize.ingest(con, tmp_path)
    [after] = summarize.summaries(con)
    con.close()
    assert (waited.deferred, waited.events, caught_up.deferred, caught_up.events) == (
        ("live",),
        0,
        (),
        1,
    )
    assert before.status == meanwhile.status != after.status == "completed"
    assert event_count(summarize.connect(tmp_path), "live") == len(events)


def test_new_fields_types_and_bad_lines_are_kept_or_counted(tmp_path):
    events = crash_then_resume()
    events[2] = {**events[2], "schema": 2, "novel": {"nested": [1, 2]}, "loss": float("nan")}
    write_run(tmp_path, "new", events, tail="{not json\n[1, 2]\n")
    con = summarize.connect(tmp_path)
    report = summarize.ingest(con, tmp_path)
    assert report.events == len(events) and report.bad_lines == 2
    novel, loss = con.execute(
        "SELECT payload->'novel'->'nested'->>1, loss FROM events WHERE run_id = ? AND step = 1",
        ["new"],
    ).fetchone()
    assert novel == "2" and loss is None  # NaN reads as missing, as in titan.telemetry.events
    types = con.execute("SELECT list(DISTINCT type) FROM events").fetchone()[0]
    assert "some_new_type" in types and "stall" in types
    assert summarize.summaries(con, "new")[0].bad_lines == 2


def _summary_and_reader(tmp_path: Path, events: list[dict]) -> tuple[Any, Any]:
    """The summary of ``events`` by the DuckDB ingest, and ETTR by the Python reader."""
    write_run(tmp_path, "odd", events)
    [s] = summarize.summarize(tmp_path)
    parsed, _ = parse_events(json.loads(line) for line in (tmp_path / "odd" / EVENTS_FILE).open())
    return s, analyze(parsed)


@pytest.mark.parametrize(
    "field, value",
    [("loss", "0.5"), ("loss", True), ("step_time_s", "500"), ("step", True)],
)
def test_a_number_field_of_another_type_is_missing_as_in_every_reader(tmp_path, field, value):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "step":
            e["mfu"] = {"causal": 0.25}
    events[2][field] = value  # step 1
    s, reader = _summary_and_reader(tmp_path, events)
    assert s.best_loss == 3.1 and s.median_mfu == 0.25
    assert s.ettr == pytest.approx(reader.ettr) and reader.ettr is not None


@pytest.mark.parametrize("field", ["step_time_s", "data_wait_s"])
def test_a_negative_duration_makes_ettr_unknown_as_in_every_reader(tmp_path, field):
    events = crash_then_resume()
    events[2][field] = -5.0
    s, reader = _summary_and_reader(tmp_path, events)
    assert s.ettr is None and s.goodput is None and reader.ettr is None
    assert reader.unreadable == 1


def test_an_mfu_recorded_as_a_string_is_missing(tmp_path):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "step":
            e["mfu"] = {"causal": "0.99", "peak_flops": "1e15"}
    s, _ = _summary_and_reader(tmp_path, events)
    assert s.median_mfu is None and s.mfu_convention is None


def test_out_of_range_rates_are_missing_and_sums_stay_finite_json(tmp_path, capsys):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "step":
            e.update(energy_j=1e308, tokens=100, mfu={"causal": -0.5})
    write_run(tmp_path, "absurd", events)
    [s] = summarize.summarize(tmp_path)
    assert s.energy_j is None and s.tokens_per_j is None and s.median_mfu is None
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))


def test_the_summary_table_names_the_runs_with_lines_that_are_not_events(tmp_path, capsys):
    write_run(tmp_path, "torn", crash_then_resume(), tail="{not json\n\x1b[31mgarbage\n")
    write_run(tmp_path, "clean", crash_then_resume())
    assert main(["summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "lines that are not events, skipped:\n  torn: 2 in events.jsonl\n" in out
    assert "clean:" not in out


def test_replaced_file_is_read_again(tmp_path):
    events = crash_then_resume()
    write_run(tmp_path, "again", events)
    con = summarize.connect(tmp_path)
    summarize.ingest(con, tmp_path)
    write_run(tmp_path, "again", events[:3])
    summarize.ingest(con, tmp_path)
    assert event_count(con, "again") == 3
    assert summarize.summaries(con, "again")[0].status == "dead"


@pytest.mark.slow
def test_100k_step_events_ingest_once(tmp_path):
    run_dir = tmp_path / "big"
    run_dir.mkdir()
    record = RunRecord(run_dir, "big")
    record.emit(RunStart(start_step=0, resumed_from_step=None))
    for step in range(1, 100_001):
        record.emit(
            Step(
                step=step,
                loss=10.0 / step,
                step_time_s=0.01,
                tokens=8,
                tokens_seen=8 * step,
                tokens_per_s=800.0,
            )
        )
    record.emit(RunEnd(status="completed", step=100_000))
    record.close()
    con = summarize.connect(tmp_path)
    assert summarize.ingest(con, tmp_path).events == 100_002
    assert summarize.ingest(con, tmp_path).events == 0
    assert event_count(con, "big") == 100_002
    [s] = summarize.summaries(con)
    assert (s.steps, s.tokens, s.final_loss) == (100_000, 800_000, pytest.approx(1e-4))
    con.close()
    assert summarize.summarize(tmp_path)[0].steps == 100_000


def test_run_ids_are_parameters_not_sql(tmp_path):
    run_id = "x'); DROP TABLE events; --"
    write_run(tmp_path, run_id, crash_then_resume())
    [s] = summarize.summarize(tmp_path)
    assert s.run_id == run_id and s.steps == 6


def test_sample_runs_summary(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    summaries = {s.run_id: s for s in summarize.summarize(root)}
    assert len(summaries) == len(sample_run_dirs())
    s = summaries["tiny-20261129-185806-39fc"]
    last = [json.loads(line) for line in (root / s.run_id / EVENTS_FILE).read_text().splitlines()]
    steps = [e for e in last if e["type"] == "step"]
    assert (s.status, s.steps, s.restarts) == ("completed", 200, 0)
    assert s.final_loss == steps[-1]["loss"]
    assert s.best_loss == min(e["loss"] for e in steps)
    assert 0.9 < s.ettr < 1.0


def test_a_peak_under_a_teraflop_is_named_in_gigaflops_not_as_zero(tmp_path, capsys):
    events = crash_then_resume()  # one CPU of 76.8 GFLOP/s (e.g. a host's measured peak)
    for e in events:
        if e["type"] == "run_start":
            e["env"] = {"device_kinds": ["cpu"], "device_count": 1}
        if e["type"] == "step":
            e["mfu"] = {"causal": 0.3, "peak_flops": 7.68e10, "peak_kind": "measured"}
    write_run(tmp_path, "cpu", events)
    assert main(["summarize", str(tmp_path), "--wide"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cpu: 76.8 GFLOP/s per device (measured)" in out and "0.0 TFLOP/s" not in out
    assert main(["report", str(tmp_path / "cpu")]) == 0
    report = (tmp_path / "cpu" / "report" / "report.md").read_text()
    assert "76.8 GFLOP/s (measured)" in report and "0.0 TFLOP/s" not in report


def test_the_summary_names_the_peak_each_runs_mfu_divides_by(tmp_path, capsys):
    root = copy_sample_runs(tmp_path / "runs")
    events = crash_then_resume()  # MFU without a peak, of 2 devices of a kind
    for e in events:
        if e["type"] == "run_start":
            e["env"] = {"device_kinds": ["TPU v9"], "device_count": 2}
        if e["type"] == "step":
            e["mfu"] = {"causal": 0.3, "full": 0.4}
    write_run(root, "no-peak", events)
    h200 = "NVIDIA H200: 989.5 TFLOP/s per device (datasheet_dense_bfloat16)"
    runs = ["llama3-1b-h200", "no-peak", "tiny-killed-resumed"]
    peaks = [summarize.summarize_run_dir(root / r).mfu_peak for r in runs]
    assert peaks == [h200, "TPU v9: peak unknown", None]
    rows = dict(summary_rows(summarize.summarize_run_dir(root / runs[0]), 0))
    assert rows["median MFU"].endswith(f"(causal, of {h200})")
    assert main(["summarize", str(root), "--wide"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"MFU convention: causal, of the peak of {h200}; TPU v9: peak unknown" in out
    assert "| not reported |" in out.replace("│", "|")  # the peak memory no sample run has


def test_a_skipped_steps_rates_are_left_out_of_the_medians(tmp_path):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "step":
            e.update(tokens_per_s=1000.0 * e["step"], mfu={"causal": 0.1})
            if e["step"] in (5, 6):  # skipped: no update applied, a step time of microseconds
                e.update(skipped=True, tokens_per_s=2_892_263.0, mfu={"causal": 50.0})
    write_run(tmp_path, "skips", events)
    s = summarize.summarize_run_dir(tmp_path / "skips")
    assert s.median_tokens_per_s == 3000.0  # of steps 1, 2, 3, 4, 3, 4 (their newest: 3, 4)
    assert s.median_mfu == pytest.approx(0.1)


def test_missing_runs_root_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(TitanError, match="does not exist"):
        summarize.summarize(tmp_path / "nope")
    assert main(["summarize", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_resume_after_a_torn_last_line_starts_a_new_line(tmp_path):
    events = crash_then_resume()
    resumed_at = next(i for i, e in enumerate(events) if e.get("resumed_from_step"))
    torn = json.dumps({**events[resumed_at - 1], "step": 5})[:30]  # killed mid-write
    write_run(tmp_path, "run-t", events[:resumed_at], tail=torn)
    record = RunRecord(tmp_path / "run-t", "run-t")  # the resumed attempt appends
    for e in events[resumed_at:]:
        record.emit(parse_event(e))
    record.close()
    lines = (tmp_path / "run-t" / EVENTS_FILE).read_text().splitlines()
    assert lines[resumed_at] == torn and json.loads(lines[resumed_at + 1])["type"] == "run_start"
    [s] = summarize.summarize(tmp_path)
    assert (s.status, s.restarts, s.steps) == ("completed", 1, 6)


def test_a_run_writing_events_now_is_running_not_dead(tmp_path):
    events = crash_then_resume()[:8]  # one attempt, no run_end
    shift = time.time() - events[-1]["time"] - 5.0  # its last event 5 s ago
    write_run(tmp_path, "live", [{**e, "time": e["time"] + shift} for e in events])
    [s] = summarize.summarize(tmp_path)
    assert (s.status, s.badput["lost_progress"]) == ("running", 0.0)
    con = summarize.connect(tmp_path)
    try:  # silent past the window, no process recorded: the next ingest finds it dead
        con.execute("UPDATE events SET time = time - 1000 WHERE run_id = 'live'")
        summarize.ingest(con, tmp_path)
        [s] = summarize.summaries(con)
    finally:
        con.close()
    assert s.status == "dead" and s.badput["lost_progress"] > 0


def test_ingest_opens_only_the_run_files_whose_stat_changed(tmp_path, monkeypatch):
    for name in ("run-a", "run-b", "run-c"):
        write_run(tmp_path, name, crash_then_resume())
    con = summarize.connect(tmp_path)
    first = summarize.ingest(con, tmp_path)
    opened = []
    open_regular = summarize.open_regular
    monkeypatch.setattr(
        summarize,
        "open_regular",
        lambda path: opened.append(path.parent.name) or open_regular(path),
    )
    unchanged = summarize.ingest(con, tmp_path)
    unchanged_opened = list(opened)
    with (tmp_path / "run-b" / EVENTS_FILE).open("a") as f:
        f.write(json.dumps({"type": "step", "time": time.time(), "run_id": "run-b", "step": 99}))
        f.write("\n")
    grown = summarize.ingest(con, tmp_path)
    con.close()
    assert first.runs == ("run-a", "run-b", "run-c")
    assert unchanged_opened == [] and (unchanged.events, unchanged.runs) == (0, ())
    assert opened == ["run-b"] and (grown.events, grown.runs) == (1, ("run-b",))


def test_a_file_that_cannot_be_read_leaves_the_rest_of_its_batch_ingested(tmp_path):
    for name in ("run-a", "run-c"):
        write_run(tmp_path, name, crash_then_resume())
    (tmp_path / "run-b" / EVENTS_FILE).mkdir(parents=True)  # a directory, not a file
    con = summarize.connect(tmp_path)
    report = summarize.ingest(con, tmp_path)
    statuses = {s.run_id: s.status for s in summarize.summaries(con)}
    con.close()
    assert report.runs == ("run-a", "run-c")
    assert statuses == {"run-a": "completed", "run-b": summarize.UNREADABLE, "run-c": "completed"}


@pytest.mark.parametrize("database_before", [False, True], ids=["no-database", "database"])
def test_a_read_only_runs_root_is_read_with_its_database_in_the_cache(tmp_path, database_before):
    root = copy_sample_runs(tmp_path / "runs")
    if database_before:  # summarized while it could be written: the file is left as it is
        summarize.summarize(root)
    before = file_tree(root)
    prefix = read_only(root)
    first = titan(prefix, "summarize", "--json", str(root))
    again = titan(prefix, "summarize", str(root))
    assert (first.returncode, again.returncode) == (0, 0), first.stderr
    cached = summarize.cached_database_path(root)
    note = f"titan summarize: {root} cannot be written: its records are only read; database: "
    assert first.stderr == f"{note}{cached}\n"
    statuses = {s["run_id"]: s["status"] for s in json.loads(first.stdout)}
    assert sorted(statuses) == [run.name for run in sample_run_dirs()]
    assert statuses["tiny-watchdog-stall"] == "failed"
    assert again.stderr == f"{note}{cached}\n"
    assert "tiny-killed-resumed" in again.stdout
    assert cached.is_file() and cached.parent.parent == Path(os.environ["TITAN_CACHE"])
    assert file_tree(root) == before  # nothing written into the runs root


def test_a_writable_runs_root_keeps_its_database_in_the_runs_root(tmp_path, capsys):
    root = copy_sample_runs(tmp_path / "runs")
    assert main(["summarize", str(root)]) == 0
    assert capsys.readouterr().err == ""
    assert summarize.database_path(root) == root / summarize.DB_FILE
    assert (root / summarize.DB_FILE).is_file()
    assert not summarize.cached_database_path(root).exists()


def test_a_read_only_runs_root_and_cache_is_a_one_line_error(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    cache = tmp_path / "cache"
    cache.mkdir()
    prefix = read_only(tmp_path)
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "titan.cli", "summarize", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TITAN_CACHE": str(cache)},
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"titan summarize: error: {root} cannot be written, nor its database's folder "
        f"{cache / 'databases'} created (Permission denied); set $TITAN_CACHE to a folder you "
        "can write\n"
    )


STALL_RUN = "tiny-watchdog-stall"  # a sample run the watchdog ended: its run_end has an error


def test_summarize_and_report_show_a_failed_runs_error(tmp_path, capsys):
    root = copy_sample_runs(tmp_path / "runs")
    assert main(["summarize", str(root), "--wide"]) == 0
    out = capsys.readouterr().out
    error_lines = ["errors (run_end):", f"  {STALL_RUN}: stalled in step for 9.9 s"]
    assert out.splitlines()[-2:] == error_lines
    assert main(["summarize", str(root), "--json", "--run", STALL_RUN]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["reason"], shown["error"]) == (
        "failed",
        "stall",
        "stalled in step for 9.9 s",
    )
    assert main(["report", str(root / STALL_RUN)]) == 0
    report = (root / STALL_RUN / "report" / "report.md").read_text()
    assert "| status | failed (stall) |\n| error | stalled in step for 9.9 s |\n" in report
    assert main(["report", str(root / "tiny-killed-resumed")]) == 0  # completed: no error row
    assert "| error |" not in (root / "tiny-killed-resumed" / "report" / "report.md").read_text()


def test_a_records_error_reaches_the_terminal_and_the_report_inert(tmp_path, capsys):
    root = copy_sample_runs(tmp_path / "runs")
    path = root / STALL_RUN / EVENTS_FILE
    lines = path.read_text().splitlines()
    end = json.loads(lines[-1])
    hostile = "Boom: \x1b]52;c;aGk=\x07 [bold red]x[/bold red]\n  at \u202eline 2"
    lines[-1] = json.dumps({**end, "error": hostile})
    path.write_text("\n".join(lines) + "\n")
    assert main(["summarize", str(root)]) == 0
    out = capsys.readouterr().out
    shown = r"Boom: \x1b]52;c;aGk=\x07 [bold red]x[/bold red] at \u202eline 2"
    assert out.splitlines()[-1] == f"  {STALL_RUN}: {shown}"
    assert not {"\x1b", "\x07", "\u202e"} & set(out)
    assert summarize.summarize(root)[-1].error == hostile  # kept verbatim, for --json
    assert main(["report", str(root / STALL_RUN)]) == 0
    report = (root / STALL_RUN / "report" / "report.md").read_text()
    assert r"| error | Boom: \x1b\]52;c;aGk=\x07 \[bold red\]x\[/bold red\] at \u202eline 2 |" in (
        report
    )


@pytest.mark.slow
def test_a_run_ended_by_a_non_finite_loss_shows_its_error(corpus_dir, tmp_path, capsys):
    options = small_run(
        corpus_dir,
        tmp_path,
        run_id="nan",
        steps=4,
        dp=1,
        debug_nonfinite_at_step=2,
        nonfinite="abort",
    )
    code, run_dir = run_in_process(options)
    assert code == EXIT_NONFINITE
    capsys.readouterr()
    error = "NonFiniteAbort: step 2: loss nan, grad_norm nan (--nonfinite abort)"
    assert main(["summarize", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["errors (run_end):", f"  nan: {error}"]
    assert main(["report", str(run_dir)]) == 0
    assert f"| error | {error} |" in (run_dir / "report" / "report.md").read_text()


def test_an_empty_runs_root_is_summarized_as_no_runs_and_a_corpus_dir_is_refused(tmp_path, capsys):
    empty = tmp_path / "runs"
    empty.mkdir()
    assert main(["summarize", str(empty)]) == 0  # before the first run
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("x = 1\n")
    assert main(["summarize", str(tmp_path / "code")]) == 2
    assert "holds no runs" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "code").iterdir()] == ["a.py"]
