"""bench/roofline.py on the profiled llama3-1b step of bench/results/: the rows' FLOPs are the
model's work, and the trace's time is split per step."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
# llama3-1b at B8 x S2048: 16 layers, 32 query heads of 64
LAYERS, B, S, H, HD = 16, 8, 2048, 32, 64


def _roofline():
    spec = importlib.util.spec_from_file_location("bench_roofline", REPO / "bench" / "roofline.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_attention_counts_one_branch_of_the_document_mask_cond():
    roofline = _roofline()
    hlo = roofline.Hlo(gzip.open(RESULTS / "roofline-llama3-1b-step-hlo.txt.gz", "rt").read())
    cudnn = hlo.custom_calls(roofline.re.compile(r"__cudnn\$fmha"))
    assert len(cudnn) == 4 * LAYERS  # packed and dense, forward and backward, per layer
    causal_forward = 4.0 * B * S * S * H * HD / 2
    # each layer once: its forward, and a backward of 2.5 forwards (module docstring)
    assert roofline._attention_flops(hlo, causal=True) == pytest.approx(
        LAYERS * 3.5 * causal_forward
    )
    assert roofline._attention_flops(hlo, causal=False) == pytest.approx(
        LAYERS * 7.0 * causal_forward
    )


def test_rows_are_per_step_and_match_the_result_file():
    roofline = _roofline()
    saved = json.loads((RESULTS / "roofline-llama3-1b-nvidia-h200.json").read_text())
    trace = json.load(gzip.open(RESULTS / "roofline-llama3-1b-trace.json.gz", "rt"))
    hlo = roofline.Hlo(gzip.open(RESULTS / "roofline-llama3-1b-step-hlo.txt.gz", "rt").read())
    rows = {r["row"]: r for r in roofline.rows(trace, hlo, 3, causal=True)}
    assert rows["input_scatter_fusion.64"]["calls_per_step"] == 1  # the embedding's gradient
    for row in saved["rows"][:5]:
        assert rows[row["row"]]["seconds"] == pytest.approx(row["seconds"])
