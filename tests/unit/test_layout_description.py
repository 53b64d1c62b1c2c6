"""A trainer's description of its layout: typed fields in the process, and, in ``run_start`` and
checkpoints, the JSON form that the records written before it already hold, key for key."""

from __future__ import annotations

import json

import pytest
from helpers import trainer_of

from titan.config import TrainConfig, model_config
from titan.ops import Ops

VOCAB = 512

# (options, the JSON form that runs record for them): the tiny preset has 4 layers, the mesh
# axes are data, fsdp, tensor; SPMD records microbatches only when the step accumulates.
RECORDED = {
    "spmd-dp8": (
        {"layout": "spmd", "dp": 8},
        {
            "layout": "spmd",
            "mesh": {"data": 8, "fsdp": 1, "tensor": 1},
            "devices": 8,
            "chunks": [[0, 4]],
        },
    ),
    "spmd-accumulating": (
        {"layout": "spmd", "dp": 2, "fsdp": 2, "tp": 2, "microbatches": 2},
        {
            "layout": "spmd",
            "mesh": {"data": 2, "fsdp": 2, "tensor": 2},
            "devices": 8,
            "chunks": [[0, 4]],
            "microbatches": 2,
        },
    ),
    "mpmd-1f1b": (
        {"layout": "mpmd", "pp": 2, "dp": 2, "microbatches": 4},
        {
            "layout": "mpmd",
            "pp": 2,
            "virtual_stages": 1,
            "microbatches": 4,
            "schedule": "1f1b",
            "stage_mesh": {"data": 2, "fsdp": 1, "tensor": 1},
            "devices": 4,
            "chunks": [[0, 2], [2, 4]],
        },
    ),
    "mpmd-interleaved": (
        {
            "layout": "mpmd",
            "pp": 2,
            "dp": 1,
            "tp": 2,
            "microbatches": 2,
            "schedule": "interleaved-1f1b",
            "virtual_stages": 2,
        },
        {
            "layout": "mpmd",
            "pp": 2,
            "virtual_stages": 2,
            "microbatches": 2,
            "schedule": "interleaved-1f1b",
            "stage_mesh": {"data": 1, "fsdp": 1, "tensor": 2},
            "devices": 4,
            "chunks": [[0, 1], [1, 2], [2, 3], [3, 4]],
        },
    ),
}


def _description(options):
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", batch_size=8, **options)
    return trainer_of(cfg, model_config(cfg.model.shape, VOCAB), Ops("cpu", {})).describe()


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_json_form_is_the_one_runs_recorded_before(name):
    options, recorded = RECORDED[name]
    written = _description(options).to_json()
    assert written == recorded
    assert json.dumps(written) == json.dumps(recorded)  # the same keys in the same order


def test_the_fields_say_what_the_layout_is():
    spmd = _description({"layout": "spmd", "dp": 2, "fsdp": 2, "tp": 2, "microbatches": 2})
    assert (spmd.layout, spmd.devices, spmd.chunks) == ("spmd", 8, ((0, 4),))
    assert (spmd.pp, spmd.virtual_stages, spmd.microbatches, spmd.schedule) == (1, 1, 2, None)
    mpmd = _description({"layout": "mpmd", "pp": 2, "dp": 2, "microbatches": 4})
    assert (mpmd.layout, mpmd.devices, mpmd.mesh) == (
        "mpmd",
        4,
        {"data": 2, "fsdp": 1, "tensor": 1},
    )
    assert (mpmd.pp, mpmd.virtual_stages, mpmd.schedule) == (2, 1, "1f1b")
