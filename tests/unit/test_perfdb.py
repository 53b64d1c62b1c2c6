"""The performance database: steady step times per key, regressions against earlier runs."""

from __future__ import annotations

import json

import pytest
from helpers import file_tree
from records import read_only, titan
from samples import copy_sample_runs

from titan.analysis import perfdb, summarize
from titan.cli import main
from titan.planning.step import calibrate
from titan.telemetry.events import parse_event, parse_events
from titan.telemetry.records import EVENTS_FILE


def run_start(time: float, devices: int = 8, kind: str = "NVIDIA H200") -> dict:
    return {
        "type": "run_start",
        "time": time,
        "start_step": 0,
        "model": {"name": "tiny", "vocab_size": 4096, "d_model": 256, "n_layers": 4,
                  "n_heads": 8, "n_kv_heads": 4, "ffn_dim": 688},
        "config": {"layout": "spmd", "dp": 0, "fsdp": 1, "tp": 1, "pp": 1, "batch_size": 16,
                   "seq_len": 128, "param_dtype": "float32", "compute_dtype": "auto",
                   "remat": "none", "microbatches": 1},
        "layout": {"layout": "spmd", "mesh": {"data": devices, "fsdp": 1, "tensor": 1}},
        "compute_dtype": "bfloat16",
        "ops": {"attention": "cudnn"},
        "env": {"packages": {"jax": "0.11.2", "jaxlib": "0.11.2"}, "device_kinds": [kind],
                "device_count": devices},
    }  # fmt: skip


def steps(time: float, first: int, step_s: list[float]) -> list[dict]:
    return [
        {"type": "step", "time": time + i, "step": first + i, "step_time_s": s}
        for i, s in enumerate(step_s)
    ]


def write(root, run_id: str, events: list[dict]) -> None:
    (root / run_id).mkdir(parents=True)
    text = "".join(json.dumps({"schema": 1, "run_id": run_id, **e}) + "\n" for e in events)
    (root / run_id / EVENTS_FILE).write_text(text)


def test_steady_step_times_skip_warmup_of_each_attempt_and_checkpointed_steps():
    events = [
        run_start(0.0),
        *steps(1.0, 1, [9.0, 5.0, 4.0, 1.0, 1.1]),
        {"type": "checkpoint", "time": 6.5, "step": 5, "seconds": 2.0},
        *steps(7.0, 6, [3.1, 1.2]),
        {**run_start(20.0), "start_step": 5, "resumed_from_step": 5},
        *steps(21.0, 6, [8.0, 2.0, 2.0, 1.3]),
    ]
    assert perfdb.steady_step_times(parse_events(events)[0]) == [1.0, 1.1, 1.2, 1.3]


def test_steady_step_times_leave_out_profiled_steps_and_the_step_before():
    events = [
        run_start(0.0),
        *steps(1.0, 1, [9.0, 5.0, 4.0, 1.0, 1.5, 3.0, 2.5, 1.1]),
        {"type": "profile", "time": 9.0, "steps": [6, 7], "requested": [6, 7]},
    ]
    assert perfdb.steady_step_times(parse_events(events)[0]) == [1.0, 1.1]


def test_steady_step_times_leave_out_negative_times_of_a_damaged_record():
    events = [run_start(0.0), *steps(1.0, 1, [9.0, 5.0, 4.0, 1.0, -5.0, 1.1])]
    assert perfdb.steady_step_times(parse_events(events)[0]) == [1.0, 1.1]


def test_steady_step_times_leave_out_zero_and_infinite_times_and_the_median_stays_finite():
    events = [run_start(0.0), *steps(1.0, 1, [9.0, 5.0, 4.0, 0.0, 1e308, float("inf"), 1e308])]
    assert perfdb.steady_step_times(parse_events(events)[0]) == [1e308, 1e308]
    row = perfdb.measure("r", parse_events(events)[0])
    assert row is not None and row.median_step_s == 1e308


def test_the_calibration_holds_a_measurement_far_from_every_prediction(runs_root):
    write(runs_root, "far", [run_start(500.0), *steps(501.0, 1, [1e308] * 5)])
    con = summarize.connect(runs_root)
    summarize.ingest(con, runs_root)
    found = perfdb.planner_measurements(perfdb.measurements(con))
    assert 0 < calibrate(found)["h200"] <= 1  # the prediction over it underflows to 0


def test_the_attention_mask_is_part_of_the_key():
    causal = {**run_start(0.0), "config": {**run_start(0.0)["config"], "attention_mask": "causal"}}
    assert perfdb.perf_key(parse_event(causal)) != perfdb.perf_key(parse_event(run_start(0.0)))


