"""``bench/fp8.py``: the same tokens for every system, and the whole call on the CPU (``--tiny``),
whose result ``bench/report.py`` renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bench_modules import bench_module

REPO = Path(__file__).resolve().parents[2]


def test_batches_are_stdlib_bytes_with_a_document_id_per_module_the_same_every_call():
    fp8 = bench_module("fp8")
    first, again = fp8.batches(2, 64, 3), fp8.batches(2, 64, 3)
    assert len(first) == 3
    for a, b in zip(first, again, strict=True):
        assert a["tokens"].shape == (2, 65) and a["segment_ids"].shape == (2, 64)
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        assert a["tokens"].dtype == np.int32 and 0 <= a["tokens"].min() <= a["tokens"].max() < 256
    tokens, documents = fp8.stdlib_tokens(200_000)
    assert len(set(documents)) > 1 and documents == sorted(documents)  # modules in order


def test_the_loss_check_compares_the_last_steps_of_bf16_and_float8():
    fp8 = bench_module("fp8")
    results = {"bf16": {"losses": [5.0, 4.0, 2.0]}, "float8": {"losses": [5.0, 4.0, 2.2]}}
    check = fp8.loss_check(results, 2)
    assert check["mean_loss"] == {"bf16": 3.0, "float8": 3.1}
    assert check["relative_difference"] == pytest.approx(0.1 / 3)
    assert fp8.loss_check({"bf16": results["bf16"]}, 2) is None


@pytest.mark.slow
def test_fp8_bench_runs_whole_on_the_cpu_and_the_report_renders_it(tmp_path):
    out = tmp_path / "results" / "fp8-cpu.json"
    env = {k: v for k, v in os.environ.items() if k != "TITAN_OPS"}
    env["PYTHONPATH"] = str(REPO)
    argv = ["--tiny", "--systems", "bf16,float8", "--steps", "3", "--loss-steps", "4"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fp8.py"), *argv, "--loss-window", "2"]
        + ["--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    runs = data["results"]["tiny"]
    assert list(runs) == ["bf16", "float8"]
    assert all(r["tokens_per_s"] > 0 and len(r["losses"]) == 4 for r in runs.values())
    assert runs["float8"]["fp8_gemms"] == runs["float8"]["gemms"] == 0  # no cuBLAS on a CPU
    assert runs["float8"]["vs_bf16"] == pytest.approx(
        runs["float8"]["tokens_per_s"] / runs["bf16"]["tokens_per_s"]
    )
    check = data["loss_check"]["tiny"]
    assert abs(check["relative_difference"]) < 0.01  # FP8 rounding, four steps in
    assert runs["bf16"]["losses"][0] != runs["float8"]["losses"][0]  # FP8 did round
    assert done.stdout.splitlines()[-1].startswith("loss check tiny, 4 steps")  # the table last
    report = bench_module("report")
    assert "| tiny (B8 x S32, float32 master) | float8 |" in report.render(out.parent, report.DOC)
