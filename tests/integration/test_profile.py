"""Profiler traces (``--profile-steps``) and run reports (``titan report``)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import events, run_in_process
from samples import SAMPLE_RUNS, sample_run_dirs

from titan.analysis.report import write_report
from titan.analysis.trace_summary import summarize_trace
from titan.cli import main
from titan.errors import TitanError
from titan.telemetry.profile import StepProfiler
from titan.telemetry.records import RunRecord

SAMPLE_RUN_DIRS = sample_run_dirs()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _options(corpus_dir: Path, root: Path, run_id: str, **extra) -> dict:
    return {
        "data": str(corpus_dir),
        "vocab_size": 512,
        "seq_len": 32,
        "batch_size": 8,
        "steps": 4,
        "warmup_steps": 1,
        "checkpoint_every": 4,
        "runs_root": str(root),
        "run_id": run_id,
        "dp": 1,
        "compute_dtype": "float32",
        "profile_steps": "2:3",
        **extra,
    }


@pytest.fixture(scope="module")
def profiled_runs(corpus_dir, tmp_path_factory) -> dict[str, Path]:
    """Two real 4-step runs traced over steps 2 to 3: SPMD, and a 2-stage MPMD pipeline."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for name, layout in {
        "spmd": {},
        "mpmd": {"layout": "mpmd", "pp": 2, "microbatches": 2, "schedule": "gpipe"},
    }.items():
        code, runs[name] = run_in_process(_options(corpus_dir, root, name, **layout))
        assert code == 0
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["spmd", "mpmd"])
def test_profile_steps_trace_the_asked_steps_into_the_run_dir(profiled_runs, layout):
    run_dir = profiled_runs[layout]
    (profile,) = events(run_dir, "profile")
    assert profile["steps"] == profile["requested"] == [2, 3]
    assert profile["complete"] is True and "error" not in profile
    assert profile["dir"].startswith("profile/") and (run_dir / profile["dir"]).is_dir()
    assert any(f.endswith(".xplane.pb") for f in profile["files"])
    assert all((run_dir / f).stat().st_size > 0 for f in profile["files"])
    assert 0 < profile["seconds"] < 60
    kinds = [e["type"] for e in events(run_dir)]
    assert kinds.index("profile") < kinds.index("run_end")
    assert events(run_dir, "run_end")[0]["status"] == "completed"
    assert [e["step"] for e in events(run_dir, "step")] == [1, 2, 3, 4]


def _trace_runs_again(tmp_path: Path) -> None:
    """The profiler is free: a new trace starts and stops."""
    jax.profiler.start_trace(str(tmp_path / "again"))
    jax.profiler.stop_trace()


def test_an_error_inside_the_range_closes_the_trace_and_records_what_was_traced(tmp_path):
    record = RunRecord(tmp_path, "t")
    profiler = StepProfiler((1, 3), record)
    with pytest.raises(RuntimeError, match="boom"), profiler:
        profiler.step_starts(1)
        profiler.step_done(1, jnp.ones(8) * 2)
        raise RuntimeError("boom")
    record.close()
    (profile,) = events(tmp_path, "profile")
    assert profile["steps"] == [1, 1] and profile["requested"] == [1, 3]
    assert profile["complete"] is False and "error" not in profile
    assert any(f.endswith(".xplane.pb") for f in profile["files"])
    _trace_runs_again(tmp_path)


