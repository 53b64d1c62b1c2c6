"""bench/roofline.py on the profiled llama3-1b step of bench/results/: the rows' FLOPs are the
model's work, and the trace's time is split per step."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from bench_modules import bench_module

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
# llama3-1b at B8 x S2048: 16 layers, 32 query heads of 64
LAYERS, B, S, H, HD = 16, 8, 2048, 32, 64


def test_attention_counts_one_branch_of_the_document_mask_cond():
    roofline = bench_module("roofline")
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
    roofline = bench_module("roofline")
    saved = json.loads((RESULTS / "roofline-llama3-1b-nvidia-h200.json").read_text())
    trace = json.load(gzip.open(RESULTS / "roofline-llama3-1b-trace.json.gz", "rt"))
    hlo = roofline.Hlo(gzip.open(RESULTS / "roofline-llama3-1b-step-hlo.txt.gz", "rt").read())
    rows = {r["row"]: r for r in roofline.rows(trace, hlo, 3, causal=True)}
    assert rows["input_scatter_fusion.64"]["calls_per_step"] == 1  # the embedding's gradient
    for row in saved["rows"][:5]:
        assert rows[row["row"]]["seconds"] == pytest.approx(row["seconds"])


CUBLAS = (
    'custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":'
    '{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"]}}}'
)
ROLLED_HLO = """\
HloModule jit__step

%body (p: (s32[], bf16[8,64])) -> (s32[], bf16[8,64]) {
  %p = (s32[], bf16[8,64]{1,0}) parameter(0)
  %x = bf16[8,64]{1,0} get-tuple-element(%p), index=1
  %w = bf16[64,64]{1,0} constant({...})
  %gemm = (bf16[8,64]{1,0}, s8[0]{0}) custom-call(%x, %w), {CUBLAS}
  ROOT %t = (s32[], bf16[8,64]{1,0}) tuple(%p, %gemm)
}

%cond (c: (s32[], bf16[8,64])) -> pred[] {
  %c = (s32[], bf16[8,64]{1,0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (a: bf16[8,64]) -> bf16[8,64] {
  %a = bf16[8,64]{1,0} parameter(0)
  %w0 = bf16[64,64]{1,0} constant({...})
  %head = (bf16[8,64]{1,0}, s8[0]{0}) custom-call(%a, %w0), {CUBLAS}
  %init = (s32[], bf16[8,64]{1,0}) tuple(%a, %a)
  %while = (s32[], bf16[8,64]{1,0}) while(%init), condition=%cond, body=%body, {TRIPS}
  ROOT %out = bf16[8,64]{1,0} get-tuple-element(%while), index=1
}
""".replace("{CUBLAS}", CUBLAS).replace("{TRIPS}", 'backend_config={"known_trip_count":{"n":"12"}}')


def test_a_rolled_loop_body_counts_once_per_trip():
    roofline = bench_module("roofline")
    hlo = roofline.Hlo(ROLLED_HLO)
    assert hlo.executions("head") == 1
    assert hlo.executions("gemm") == 12  # the while's known_trip_count
    cublas = hlo.custom_calls(roofline.re.compile(r"__cublas\$"))
    per_call = 2.0 * 8 * 64 * 64
    assert sum(hlo.executions(n) * hlo.dot_flops(n) for n in cublas) == 13 * per_call
