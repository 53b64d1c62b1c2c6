"""docs/benchmarks.md is generated from bench/results/."""

from __future__ import annotations

import json
from pathlib import Path

from bench_modules import bench_module

REPO = Path(__file__).resolve().parent.parent


def test_benchmarks_doc_matches_the_result_files():
    report = bench_module("report")
    assert (REPO / "docs" / "benchmarks.md").read_text() == report.render(), (
        "docs/benchmarks.md is stale: run python bench/report.py"
    )


def test_every_table_names_its_result_file_and_numbers_come_from_it(tmp_path):
    report = bench_module("report")
    doc = report.render()
    for path in sorted((REPO / "bench" / "results").iterdir()):
        assert f"`bench/results/{path.name}`" in doc
    # a changed measurement changes the document
    results = tmp_path / "results"
    results.mkdir()
    source = json.loads((REPO / "bench" / "results" / "pipeline-h200x2.json").read_text())
    source["results"][0]["tokens_per_s"] = 123_456.0
    (results / "pipeline-test.json").write_text(json.dumps(source))
    assert "| SPMD dp=2 | - | - | - | 123,456 | 1.00 |" in report.render(results, report.DOC)