def test_a_failing_stop_is_recorded_not_raised(tmp_path):
    record = RunRecord(tmp_path, "t")
    profiler = StepProfiler((1, 1), record)
    profiler.step_starts(1)
    jax.profiler.stop_trace()  # someone else closed it: stop_trace will fail
    profiler.step_done(1, jnp.ones(8))
    profiler.stop()
    record.close()
    (profile,) = events(tmp_path, "profile")
    assert profile["complete"] is False and "RuntimeError" in profile["error"]
    _trace_runs_again(tmp_path)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3", "--profile-steps must be 'A:B' (two step numbers), got '3'"),
        ("a:b", "--profile-steps must be 'A:B' (two step numbers), got 'a:b'"),
        ("1:2:3", "--profile-steps must be 'A:B'"),
        ("0:2", "--profile-steps 0:2: need 1 <= A <= B <= --steps (6), got A=0, B=2"),
        ("3:2", "--profile-steps 3:2: need 1 <= A <= B <= --steps (6)"),
        ("2:7", "--profile-steps 2:7: need 1 <= A <= B <= --steps (6), got A=2, B=7"),
    ],
)
def test_bad_profile_steps_are_one_line_exit_2(tmp_path, capsys, value, message):
    argv = ["train", "--runs-root", str(tmp_path / "runs"), "--steps", "6"]
    assert main([*argv, "--profile-steps", value]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def _summary(report: str) -> dict[str, str]:
    section = report.split("## Summary")[1].split("##")[0]
    return dict(re.findall(r"^\| ([^|]+?) \| (.*?) \|$", section, re.M))


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path


@pytest.mark.parametrize("run_dir", SAMPLE_RUN_DIRS, ids=lambda p: p.name)
def test_report_of_each_sample_run_matches_its_events(run_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.md")
    text = (out / "report.md").read_text()
    for name in ("loss.png", "throughput.png"):
        _assert_png(out / name)
        assert f"]({name})" in text
    steps = events(run_dir, "step")
    starts = events(run_dir, "run_start")
    summary = _summary(text)
    assert summary["steps"] == str(max(e["step"] for e in steps))
    assert summary["final loss"] == f"{steps[-1]['loss']:.4f}"
    assert summary["best loss"] == f"{min(e['loss'] for e in steps):.4f}"
    assert summary["restarts"] == str(len(starts) - 1)
    assert summary["status"].startswith(events(run_dir, "run_end")[-1]["status"])
    mfu = [e["mfu"]["causal"] for e in steps if e.get("mfu")]
    if mfu:  # the GPU run
        h200 = "NVIDIA H200: 989.5 TFLOP/s per device (datasheet_dense_bfloat16)"
        assert summary["median MFU"] == f"{statistics.median(mfu):.1%} (causal, of {h200})"
        assert starts[-1]["power"]["available"]
        _assert_png(out / "mfu.png")
        _assert_png(out / "power.png")
    else:
        assert summary["median MFU"].startswith("unknown (")
        assert "MFU: unknown (" in text and "power: unavailable (" in text
        assert not (out / "mfu.png").exists() and not (out / "power.png").exists()
    assert f"| git_commit | {starts[-1]['env']['git_commit']} |" in text
    assert f"{len(starts)} attempt(s)" in text


def test_report_of_a_resumed_run_with_mfu_power_and_a_torn_line(tmp_path):
    run_dir = tmp_path / "gpu-like"
    run_dir.mkdir()
    lines = []
    energy_j = 0.0
    for event in events(SAMPLE_RUNS / "tiny-killed-resumed"):  # two attempts
        if event["type"] == "step":
            event["mfu"] = {
                "causal": 0.4,
                "full": 0.43,
                "hfu_causal": 0.5,
                "peak_flops": 989.5e12,
                "peak_kind": "datasheet_dense_bfloat16",
                "peak_source": "NVIDIA H200 datasheet",
            }
            event["energy_j"] = 700.0 * event["step_time_s"]
            energy_j += event["energy_j"]
        lines.append(json.dumps(event))
    (run_dir / "events.jsonl").write_text("\n".join(lines) + '\n{"type": "st')
    path = write_report(run_dir)
    assert path == run_dir / "report" / "report.md"
    for name in ("loss.png", "throughput.png", "mfu.png", "power.png"):
        _assert_png(path.parent / name)
    text = path.read_text()
    summary = _summary(text)
    # the run's peak over its 8 devices (forced CPU devices, named as the record names them)
    peak = "cpu: 123.7 TFLOP/s per device (datasheet_dense_bfloat16)"
    assert summary["median MFU"] == f"40.0% (causal, of {peak})"
    assert summary["energy (J)"] == f"{energy_j:,.0f}"
    assert "over 989.5 TFLOP/s (datasheet_dense_bfloat16), source: NVIDIA H200" in text
    assert "2 attempt(s)" in text and "a torn last line (12 bytes) ignored" in text


@pytest.mark.slow
def test_report_links_the_profile_trace(profiled_runs, tmp_path):
    run_dir = profiled_runs["spmd"]
    path = write_report(run_dir, tmp_path / "out")
    link = re.search(r"\]\(([^)]+)\), profiler overhead", path.read_text()).group(1)
    assert (path.parent / link).resolve() == (run_dir / events(run_dir, "profile")[0]["dir"])
    # The CPU trace's operations, per traced step (2 of them), by kind.
    (trace,) = [f for f in events(run_dir, "profile")[0]["files"] if f.endswith(".json.gz")]
    summary = summarize_trace(run_dir / trace)
    assert summary.source == "host" and summary.by_kind["matmul"] > 0
    assert sum(summary.by_kind.values()) == pytest.approx(summary.total_us)
    text = path.read_text()
    assert "### Operation time, steps 2 to 3 (host)" in text
    assert f"| matmul | {summary.by_kind['matmul'] / 2 / 1e3:.2f} |" in text


def _complete(pid: int, name: str, hlo_op: str | None, dur: float) -> dict:
    args = {} if hlo_op is None else {"hlo_op": hlo_op, "hlo_module": "jit__step"}
    return {"ph": "X", "pid": pid, "tid": 1, "ts": 0.0, "dur": dur, "name": name, "args": args}


def test_trace_summary_counts_device_kernels_by_kind(tmp_path):
    meta = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
        for pid, name in ((1, "/device:GPU:0"), (2, "/host:CPU"))
    ]
    kernels = [
        _complete(1, "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "custom-call.1", 300),
        _complete(1, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "custom-call.2", 500),
        _complete(1, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "custom-call.2", 500),
        _complete(1, "loop_multiply_fusion", "loop_multiply_fusion.3", 120),
        _complete(1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all-reduce.4", 80),
        _complete(1, "Memcpy DtoD", "copy.5", 20),
        _complete(1, "kernel without an XLA op", None, 999),
        _complete(2, "dot.9", "dot.9", 999),  # host event: the trace has device events
    ]
    path = tmp_path / "vm.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": meta + kernels}, handle)
    summary = summarize_trace(path)
    assert summary.source == "device" and summary.total_us == 1520
    assert summary.by_kind == {
        "attention": 300,
        "matmul": 1000,
        "collective": 80,
        "copy": 20,
        "fusion and other": 120,
    }
    assert summary.top[0] == ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul", 1000, 2)
    (tmp_path / "bad.trace.json.gz").write_text("not gzip")
    with pytest.raises(TitanError, match="not a readable trace"):
        summarize_trace(tmp_path / "bad.trace.json.gz")


@pytest.mark.parametrize("case", ["missing", "no-events", "no-run-start", "bad-run-start"])
def test_bad_run_dir_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case):
    run_dir = tmp_path / "run"
    if case != "missing":
        run_dir.mkdir()
    if case == "no-run-start":
        (run_dir / "events.jsonl").write_text('{"type": "step", "time": 1.0, "step": 1}\n')
    if case == "bad-run-start":
        (run_dir / "events.jsonl").write_text('{"type": "run_start", "time": "yesterday"}\n')
    before = sorted(os.walk(tmp_path))
    assert main(["report", str(run_dir), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"titan report: error: RUN_DIR {run_dir}") and err.count("\n") == 1
    assert sorted(os.walk(tmp_path)) == before


def test_an_out_that_cannot_be_created_is_one_line_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "sub"
    assert main(["report", str(SAMPLE_RUNS / "tiny-watchdog-stall"), "--out", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"titan report: error: --out {out}: cannot create it (Not a directory)\n"
    )


def test_report_goes_to_the_run_dirs_report_folder_by_default(tmp_path):
    copy = tmp_path / SAMPLE_RUN_DIRS[0].name
    shutil.copytree(SAMPLE_RUN_DIRS[0], copy)
    write_report(copy)
    assert sorted(p.name for p in copy.iterdir()) == ["config.json", "events.jsonl", "report"]


def test_report_says_when_an_asked_trace_was_not_recorded(tmp_path):
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    start = {"type": "run_start", "time": 1.0, "config": {"profile_steps": "5:9"}}
    step = {"type": "step", "time": 2.0, "step": 1, "loss": 5.0, "step_time_s": 1.0}
    (run_dir / "events.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(step) + "\n")
    text = write_report(run_dir, tmp_path / "out").read_text()
    assert "A trace of steps 5:9 was asked for and none was recorded" in text
