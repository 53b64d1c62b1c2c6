"""The peer and attention benchmarks end to end on the CPU (``--smoke``): what they write is
what ``bench/report.py`` renders into docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(script: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TITAN_OPS"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *argv],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip


@pytest.mark.slow
def test_attention_bench_times_and_checks_each_variant_against_native(tmp_path):
    out = tmp_path / "attention.json"
    done = _bench("attention.py", "--smoke", "--iters", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"smoke stdlib", "smoke short"}
    short = results["smoke short"]
    assert short["documents_per_row"]["min"] > short["segment_bound"]  # the dense path's case
    for result in results.values():
        pallas = result["variants"]["pallas"]
        assert pallas["ms"] > 0 and result["document_flops"] > 0
        assert max(pallas["relative_error"].values()) < 0.05  # bf16 against float32 native


def _titan_result(tmp_path: Path, *argv: str) -> dict:
    """``bench/peers.py --smoke`` of Titan's defaults alone: its result."""
    out = tmp_path / "peers.json"
    done = _bench("peers.py", "--smoke", "--systems", "titan-defaults", *argv, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["results"]["smoke"]["titan-defaults"]


@pytest.mark.slow
def test_peers_bench_reports_titan_with_the_remat_it_resolved(tmp_path):
    titan = _titan_result(tmp_path, "--steps", "4", "--skip", "1")
    assert titan["remat"] == "none"  # --remat auto on the CPU
    assert titan["tokens_per_s"] > 0 and titan["time_to_first_step_s"] > 0


@pytest.mark.slow
def test_a_titan_run_stopped_at_the_timeout_reports_its_steps_or_why_not(tmp_path):
    titan = _titan_result(tmp_path, "--steps", "4", "--timeout", "1")
    assert titan["error"].startswith("exit -9")  # killed before any step was recorded
