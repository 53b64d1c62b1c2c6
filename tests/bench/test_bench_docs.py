"""docs/benchmarks.md is generated from bench/results/."""

from __future__ import annotations

import json
from pathlib import Path

from bench_modules import bench_module

REPO = Path(__file__).resolve().parents[2]


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


def test_a_pipeline_row_that_ran_other_action_orders_is_marked():
    from titan.schedules import build_schedule

    report = bench_module("report")
    built = build_schedule("zero-bubble", 2, 4)
    starts = iter(range(100))
    actions = [
        [a.stage, a.chunk, a.microbatch, a.kind, next(starts), 0] for g in built.stages for a in g
    ]
    row = {"schedule": "zero-bubble", "pp": 2, "microbatches": 4, "virtual_stages": 1}
    assert report._ran_todays_orders(row | {"timing": {"actions": actions}})
    swapped = actions[:]
    swapped[2], swapped[3] = swapped[3], swapped[2]  # stage 0 ran I0 before F1, say
    swapped[2][4], swapped[3][4] = swapped[3][4], swapped[2][4]
    assert not report._ran_todays_orders(row | {"timing": {"actions": swapped}})
