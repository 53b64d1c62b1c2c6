"""A TPU run's record reads like a GPU run's: its MFU against the chip's peak in summaries,
History and the console, and power not available, with the reason."""

from __future__ import annotations

import json
import statistics
import types
from pathlib import Path

import pytest
from samples import sample_run_dirs

from titan.analysis.summarize import summarize_run_dir
from titan.formatting import peak_label
from titan.telemetry.events import parse_events
from titan.telemetry.mfu import FlopsMeter, device_peak
from titan.telemetry.power import TPU_REASON, open_reader
from titan.telemetry.records import EVENTS_FILE
from tui.history_queries import HistoryQuery, HistoryStore
from tui.run_state import RunState

V5E = "TPU v5 lite"  # the device_kind JAX reports for a v5e chip


def tpu_record(root: Path) -> Path:
    """The sample H200 run's record as one v5e chip would have written it: its device kind,
    its power field and each step's MFU fields made by the trainer's own code."""
    source = next(d for d in sample_run_dirs() if d.name == "llama3-1b-h200")
    chip = types.SimpleNamespace(platform="tpu", process_index=0)
    _, power = open_reader(devices=[chip], process_index=0)
    peak = device_peak([V5E], 1, "bfloat16")
    lines = []
    for line in (source / EVENTS_FILE).read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "run_start":
            event["env"] = {**event["env"], "device_kinds": [V5E], "device_count": 1}
            event["power"] = power
        if event["type"] == "step":
            per_token = event["model_flops_per_token"]
            fields = FlopsMeter(per_token, per_token, peak).step_fields(event["tokens_per_s"])
            event.update(fields, energy_j=None, joules_per_token=None)
        lines.append(json.dumps(event))
    run_dir = root / "llama3-1b-v5e"
    run_dir.mkdir(parents=True)
    (run_dir / EVENTS_FILE).write_text("\n".join(lines) + "\n")
    return run_dir


def read_events(run_dir: Path) -> list:
    lines = (run_dir / EVENTS_FILE).read_text().splitlines()
    events, skipped = parse_events(json.loads(line) for line in lines)
    assert not skipped
    return events


def expected_median_mfu(run_dir: Path) -> float:
    steps = [e for e in read_events(run_dir) if e.type == "step"]
    return statistics.median(
        s.model_flops_per_token.causal * s.tokens_per_s / 197e12 for s in steps
    )


def test_a_tpu_run_is_summarized_with_its_mfu_against_the_v5e_peak(tmp_path):
    run_dir = tpu_record(tmp_path)
    summary = summarize_run_dir(run_dir)
    assert summary.median_mfu == pytest.approx(expected_median_mfu(run_dir))
    assert summary.mfu_peak == peak_label(197e12, "datasheet_dense_bfloat16", [V5E], 1)
    assert summary.mfu_peak.startswith("TPU v5 lite: 197")
    assert summary.energy_j is None and summary.energy_reason == TPU_REASON


def test_the_console_shows_a_tpu_run_with_its_mfu_peak_and_why_it_has_no_power(tmp_path):
    run_dir = tpu_record(tmp_path)
    state = RunState()
    state.apply(read_events(run_dir))
    assert state.mfu is not None and state.mfu_peak is not None
    assert state.mfu_peak.startswith("TPU v5 lite: 197")
    assert state.power_reason == TPU_REASON and state.tdp_w is None
    store = HistoryStore(tmp_path)
    store.ingest()
    [row] = store.page(HistoryQuery()).rows
    assert row.run_id == run_dir.name
    assert row.mfu == pytest.approx(expected_median_mfu(run_dir))
