"""``bench/tpu_attention.py``: its masks, its block variants and a tiny run on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bench_modules import bench_module

REPO = Path(__file__).resolve().parents[2]


def test_documents_mask_cuts_each_row_into_four_equal_documents():
    bench = bench_module("tpu_attention")
    ids = bench.segment_ids("documents", 2, 2048)
    assert ids.shape == (2, 2048) and ids.dtype == np.int32
    assert [int(n) for n in np.unique(ids[1], return_counts=True)[1]] == [512] * 4
    assert bench.segment_ids("causal", 2, 2048) is None


def test_block_variants_that_fit_the_sequence_alike_are_timed_once():
    bench = bench_module("tpu_attention")
    assert list(bench.variants(2048)) == [
        "native",
        "splash",
        "splash-128",
        "splash-256",
        "splash-1024",
    ]
    assert list(bench.variants(256)) == ["native", "splash", "splash-128"]  # 256 = 512 = 1024


@pytest.mark.slow
def test_tiny_run_on_cpu_checks_every_variant_against_the_reference(tmp_path):
    out = tmp_path / "tpu-attention.json"
    done = subprocess.run(
        [sys.executable, "bench/tpu_attention.py", "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["interpreted"] is True and report["iters"] == 2
    assert report["default_blocks"]["block_q"] == 512
    for mask in ("causal", "documents"):
        result = report["results"][mask]
        assert result["shape"] == {"B": 1, "S": 256, "H": 2, "K": 1, "D": 128}
        for name, measured in result["variants"].items():
            assert measured["ms"] > 0, name
            # bf16 against the float32 reference: rounding, not a wrong mask (that is O(1))
            assert 1e-4 < max(measured["relative_error"].values()) < 2e-2, name
    # 4 documents of 64 tokens: 4 x 64^2 of the causal row's 256^2
    causal, documents = (report["results"][m]["flops"] for m in ("causal", "documents"))
    assert documents == pytest.approx(causal * 4 * 64**2 / 256**2)
    assert done.stdout.splitlines()[-1].startswith("documents  splash-128")


def test_float32_reference_row_by_row_equals_the_whole_batch():
    import jax
    import jax.numpy as jnp

    from titan.ops import native

    bench = bench_module("tpu_attention")
    keys = jax.random.split(jax.random.key(0), 4)
    q, cotangent = (jax.random.normal(kk, (3, 16, 4, 8), jnp.bfloat16) for kk in keys[:2])
    k, v = (jax.random.normal(kk, (3, 16, 2, 8), jnp.bfloat16) for kk in keys[2:])
    ids = jnp.asarray(bench.segment_ids("documents", 3, 16))

    def attend(q, k, v, ids):
        return native.attention(q, k, v, segment_ids=ids)

    by_rows = bench.float32_reference(attend, (q, k, v, ids, cotangent))
    upcast = [x.astype(jnp.float32) for x in (q, k, v, cotangent)]
    with jax.default_matmul_precision("float32"):
        whole = bench._step(attend)(*upcast[:3], ids, upcast[3])
    assert [r.shape for r in by_rows] == [q.shape, q.shape, k.shape, v.shape]
    for got, want in zip(by_rows, whole, strict=True):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)


def test_report_renders_a_tpu_attention_file_with_its_numbers(tmp_path):
    report = bench_module("report")
    results = tmp_path / "results"
    results.mkdir()
    measured = {"ms": 3.25, "tflops_per_s": 96.4, "speedup_vs_native": 1.31}
    variant = measured | {"relative_error": {"out": 1e-3, "dq": 4e-3, "dk": 2e-3, "dv": 1e-3}}
    result = {
        "shape": {"B": 8, "S": 2048, "H": 16, "K": 8, "D": 128},
        "variants": {"splash": variant, "splash-1024": {"error": "ValueError: VMEM | full"}},
    }
    data = {
        "command": "python bench/tpu_attention.py --out x.json",
        "device": "TPU v5 lite",
        "jax": "0.10.2",
        "iters": 20,
        "warmup": 2,
        "default_blocks": {"block_q": 512},
        "results": {"documents": result},
    }
    (results / "tpu-attention-v5e.json").write_text(json.dumps(data))
    doc = report.render(results, report.DOC)
    assert "## Attention on a TPU (`bench/tpu_attention.py`, one chip)" in doc
    assert "| B8 S2048 H16 K8 D128, documents | splash | 3.250 | 96.4 | 1.31x | 4.0e-03 |" in doc
    assert "| splash-1024 | failed: ValueError: VMEM / full |" in doc
