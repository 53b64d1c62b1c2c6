"""bench/tpu.py: what it reads from a run record, and the MFU it recomputes."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from bench_modules import bench_module

REPO = Path(__file__).resolve().parents[2]
# A real record: the 0.32B shape on one TPU v5e, --remat none, 8 steps (bench/tpu.py's shape).
SAMPLE = REPO / "tests" / "fixtures" / "tpu_v5e_run"


def test_train_record_reads_the_median_after_warmup_and_the_compiled_program():
    tpu = bench_module("tpu")
    record = tpu.train_record(SAMPLE)
    events = [json.loads(line) for line in (SAMPLE / "events.jsonl").read_text().splitlines()]
    steps = [e["tokens_per_s"] for e in events if e["type"] == "step" and e.get("tokens_per_s")]
    assert record["tok_s"] == statistics.median(steps[tpu.WARMUP_STEPS :])
    memory = next(e for e in events if e["type"] == "compile")["memory"]
    expected = (
        memory["argument_bytes"]
        + memory["output_bytes"]
        - memory["alias_bytes"]
        + memory["temp_bytes"]
    )
    assert record["program_bytes"] == expected
    assert record["status"] == "completed"


def test_train_record_of_a_run_that_wrote_nothing(tmp_path):
    record = bench_module("tpu").train_record(tmp_path)
    assert record["tok_s"] is None and record["program_bytes"] is None


def test_mfu_divides_the_model_flops_by_the_peak():
    tpu = bench_module("tpu")
    shape = tpu.SMALL
    from titan.flops import model_flops_per_token

    flops = model_flops_per_token(shape.model(), shape.seq, "causal")
    assert tpu.mfu(shape, 1000.0, 2e14)["causal"] == pytest.approx(1000.0 * flops / 2e14)
    assert tpu.mfu(shape, None, 2e14) == {"causal": None, "full": None}


def test_markdown_rows_name_the_program_and_its_ratio(tmp_path):
    tpu = bench_module("tpu")
    shutil.copytree(SAMPLE, tmp_path / "run")
    titan_run = {**tpu.train_record(tmp_path / "run"), "mfu_recomputed": {"causal": 0.5}}
    titan_run["mfu_recomputed"]["full"] = 0.55
    baseline = {"tok_s": titan_run["tok_s"] / 1.25, "mfu_recomputed": {"causal": 0.4, "full": 0.44}}
    report = {
        "device_kind": "TPU v5 lite",
        "peak_flops": 197e12,
        "peak_source": "datasheet",
        "default_run": {"rc": 0, "wall_s": 51.0, "mfu": {"peak_kind": "datasheet_dense_bfloat16"}},
        "ops_check": {"rc": 0, "wall_s": 40.0},
        "shapes": [
            {
                "shape": {"name": "0.32b"},
                "titan": titan_run,
                "baseline": baseline,
                "titan_over_baseline": 1.25,
            }
        ],
    }
    table = tpu.markdown(report)
    assert "| 0.32b | titan defaults |" in table and "| 1.250 |" in table
    assert "| 0.32b | plain JAX | dots |" in table
    assert "exit 0, 51 s" in table
