"""bench/checkpoint.py's figures, recomputed from the runs' records that made
bench/results/checkpoint-nvidia-h200.json (their checkpoints were removed once measured)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_modules import bench_module

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_the_result_file_holds_what_its_records_give():
    checkpoint = bench_module("checkpoint")
    stored = json.loads((RESULTS / "checkpoint-nvidia-h200.json").read_text())["variants"]
    records = RESULTS / "checkpoint-nvidia-h200-records"
    assert {p.name for p in records.iterdir()} == set(stored)  # one record per variant
    for variant, figures in stored.items():
        measured = checkpoint.measure(records / variant)
        assert measured["checkpoint_bytes"] is None  # no checkpoint beside the record
        for key, value in measured.items():
            if key not in ("checkpoint_bytes", "badput_s"):
                assert value == pytest.approx(figures[key]), (variant, key)
        assert measured["badput_s"] == pytest.approx(figures["badput_s"]), variant


def test_a_save_costs_the_loop_what_its_steps_in_flight_take_beyond_the_median():
    checkpoint = bench_module("checkpoint")

    def step(n: int, at: float, seconds: float) -> dict:
        return {"type": "step", "step": n, "time": at, "step_time_s": seconds}

    blocking = {"type": "checkpoint", "step": 2, "time": 2.1, "seconds": 0.1}  # inside step 3
    background = {"type": "checkpoint", "step": 3, "time": 6.5, "seconds": 0.0}  # commits at 6.5
    events = [step(1, 1.0, 1.0), step(2, 2.0, 1.0), blocking, step(3, 3.2, 1.1)]
    events += [step(4, 5.3, 2.0), step(5, 6.3, 1.0), background, step(6, 7.8, 1.5)]
    assert checkpoint._in_flight(events, blocking) == {3}
    assert checkpoint._in_flight(events, background) == {4, 5}
    assert checkpoint._loop_costs(events, 1.0) == pytest.approx([0.1, 1.0])