@pytest.fixture
def runs_root(tmp_path):
    """Four runs: a (1.00 s), b (1.04 s, 4% slower), c (1.10 s, 10% slower than a) of one key,
    and d on 4 devices (another key, 2.00 s)."""
    warmup = [5.0, 5.0, 5.0]
    for run_id, time, step_s, devices in (
        ("a", 100.0, 1.00, 8),
        ("b", 200.0, 1.04, 8),
        ("c", 300.0, 1.10, 8),
        ("d", 400.0, 2.00, 4),
    ):
        events = [run_start(time, devices), *steps(time + 1, 1, warmup + [step_s] * 5)]
        write(tmp_path, run_id, events)
    return tmp_path


def test_check_flags_a_run_more_than_5_percent_slower_than_the_best_earlier(runs_root):
    con = summarize.connect(runs_root)
    summarize.ingest(con, runs_root)
    checks = {c.run_id: c for c in perfdb.check(perfdb.measurements(con))}
    assert checks["a"].best_earlier_s is None and not checks["a"].flagged
    assert checks["b"].slower == pytest.approx(0.04) and not checks["b"].flagged
    assert checks["c"].best_earlier_run == "a" and checks["c"].slower == pytest.approx(0.10)
    assert checks["c"].flagged
    assert checks["d"].best_earlier_s is None and not checks["d"].flagged


def test_perf_check_command_exits_1_when_a_listed_run_is_flagged(runs_root, capsys):
    assert main(["perf", "check", str(runs_root), "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows if r["flagged"]] == ["c"]
    assert main(["perf", "check", str(runs_root), "--run", "b"]) == 0
    assert "b" in capsys.readouterr().out
    assert main(["perf", "check", str(runs_root), "--run", "zz"]) == 2


def test_perf_check_names_the_runs_it_could_not_check(runs_root, capsys):
    write(runs_root, "short", [run_start(500.0), *steps(501.0, 1, [1.0] * 3)])
    write(runs_root, "zero", [run_start(600.0), *steps(601.0, 1, [0.0] * 5)])
    assert main(["perf", "check", str(runs_root)]) == 1
    out = capsys.readouterr().out
    assert out.endswith("runs without a steady step time, not checked:\n  short\n  zero\n")
    assert main(["perf", "check", str(runs_root), "--json"]) == 1
    assert "not checked:\n  short\n  zero\n" in capsys.readouterr().err


def test_perf_check_that_would_check_nothing_is_one_line_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["perf", "check", str(empty)]) == 2
    assert capsys.readouterr().err == (
        f"titan perf check: error: runs root {empty} holds no runs: nothing to check\n"
    )
    assert list(empty.iterdir()) == []  # no database written
    write(tmp_path / "runs", "short", [run_start(0.0), *steps(1.0, 1, [1.0] * 3)])
    assert main(["perf", "check", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "has a steady step time" in err and "nothing checked; runs read: 1" in err


def test_planner_measurements_from_the_perf_table(runs_root):
    write(runs_root, "cpu", [run_start(500.0, 1, "cpu"), *steps(501.0, 1, [1.0] * 5)])
    write(runs_root, "new", [run_start(600.0, 1, "Mystery X1"), *steps(601.0, 1, [1.0] * 5)])
    con = summarize.connect(runs_root)
    summarize.ingest(con, runs_root)
    rows = perfdb.measurements(con)
    assert [r.run_id for r in rows] == ["a", "b", "c", "d", "cpu", "new"]
    found = perfdb.planner_measurements(rows)
    assert [m.gpu.name for m in found] == ["h200"] * 4 + ["cpu"]  # no catalog entry: left out
    m = found[0]
    assert (m.layout.dp, m.seq_len, m.batch_sequences, m.step_s) == (8, 128, 16, 1.0)
    assert m.precision.attention == "flash" and m.precision.compute_dtype == "bfloat16"
    assert 0 < calibrate(found[:4])["h200"] <= 1


def test_perf_check_reads_a_read_only_runs_root(tmp_path):
    root = copy_sample_runs(tmp_path / "runs")
    before = file_tree(root)
    done = titan(read_only(root), "perf", "check", "--json", str(root))
    assert done.returncode == 1, done.stderr  # a sample run is flagged (README)
    assert done.stderr == (
        f"titan perf check: {root} cannot be written: its records are only read; database: "
        f"{summarize.cached_database_path(root)}\n"
    )
    flagged = [c["run_id"] for c in json.loads(done.stdout) if c["flagged"]]
    assert flagged == ["tiny-watchdog-stall"]
    assert file_tree(root) == before
