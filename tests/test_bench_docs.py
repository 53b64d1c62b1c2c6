"""docs/benchmarks.md is generated from bench/results/."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _report_module():
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_benchmarks_doc_matches_the_result_files():
    report = _report_module()
    assert (REPO / "docs" / "benchmarks.md").read_text() == report.render(), (
        "docs/benchmarks.md is stale: run python bench/report.py"
    )


def test_every_table_names_its_result_file_and_numbers_come_from_it(tmp_path):
    report = _report_module()
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
