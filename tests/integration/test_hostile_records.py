"""Hostile run records: terminal escapes and markup in run dir names and record strings stay
inert text in ``titan summarize``, ``titan report`` and the console; readers survive any line
(deep nesting, directories and FIFOs where files should be); a replaced or removed run dir is
ingested afresh or dropped; run ids are restricted to a safe character set."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_helpers import append_events, event, wait_until
from markdown_it import MarkdownIt
from records import crash_then_resume, write_run
from samples import copy_sample_runs
from textual.widgets import DataTable

from titan import reading
from titan.analysis import summarize
from titan.analysis.report import REPORT_FILE
from titan.checkpoint import resume
from titan.cli import main
from titan.config import check_run_id
from titan.errors import TitanError
from titan.formatting import format_bounded, format_clock, format_duration
from titan.inert import inert
from titan.reading import lines_from_end, parse_json
from titan.telemetry.heartbeat import ProcessId
from titan.telemetry.records import EVENTS_FILE, EventTail
from titan.trainer.progress import TrainProgress
from tui.app import TitanConsole
from tui.app import main as console_main
from tui.history_queries import HistoryQuery, HistoryStore
from tui.launcher import STDERR_LOG
from tui.run_list import list_runs
from tui.screens.compare import CompareScreen
from tui.screens.history import HistoryScreen
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.history_table import HistoryTable
from tui.widgets.run_table import RunTable

SIZE = (120, 30)
ESC = "\x1b"
# OSC 52: write "echo pwned" (base64) to the terminal's clipboard; OSC 2: set the window title.
OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
OSC_TITLE = "\x1b]2;owned\x07"
HOSTILE_ID = f"run{OSC52}{OSC_TITLE}x"
DEEP = "[" * 1000 + "]" * 1000


def hostile_events() -> list[dict]:
    """A completed run whose preset, status and error carry escapes and markup."""
    events = crash_then_resume()
    for e in events:
        if e["type"] == "run_start":
            e["config"] = {"preset": "tiny[/bogus]", "note": f"[link=http://x]click{OSC52}[/link]"}
    events[-1] = {**events[-1], "status": f"completed[/]{OSC52}", "error": "[link=http://x]e[/]"}
    return events


# --- inert text and run ids ---------------------------------------------------------------


def test_inert_escapes_controls_and_bidi_and_keeps_printable_text():
    assert inert(OSC52) == "\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
    escaped = "a\\u202eb\\u2066c\\x7f\\x9bd\\x09tab\\x0anl"
    assert inert("a\u202eb\u2066c\x7f\x9bd\ttab\nnl") == escaped
    assert inert("tiny [/bogus] é 日本 🚀 C:\\x") == "tiny [/bogus] é 日本 🚀 C:\\x"
    assert inert(42) == "42"


@pytest.mark.parametrize("run_id", ["tiny-20261129-185806-39fc", "a.b_c-1", "x" * 200])
def test_check_run_id_accepts_plain_names(run_id: str):
    check_run_id(run_id)


@pytest.mark.parametrize(
    ("run_id", "message"),
    [
        (HOSTILE_ID, "only ASCII letters, digits"),
        ("a/b", "only ASCII letters, digits"),
        ("tiny[/bogus]", "only ASCII letters, digits"),
        ("run id", "only ASCII letters, digits"),
        ("héllo-ünï", "only ASCII letters, digits"),
        ("..", "must not start with '.'"),
        (".hidden", "must not start with '.'"),
        ("", "empty"),
        ("x" * 201, "at most 200"),
    ],
)
def test_check_run_id_refuses_unsafe_names_in_one_line(run_id: str, message: str):
    with pytest.raises(TitanError, match=message) as err:
        check_run_id(run_id)
    assert ESC not in str(err.value) and "\n" not in str(err.value)


# --- readers survive any line ---------------------------------------------------------------


def test_json_nested_1000_deep_is_a_bad_line_for_every_reader(tmp_path: Path):
    assert parse_json(DEEP) is None and parse_json("[" * 65 + "]" * 65) is None
    assert parse_json('{"a": [{"b": 1}]}') == {"a": [{"b": 1}]}
    assert parse_json("[" * 64 + "]" * 64) is not None  # the deepest a reader takes
    brackets = '{"text": "' + "[{" * 1000 + '"}'  # brackets in a string nest nothing
    assert parse_json(brackets) == {"text": "[{" * 1000}
    events = crash_then_resume()
    deep_end = '{"type": "run_end", "time": 1113.0, "status": ' + DEEP + "}"
    deep_step = '{"type": "step", "time": 1114.0, "step": 9, "x": ' + DEEP + "}"
    # Brackets inside a string are no nesting: that step is read.
    step = json.dumps({"type": "step", "time": 1115.0, "step": 7, "s": "[" * 100})
    lines = [DEEP, deep_end, deep_step, step]
    path = write_run(tmp_path, "deep", events, tail="\n".join(lines) + "\n")
    tail = EventTail(path)
    assert len(tail.read_new()) == len(events) + 1 and tail.bad_lines == 3
    assert tail.error is None
    [s] = summarize.summarize(tmp_path)
    assert (s.run_id, s.status, s.steps, s.bad_lines) == ("deep", "completed", 7, 3)
    assert main(["summarize", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path / "deep")]) == 0


def wrong_type_events() -> list[dict]:
    """A resumed run whose fields hold values of the wrong JSON type, and lines that are no
    events at all."""
    events = crash_then_resume()
    events[0].update(
        config={"preset": ["a"], "steps": "x", "layout": {"a": 1}, "pp": "two"},
        model="x",
        layout={"devices": "8"},
        env=[1],
        power="none",
        total_steps="6",
    )
    events[2].update(step="one", loss="low", tokens=[1], step_time_s={"a": 1}, mfu=[0.5])
    events[3].update(mfu={"causal": "high"}, energy_j="x", tokens_seen=10**30)
    events[-1].update(status=7, step="six")
    stall = {"type": "stall", "time": 1015.9, "phase": "step", "stacks": [{"a": 1}]}
    stall["stacks"].append({"thread": 3, "stack": [1, None]})
    events[5:5] = [
        {"type": 5, "time": "now"},
        {"type": "checkpoint", "time": 1014.7, "step": [2]},
        {"type": "run_start", "time": None},
        stall,
    ]
    return events


def test_wrong_types_and_a_line_longer_than_a_read_chunk_are_survived(tmp_path, monkeypatch):
    monkeypatch.setattr(summarize, "READ_CHUNK_BYTES", 1024)
    huge = {"type": "checkpoint", "time": 1016.6, "step": 4, "note": "x" * 10_000}
    path = write_run(tmp_path, "wrong", wrong_type_events())
    with path.open("a") as f:
        f.write(json.dumps(huge) + "\n")
    [s] = summarize.summarize(tmp_path)
    assert (s.run_id, s.steps, s.restarts, s.stalls) == ("wrong", 6, 1, 2)
    assert main(["summarize", str(tmp_path)]) == 0
    assert main(["perf", "check", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path / "wrong")]) == 0


def test_bytes_that_are_not_utf8_give_one_state_to_every_reader(tmp_path):
    path = write_run(tmp_path, "badutf8", [event("run_start", 1000.0, total_steps=4)])
    end = json.dumps(event("run_end", 1001.0, status="failed", step=0, error="bad XY utf8"))
    with path.open("ab") as f:  # the run_end's error holds bytes that decode to nothing
        f.write(end.encode().replace(b"XY", b"\xff\xfe\xc3(") + b"\n")
    [listed] = list_runs(tmp_path).summaries
    [summary] = summarize.summarize(tmp_path)
    tail = EventTail(path)
    [*_, run_end] = tail.read_new_events()
    assert listed.liveness.state == summary.status == run_end.status == "failed"
    assert run_end.error == summary.error == "bad \ufffd\ufffd\ufffd( utf8" and tail.bad_lines == 0


def test_a_lone_surrogate_escape_that_json_dumps_writes_reads_alike_everywhere(tmp_path):
    # A file name with a byte that is not UTF-8 reaches the record as "\udce9" (surrogateescape)
    start = event("run_start", 1000.0, total_steps=2, config={"data": "caf\udce9.txt"})
    path = write_run(tmp_path, "surrogate", [start, event("step", 1001.0, step=1, loss=2.0)])
    append_events(path.parent, [event("run_end", 1002.0, status="completed", step=1)])
    [listed] = list_runs(tmp_path).summaries
    [summary] = summarize.summarize(tmp_path)
    first = EventTail(path).read_new_events()[0]
    assert (summary.status, summary.steps, summary.bad_lines) == ("completed", 1, 0)
    assert listed.liveness.state == "completed" and summary.wall_s == 2.0
    assert first.config["data"] == "caf\ufffd.txt"


def test_a_line_over_many_slices_and_a_torn_tail_are_read_whole_by_the_tail(tmp_path):
    path = write_run(tmp_path, "long", [event("run_start", 1000.0, total_steps=4)])
    note = "x" * 300_000
    with path.open("a") as f:
        f.write(json.dumps(event("checkpoint", 1001.0, step=1, note=note)) + "\n")
        f.write('{"type": "run_end", "time": 1002.0, "sta')
    tail, read = EventTail(path), []
    while tail.offset < path.stat().st_size:
        read += tail.read_new_events(65_536)
    with path.open("a") as f:
        f.write('tus": "completed", "step": 1}\n')
    read += tail.read_new_events(65_536)
    assert [e.type for e in read] == ["run_start", "checkpoint", "run_end"]
    assert read[1].extra["note"] == note and read[2].status == "completed"
    assert tail.bad_lines == 0


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 2**20])
@pytest.mark.parametrize(
    ("text", "lines"),
    [
        (b"", []),
        (b"\n", [b""]),
        (b"a\nbb\n", [b"bb", b"a"]),
        (b"a\nbb\nccc", [b"bb", b"a"]),  # an unfinished last line is left out
        (b"only, unfinished", []),
        (b"\n\nx\n", [b"x", b"", b""]),
    ],
)
def test_lines_from_end_reads_whole_lines_last_first_over_any_block(tmp_path, block, text, lines):
    path = tmp_path / "record"
    path.write_bytes(text)
    assert list(lines_from_end(path, block)) == lines


def test_the_recorded_checkpoint_is_found_from_the_tail_of_a_record_of_real_size(tmp_path):
    path = write_run(tmp_path, "long", [event("checkpoint", 1000.0, step=3)])
    with path.open("a") as f:
        for step in range(4, 40_004):
            f.write(json.dumps(event("step", 1000.0 + step, step=step, loss=2.0)) + "\n")
        f.write(json.dumps(event("checkpoint", 2e5, step=40_000)) + "\n")
        f.write('{"type": "checkpoint", "time": 2e5, "step": 40')  # torn by a kill
    reads = []
    real_lines = reading.lines_from_end

    def counted(*args):
        for line in real_lines(*args):
            reads.append(line)
            yield line

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resume, "lines_from_end", counted)
        assert resume.recorded_checkpoint(path.parent) == 40_000
    assert len(reads) == 1
    path.write_text(path.read_text().replace('"checkpoint"', '"checkpoint_unrestorable"'))
    assert resume.recorded_checkpoint(path.parent) is None
    assert resume.recorded_checkpoint(tmp_path / "missing") is None


def _corrupted(path: Path, good: bytes) -> Iterator[int]:
    """Write ``good`` to ``path`` with one DuckDB block after the file's headers overwritten,
    block by block (DuckDB's blocks are 256 KiB after three 4 KiB headers); yields the offset."""
    for offset in range(3 * 4096, len(good), 256 * 1024):
        path.write_bytes(good[: offset + 100] + b"\xff" * 1000 + good[offset + 1100 :])
        yield offset


def test_a_corrupt_database_is_one_line_and_built_again_once_removed(tmp_path, capsys):
    root = copy_sample_runs(tmp_path / "runs")
    assert main(["summarize", str(root)]) == 0
    database = summarize.database_path(root)
    good = database.read_bytes()
    outcomes = []
    for _ in _corrupted(database, good):
        capsys.readouterr()
        outcomes.append((main(["summarize", str(root)]), capsys.readouterr().err))
    refused = [err for code, err in outcomes if code == 2]
    assert {code for code, _ in outcomes} <= {0, 2} and refused
    for err in refused:
        assert err.count("\n") == 1 and "Corrupt database file" in err
        assert "it only summarises the run records: remove it and it is built again" in err
    database.unlink()
    assert main(["summarize", str(root)]) == 0


@pytest.mark.parametrize(
    "content",
    [
        b"not a database" * 1000,  # junk
        b"\0" * 8 + b"DUCK" + (51).to_bytes(8, "little") + b"\0" * 12268,  # a damaged header
    ],
)
def test_an_unreadable_database_is_set_aside_and_built_again(tmp_path, capsys, content):
    root = copy_sample_runs(tmp_path / "runs")
    assert main(["summarize", str(root), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    database = summarize.database_path(root)
    database.write_bytes(content)
    assert main(["summarize", str(root), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == expected
    assert (
        captured.err.count("\n") == 1 and f"titan: {database} could not be read (" in captured.err
    )
    assert "set aside as titan.duckdb.unreadable; built again from the run records" in captured.err
    assert database.with_name("titan.duckdb.unreadable").read_bytes() == content
    assert main(["summarize", str(root), "--json"]) == 0  # the new one is read as it is
    assert capsys.readouterr().err == ""
    database.write_bytes(b"junk again")  # a second set-aside keeps the first
    assert main(["summarize", str(root), "--json"]) == 0
    assert "set aside as titan.duckdb.unreadable.2;" in capsys.readouterr().err
    assert database.with_name("titan.duckdb.unreadable").read_bytes() == content
    assert database.with_name("titan.duckdb.unreadable.2").read_bytes() == b"junk again"


def test_the_consoles_history_store_raises_one_line_on_a_corrupt_database(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    store = HistoryStore(root)
    store.ingest()
    good = summarize.database_path(root).read_bytes()
    refused = []
    for _ in _corrupted(summarize.database_path(root), good):
        try:
            store.ingest()
            store.page(HistoryQuery())
            store.detail("tiny-killed-resumed")
        except TitanError as err:
            refused.append(str(err))
    assert refused and all("Corrupt database file" in error for error in refused)


def test_the_detail_of_a_run_removed_since_it_was_listed_is_one_line(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    store = HistoryStore(root)
    store.ingest()
    shutil.rmtree(root / "tiny-killed-resumed")
    store.ingest()
    with pytest.raises(TitanError, match="run tiny-killed-resumed is gone: its dir was removed"):
        store.detail("tiny-killed-resumed")


def test_nan_and_infinities_read_as_missing_and_a_line_without_a_finite_time_is_bad(
    tmp_path, capsys
):
    events = crash_then_resume()
    events[-1]["time"] = float("inf")  # run_end: a bad line, so the run has no end
    events[2].update(step_time_s=float("inf"), tokens_per_s=float("nan"))
    events[3].update(tokens_per_s=float("-inf"), mfu={"causal": float("inf")})
    path = write_run(tmp_path, "inf", events)
    assert "Infinity" in path.read_text() and "NaN" in path.read_text()
    [s] = summarize.summarize(tmp_path)
    assert (s.bad_lines, s.status, s.median_mfu) == (1, "dead", None)
    assert s.wall_s is not None and s.wall_s < 200 and s.ettr is not None and s.ettr < 1
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out
    json.loads(out)
    assert main(["report", str(tmp_path / "inf")]) == 0


def test_a_time_past_the_calendar_is_summarised_reported_and_listed(tmp_path, capsys):
    events = crash_then_resume()[:-1]  # no run_end, and a process that is gone: a dead run
    gone = subprocess.Popen(["true"])
    gone.wait()
    events[8]["process"] = ProcessId(ProcessId.current().host, gone.pid, 0, 1100.0).as_dict()
    events[-1]["time"] = 1e20  # finite, but past what time.localtime holds
    write_run(tmp_path, "far", events)
    [s] = summarize.summarize(tmp_path)
    assert s.run_id == "far"
    assert main(["summarize", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path / "far")]) == 0
    assert "far" in capsys.readouterr().out
    assert format_clock(1e20) == "-" and format_clock(None) == "-"
    assert format_clock(0.0, "%Y", utc=True) == "1970"


def test_losses_of_1e308_both_ways_leave_the_report_written_without_their_figure(tmp_path, capsys):
    events = crash_then_resume()
    events[2]["loss"], events[3]["loss"] = 1e308, -1e308  # their span overflows a float
    write_run(tmp_path, "wide", events)
    assert main(["report", str(tmp_path / "wide"), "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / REPORT_FILE).read_text()
    assert "figure not drawn: the values recorded cannot be plotted" in text
    assert "![tokens/s vs step](throughput.png)" in text
    assert "Warning" not in capsys.readouterr().err


def test_a_step_past_64_bits_is_left_out_of_every_export(tmp_path):
    events = crash_then_resume()
    events[2]["step"] = 2**63  # no sink stores it
    write_run(tmp_path, "huge", events)
    for sink in ("tensorboard", "csv"):
        assert main(["export", sink, str(tmp_path / "huge"), "--out", str(tmp_path / sink)]) == 0
    steps = [line.split(",")[0] for line in (tmp_path / "csv").read_text().splitlines()[1:]]
    assert steps == ["2", "3", "4", "5", "6"]


@pytest.mark.parametrize("step", [2**63, -(2**63) - 1, 1e23])
def test_a_step_past_64_bits_is_a_bad_line_to_the_run_list_as_to_summarize(tmp_path, step):
    events = crash_then_resume()
    last = next(e for e in reversed(events) if e["type"] == "step")
    events.insert(events.index(last) + 1, dict(last, step=step, loss=123.0))
    write_run(tmp_path, "huge", events)
    [summary] = summarize.summarize(tmp_path)
    [listed] = list_runs(tmp_path).summaries
    assert (listed.state.step, listed.state.loss) == (last["step"], last["loss"])
    assert (summary.steps, summary.final_loss) == (last["step"], last["loss"])


def test_an_error_of_200k_characters_is_cut_in_summaries_and_kept_whole_in_json(tmp_path, capsys):
    events = crash_then_resume()
    events[-1].update(status="failed", error="x" * 200_000)
    write_run(tmp_path, "long", events)
    assert main(["summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "x" * 2000 + "… (198,000 more characters in the run's events.jsonl)" in out
    assert len(out) < 10_000
    assert main(["report", str(tmp_path / "long"), "--out", str(tmp_path / "r")]) == 0
    assert len((tmp_path / "r" / REPORT_FILE).read_text()) < 20_000
    capsys.readouterr()
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["error"] == "x" * 200_000


def test_ettr_stays_at_most_1_and_negative_counts_read_as_missing(tmp_path):
    events = crash_then_resume()
    events[-2]["time"] = events[-1]["time"] = 1e20  # the last save and run_end, far away
    events[-3]["step_time_s"] = 1e20  # a step that took all of it, to the clocks' slack
    for e in events:
        if e["type"] == "step":
            e.update(tokens=-1, tokens_seen=-100, tokens_per_s=-5.0)
    write_run(tmp_path, "odd", events)
    [s] = summarize.summarize(tmp_path)
    assert s.ettr == 1.0
    assert (s.tokens, s.median_tokens_per_s) == (None, None)


@pytest.mark.parametrize("seconds", [float("inf"), float("-inf"), float("nan"), None])
def test_a_duration_that_is_no_finite_number_is_written_as_missing(seconds):
    assert format_duration(seconds) == "-"
    assert format_duration(3725.4) == "1h02m05s"


def test_a_run_whose_summary_crashed_is_summarised_at_the_next_ingest(tmp_path, monkeypatch):
    write_run(tmp_path, "later", crash_then_resume())
    con = summarize.connect(tmp_path)
    try:
        with monkeypatch.context() as m:
            m.setattr(summarize, "refresh_runs", lambda *a: (_ for _ in ()).throw(SystemExit(1)))
            with pytest.raises(SystemExit):
                summarize.ingest(con, tmp_path)
        assert summarize.summaries(con) == []
        summarize.ingest(con, tmp_path)  # nothing new in the file: still summarised
        [s] = summarize.summaries(con)
    finally:
        con.close()
    assert (s.run_id, s.status, s.steps) == ("later", "completed", 6)


def test_a_run_that_cannot_be_summarised_is_unreadable_and_the_others_listed(tmp_path, monkeypatch):
    write_run(tmp_path, "good", crash_then_resume())
    write_run(tmp_path, "odd", crash_then_resume())
    analyze = summarize.ettr.analyze

    def failing(events, now):
        if events and events[0].run_id == "odd":
            raise TypeError("unsupported operand type(s)")
        return analyze(events, now=now)

    monkeypatch.setattr(summarize.ettr, "analyze", failing)
    rows = {s.run_id: s for s in summarize.summarize(tmp_path)}
    assert (rows["good"].status, rows["good"].steps) == ("completed", 6)
    assert (rows["odd"].status, rows["odd"].reason) == (
        summarize.UNREADABLE,
        "TypeError: unsupported operand type(s)",
    )
    monkeypatch.setattr(summarize.ettr, "analyze", analyze)  # fixed: read again next time
    assert {s.run_id: s.status for s in summarize.summarize(tmp_path)}["odd"] == "completed"


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_an_events_file_that_cannot_be_read_is_reported_and_the_others_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture, kind: str
):
    write_run(tmp_path, "good", crash_then_resume())
    (tmp_path / "bad").mkdir()
    if kind == "directory":
        (tmp_path / "bad" / EVENTS_FILE).mkdir()
    else:
        os.mkfifo(tmp_path / "bad" / EVENTS_FILE)
    tail = EventTail(tmp_path / "bad" / EVENTS_FILE)
    assert tail.read_new() == [] and tail.error  # the console's reader neither blocks nor fails
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["good"]["status"] == "completed" and rows["good"]["steps"] == 6
    assert rows["bad"]["status"] == summarize.UNREADABLE and rows["bad"]["steps"] is None
    assert rows["bad"]["reason"]
    # Made readable, the run is read at the next ingest.
    bad = tmp_path / "bad" / EVENTS_FILE
    bad.rmdir() if kind == "directory" else bad.unlink()
    write_run(tmp_path, "bad", crash_then_resume()[:8])
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["bad"]["status"], rows["bad"]["steps"]) == ("dead", 4)
    assert main(["report", str(tmp_path / "good")]) == 0


def _write_non_utf8_run(root: Path) -> None:
    """A run dir whose name holds the byte 0xff (not UTF-8)."""
    run_dir = os.path.join(os.fsencode(root), b"bad\xff")
    os.makedirs(run_dir)
    write_run(root, os.fsdecode(os.path.basename(run_dir)), crash_then_resume())


def test_a_run_dir_name_that_is_not_utf8_is_listed_unreadable(tmp_path, capsys):
    _write_non_utf8_run(tmp_path)
    write_run(tmp_path, "good", crash_then_resume())
    for _ in range(2):
        assert main(["summarize", str(tmp_path), "--json"]) == 0
        rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows["bad\\xff"]["status"] == summarize.UNREADABLE
        assert rows["good"]["steps"] == 6
    assert main(["summarize", str(tmp_path)]) == 0
    assert "bad\\xff" in capsys.readouterr().out


def test_report_of_an_events_directory_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "r" / EVENTS_FILE).mkdir(parents=True)
    assert main(["report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and EVENTS_FILE in err


# --- replaced and removed run dirs ----------------------------------------------------------


def _shifted(events: list[dict], by_s: float) -> list[dict]:
    return [{**e, "time": e["time"] + by_s} for e in events]


@pytest.mark.parametrize("how", ["rewritten in place", "dir replaced"])
def test_a_run_dir_replaced_by_a_longer_run_is_ingested_afresh(tmp_path: Path, how: str):
    root, fresh = tmp_path / "root", tmp_path / "fresh"
    first = crash_then_resume()[:8]  # one attempt, crashed at step 4
    second = _shifted(crash_then_resume(), 5000.0)  # a longer run under the same id
    write_run(root, "same", first)
    summarize.summarize(root)
    if how == "dir replaced":
        shutil.rmtree(root / "same")
    write_run(root, "same", second)
    write_run(fresh, "same", second)
    [replaced] = summarize.summarize(root)
    [expected] = summarize.summarize(fresh)
    assert replaced.as_dict() == expected.as_dict()
    assert replaced.ettr <= 1.0 and all(v >= 0 for v in replaced.badput.values() if v)
    assert (replaced.steps, replaced.restarts) == (6, 1)


def test_a_removed_run_dir_disappears_from_the_summaries(tmp_path: Path):
    write_run(tmp_path, "kept", crash_then_resume())
    write_run(tmp_path, "gone", crash_then_resume())
    assert [s.run_id for s in summarize.summarize(tmp_path)] == ["gone", "kept"]
    shutil.rmtree(tmp_path / "gone")
    assert [s.run_id for s in summarize.summarize(tmp_path)] == ["kept"]
    con = summarize.connect(tmp_path)
    try:
        for table in ("files", "events", "runs", "perf"):
            count = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = 'gone'").fetchone()
            assert count[0] == 0, table
    finally:
        con.close()


# --- titan summarize, perf check and report -------------------------------------------------


def test_summarize_prints_hostile_names_and_statuses_inert(tmp_path, capsys):
    write_run(tmp_path, HOSTILE_ID, hostile_events())
    write_run(tmp_path, "linked[link=x]", crash_then_resume())
    write_run(tmp_path, "plain", crash_then_resume())
    assert main(["summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ESC not in out and "\x07" not in out
    assert "\\x1b]52;c;" in out and "completed[/]" in out
    assert "linked[link=x]" in out and "plain" in out
    assert main(["summarize", str(tmp_path), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[HOSTILE_ID]["status"] == f"completed[/]{OSC52}"  # the data stays as recorded
    assert main(["perf", "check", str(tmp_path)]) in (0, 1)
    out = capsys.readouterr().out
    assert ESC not in out and "\\x1b]52" in out


@pytest.mark.parametrize(
    "kind", ["[/bogus]", "[link=https://evil.example/k]measured[/link]", "[bold red]measured"]
)
def test_a_peak_kind_holding_markup_is_shown_as_written_in_the_caption(
    tmp_path, capsys, monkeypatch, kind
):
    events = crash_then_resume()
    for e in events:
        if e["type"] == "run_start":
            e["env"] = {"device_kinds": ["cpu"], "device_count": 1}
        if e["type"] == "step":
            e["mfu"] = {"causal": 0.3, "peak_flops": 1e15, "peak_kind": kind}
    write_run(tmp_path, "marked", events)
    monkeypatch.setenv("FORCE_COLOR", "1")  # a terminal: links and styles would be sent
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"({kind})" in out and "\x1b]8;" not in out and "\x1b[1;31m" not in out


def test_summarize_error_naming_a_hostile_run_is_inert(tmp_path, capsys):
    write_run(tmp_path, "plain", crash_then_resume())
    assert main(["summarize", str(tmp_path), "--run", HOSTILE_ID]) == 2
    err = capsys.readouterr().err
    assert ESC not in err and "\\x1b]52" in err


def test_report_md_holds_no_raw_escape(tmp_path: Path):
    path = write_run(tmp_path, HOSTILE_ID, hostile_events())
    assert main(["report", str(path.parent)]) == 0
    text = (path.parent / "report" / REPORT_FILE).read_text()
    assert ESC not in text and "\x07" not in text
    assert "\\x1b\\]52;c;" in text and "completed\\[/\\]" in text and "tiny\\[/bogus\\]" in text


def test_report_md_renders_record_html_and_markdown_as_text(tmp_path: Path):
    events = hostile_events()
    hostile = "x | y\n<script>alert(1)</script>![img](http://evil/x.png) &amp; `code`"
    for start in (e for e in events if e["type"] == "run_start"):
        start["config"] = {**start["config"], "data": hostile}
    path = write_run(tmp_path, "markup", events)
    assert main(["report", str(path.parent), "--out", str(tmp_path / "out")]) == 0
    rendered = (
        MarkdownIt("commonmark")
        .enable("table")
        .render((tmp_path / "out" / REPORT_FILE).read_text())
    )
    assert "<script" not in rendered
    assert set(re.findall(r'<img src="([^"]*)"', rendered)) == {"loss.png", "throughput.png"}
    assert "<code>code</code>" not in rendered and '<a href="http://x' not in rendered
    cell = "x | y &lt;script&gt;alert(1)&lt;/script&gt;![img](http://evil/x.png) &amp;amp; `code`"
    assert f"<td>{cell}</td>" in rendered


def test_training_log_lines_show_a_hostile_run_dir_inert(capsys):
    progress = TrainProgress(total_steps=2, log_every=1)
    with progress.status(f"resuming {HOSTILE_ID}"):
        pass
    progress.finish("completed", 2, Path("runs") / HOSTILE_ID)
    out, err = capsys.readouterr()
    assert ESC not in out + err and "\x07" not in out + err
    assert "resuming run\\x1b]52;c;" in out and "runs/run\\x1b]52;c;" in err


# --- the console ----------------------------------------------------------------------------


def _screen_text(app: TitanConsole) -> str:
    """The text of the current screen as drawn (an SVG screenshot, tags left out)."""
    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]*>", "", svg)).replace("\xa0", " ")


def _write_console_run(root: Path, name: str, preset: str, status: str) -> None:
    (root / name).mkdir(parents=True)
    start = event("run_start", 1000.0, config={"preset": preset, "layout": "spmd"}, total_steps=8)
    append_events(
        root / name,
        [
            start,
            event("step", 1001.0, step=1, loss=5.5, step_time_s=1.0),
            event("run_end", 1002.0, status=status, step=1, error=f"[link=http://x]e{OSC52}"),
        ],
    )


def test_console_command_line_errors_show_a_hostile_path_inert(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        console_main(["--run", str(tmp_path / HOSTILE_ID)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and ESC not in err and "\\x1b]52;c;" in err


async def test_console_run_list_and_history_show_hostile_runs_inert(tmp_path: Path):
    _write_console_run(tmp_path, HOSTILE_ID, "tiny[/bogus]", f"completed[/]{OSC52}")
    _write_console_run(tmp_path, "linked", "[link=http://x]tiny[/link]", "completed")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / EVENTS_FILE).write_text(DEEP + "\n")
    _write_non_utf8_run(tmp_path)
    (tmp_path / "fifo").mkdir()  # a FIFO would block a reader that opened it
    os.mkfifo(tmp_path / "fifo" / EVENTS_FILE)
    (tmp_path / "fifo" / STDERR_LOG).write_text("")
    app = TitanConsole(tmp_path)
    # wide enough for History's preset column beside the hostile run id (narrower, it gives way)
    async with app.run_test(size=(200, 30)) as pilot:
        table = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: table.row_count == 5, lambda: "runs not listed", 20)
        await pilot.pause(0.2)
        runs_screen = _screen_text(app)
        await pilot.press("h")
        history = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: history.row_count == 5, lambda: "not in history", 20)
        await pilot.pause(0.2)
        history_screen = _screen_text(app)
        assert isinstance(app.screen, HistoryScreen)
        history.move_cursor(row=[r.run_id for r in history.page.rows].index(HOSTILE_ID))
        await pilot.press("enter")
        detail = app.screen
        assert isinstance(detail, RunDetailScreen)
        await wait_until(pilot, lambda: detail.detail is not None, lambda: "no detail", 20)
        await pilot.pause(0.2)
        detail_screen = _screen_text(app)
        config_rows = [
            [str(c) for c in detail.query_one("#detail-config", DataTable).get_row_at(i)]
            for i in range(detail.query_one("#detail-config", DataTable).row_count)
        ]
    for shown in (runs_screen, history_screen, detail_screen):
        assert ESC not in shown and "\x07" not in shown
        assert "\\x1b]52;c;" in shown
    assert "tiny[/bogus]" in runs_screen and "[link=http://x]tiny[/link]" in runs_screen
    assert "completed[/]" in history_screen and "tiny[/bogus]" in history_screen
    assert "bad\\udcff" in runs_screen and "bad\\xff" in history_screen
    assert ["preset", "tiny[/bogus]"] in config_rows


async def test_history_cuts_a_long_preset_and_status_and_keeps_the_other_columns(tmp_path):
    _write_console_run(tmp_path, "long", "p" * 200, "s" * 200)
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        history = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: history.row_count == 1, lambda: "not in history", 20)
        await pilot.pause(0.2)
        shown = _screen_text(app)
    assert "p" * 27 + "…" in shown and "p" * 28 not in shown
    assert "s" * 15 + "…" in shown and "s" * 16 not in shown
    assert "started" in shown  # the last column is on screen


@pytest.mark.slow
async def test_console_survives_wrong_types_in_the_run_list_monitor_and_history(tmp_path):
    write_run(tmp_path, "wrong", wrong_type_events())
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: table.row_count == 1, lambda: "not listed", 20)
        await pilot.press("enter")
        monitor = app.screen
        await wait_until(pilot, lambda: monitor.state.curve.count, lambda: "not read", 20)
        for key in "123456":
            await pilot.press(key)
            await pilot.pause(0.1)
        await pilot.press("h")
        history = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: history.row_count == 1, lambda: "not in history", 20)
        await pilot.press("enter")
        detail = app.screen
        await wait_until(pilot, lambda: detail.detail is not None, lambda: "no detail", 20)
        for key in "12345":
            await pilot.press(key)
            await pilot.pause(0.1)
        stalls = list(detail.query_one("#detail-stalls").lines)
    assert monitor.state.step == 6 and monitor.state.devices is None
    assert stalls[0] == "2 stall(s)" and "  thread 3:" in stalls


@pytest.mark.slow
async def test_console_monitor_survives_wrong_types_and_shows_escapes_inert(tmp_path: Path):
    run_dir = tmp_path / HOSTILE_ID
    run_dir.mkdir()
    start = event(
        "run_start",
        1000.0,
        config={"preset": {"not": "text"}, "watchdog_floor": "soon", "watchdog_factor": [2]},
        layout={"devices": "eight"},
        env={"device_kinds": {"NVIDIA H200": 1}},
        power={"reason": 5},
        total_steps=8,
    )
    stall = event(
        "stall",
        1002.0,
        phase="step",
        elapsed_s=None,
        threshold_s=None,
        step=1,
        stacks=[{"thread": f"main{OSC52}", "stack": 5}, {"stack": [f"frame[/]{OSC_TITLE}"]}],
    )
    pipeline = event(
        "pipeline",
        1001.5,
        stages=1,
        schedule=f"gpipe[/bogus]{OSC52}",
        microbatches=1,
        theoretical_bubble=0.0,
        actions=[[f"F0.0[link=http://x]{OSC52}"]],
    )
    append_events(
        run_dir,
        [
            start,
            pipeline,
            event("step", 1001.0, step=1, loss=5.5, step_time_s=1.0, energy_j=10.0),
            stall,
            event("run_end", 1003.0, status=f"failed[/]{OSC52}", step=1, error=f"[/]{OSC52}"),
        ],
        tail=DEEP + "\n",
    )
    (run_dir / STDERR_LOG).mkdir()  # a directory where the stderr log should be
    app = TitanConsole(tmp_path, open_run=run_dir)
    shown = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(
            pilot, lambda: app.screen.state.end_status is not None, lambda: "not read", 20
        )
        for key in "123456":
            await pilot.press(key)
            await pilot.pause(0.2)
            shown.append(_screen_text(app))
    for screen in shown:
        assert ESC not in screen and "\x07" not in screen
    assert "failed[/]\\x1b]52;c;" in shown[0]
    assert f"cannot read {STDERR_LOG}" in shown[0]
    assert "thread main\\x1b]52;c;" in shown[2] and "frame[/]\\x1b]2;owned\\x07" in shown[2]
    assert "gpipe[/bogus]\\x1b]52" in shown[5] and "F0.0[link=http://x]" in shown[5]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["maxtext", "hf"])
def test_an_exports_success_line_shows_a_hostile_out_inert(kind, finished_run, tmp_path, capsys):
    out = tmp_path / f"{kind}\x1b[2J\nx"
    assert main(["export", kind, str(finished_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and printed.count("\n") == 1, printed
    assert inert(str(out)) in printed


@pytest.mark.slow
async def test_the_console_survives_a_link_loop_a_loss_past_plotting_and_a_null_step(tmp_path):
    root = tmp_path / "runs"
    for name in ("tiny-20261129-185806-39fc", "tiny-killed-resumed"):
        shutil.copytree(Path(__file__).resolve().parents[2] / "sample_runs" / name, root / name)
    (root / "loop").symlink_to(root / "loop")  # ELOOP at the listing's is_dir()
    hostile = root / "tiny-killed-resumed" / EVENTS_FILE
    lines = hostile.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    steps = [  # the last loss shown in the run list, its step past any real run's
        dict(last, type="step", step=None, loss=5.0),
        dict(last, type="step", step=9 * 10**18, loss=-1e308),
    ]
    hostile.write_text("".join(lines[:-1] + [json.dumps(s) + "\n" for s in steps] + lines[-1:]))
    app = TitanConsole(root)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunTable)
        await wait_until(pilot, lambda: table.row_count == 2, lambda: "runs not listed", 20)
        table.move_cursor(row=0)  # the run written last: the hostile one
        assert table.selected_run() == hostile.parent
        await pilot.pause(0.2)
        listed = _screen_text(app)
        await pilot.press("enter")
        await pilot.pause(0.5)
        await pilot.press("2")  # the curves: plotext overflowed on -1e308
        await pilot.pause(0.5)
        curves = _screen_text(app)
        await pilot.press("escape", "h")
        history = app.screen.query_one(HistoryTable)
        await wait_until(pilot, lambda: history.row_count == 2, lambda: "not in history", 20)
        await pilot.press("space", "down", "space", "c")  # the null step broke the ticks
        compare = app.screen
        assert isinstance(compare, CompareScreen)
        await wait_until(pilot, lambda: bool(compare.diff), lambda: "no diff", 10)
        await pilot.pause(0.5)
        compared = _screen_text(app)
    assert "learning rate" in curves and "tiny-killed-resumed" in compared
    # a number past any real run's stays one short cell: the other columns stay on the screen
    row = next(line for line in listed.splitlines() if "-1.00e+308" in line)
    assert "9.00e+18/" in row and "tiny-killed-resumed" in row
    assert format_bounded(1234567.0, ",.0f") == "1,234,567"  # a real run's, in full
