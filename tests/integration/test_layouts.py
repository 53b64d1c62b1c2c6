"""The SPMD layout: on 8 CPU devices every mesh gives the single-device losses."""

from __future__ import annotations

import jax
import pytest
from helpers import events, run_in_process

LAYOUTS = [
    {"dp": 8},
    {"dp": 2, "fsdp": 4},
    {"dp": 2, "fsdp": 2, "tp": 2},
    {"dp": 1, "fsdp": 1, "tp": 4},
]


@pytest.fixture(scope="module")
def single_device_losses(corpus_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    options = _options(corpus_dir, root, "one", {"dp": 1})
    _, run_dir = run_in_process(options)
    return [e["loss"] for e in events(run_dir, "step")]


def _options(corpus_dir, root, run_id, layout):
    return {
        "data": str(corpus_dir),
        "vocab_size": 512,
        "seq_len": 32,
        "batch_size": 8,
        "steps": 3,
        "runs_root": str(root),
        "run_id": run_id,
        "compute_dtype": "float32",
        **layout,
    }


def test_eight_devices_are_present():
    assert len(jax.devices()) == 8


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_mesh_layout_matches_single_device_loss(layout, single_device_losses, corpus_dir, tmp_path):
    _, run_dir = run_in_process(_options(corpus_dir, tmp_path, "mesh", layout))
    start = events(run_dir, "run_start")[0]
    expected_mesh = {"data": 1, "fsdp": 1, "tensor": 1} | {
        {"dp": "data", "fsdp": "fsdp", "tp": "tensor"}[k]: v for k, v in layout.items()
    }
    assert start["layout"]["mesh"] == expected_mesh
    losses = [e["loss"] for e in events(run_dir, "step")]
    assert losses == pytest.approx(single_device_losses, rel=2e-5)


@pytest.mark.slow
def test_gradient_accumulation_matches_single_device_loss(
    single_device_losses, corpus_dir, tmp_path
):
    layout = {"dp": 2, "fsdp": 2, "microbatches": 2}
    _, run_dir = run_in_process(_options(corpus_dir, tmp_path, "accumulated", layout))
    start = events(run_dir, "run_start")[0]
    assert start["layout"]["microbatches"] == 2
    assert start["config"]["microbatches"] == 2
    losses = [e["loss"] for e in events(run_dir, "step")]
    assert losses == pytest.approx(single_device_losses, rel=2e-5)
