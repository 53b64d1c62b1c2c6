"""The SPMD step's compiled program on 8 CPU devices: activations stay split over the batch
axes (data x fsdp) end to end, so no all-gather grows with the global batch or with dp, and XLA
never falls back to replicating a tensor ("involuntary full rematerialization").

Parameter all-gathers (FSDP gathering a weight before use) are expected: each produces at most
one whole parameter, whatever the batch and dp; dp1 x fsdp8 (no dp) is the reference. An
activation all-gather shows as a floating-point all-gather whose size changes with the global
batch. The embedding lookup gathers token ids (integers, 1 / E of the activations' size).
"""

from __future__ import annotations

import re

import pytest
from helpers import trainer_of

from titan.config import TrainConfig
from titan.ops import Ops
from titan.shapes import ModelConfig

MODEL = ModelConfig("custom", 4096, 64, 2, 4, 2, 128)
SEQ_LEN = 64
BATCH_SIZE = 16
REFERENCE = (1, 8, 1)
MESHES = [(2, 4, 1), (4, 2, 1), (2, 2, 2)]
REMAT_WARNING = "Involuntary full rematerialization"
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}
ALL_GATHER = re.compile(r"= (.+?) all-gather\(")
ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
FLOATS = ("f32", "bf16", "f16")


def all_gathers(hlo: str) -> list[tuple[str, int]]:
    """(dtype, bytes) of every array an all-gather of the compiled HLO text produces (each
    element of a combined, tuple-shaped all-gather on its own), largest first."""
    arrays = []
    for line in hlo.splitlines():
        match = ALL_GATHER.search(line)
        for dtype, dims in ARRAY.findall(match.group(1)) if match else []:
            elements = 1
            for dim in filter(None, dims.split(",")):
                elements *= int(dim)
            arrays.append((dtype, elements * DTYPE_BYTES[dtype]))
    return sorted(arrays, key=lambda array: (-array[1], array[0]))


def float_bytes(gathers: list[tuple[str, int]]) -> list[int]:
    """Sizes of the floating-point arrays (parameters, activations) among ``gathers``."""
    return [size for dtype, size in gathers if dtype in FLOATS]


def compiled_step_hlo(mesh: tuple[int, int, int], batch_size: int) -> str:
    """HLO text of the SPMD train step compiled for a dp x fsdp x tp mesh."""
    dp, fsdp, tp = mesh
    cfg = TrainConfig.of(
        dp=dp, fsdp=fsdp, tp=tp, batch_size=batch_size, seq_len=SEQ_LEN, compute_dtype="float32"
    )
    trainer = trainer_of(cfg, MODEL, Ops("cpu"))
    trainer.trace()
    trainer.compile()
    return trainer._compiled.as_text()


@pytest.fixture(scope="module")
def reference_gathers() -> list[tuple[str, int]]:
    return all_gathers(compiled_step_hlo(REFERENCE, BATCH_SIZE))


def test_all_gather_parser_reads_plain_and_combined_gathers():
    hlo = (
        "%all-gather.1 = f32[16,64,64]{2,1,0} all-gather(%p), dimensions={0}\n"
        "%all-gather.2 = (bf16[512,64]{1,0}, s32[8]{0}) all-gather(%a, %b), dimensions={0}\n"
        "%all-reduce.3 = f32[1024,1024]{1,0} all-reduce(%c)\n"
    )
    gathers = all_gathers(hlo)
    assert gathers == [("f32", 16 * 64 * 64 * 4), ("bf16", 512 * 64 * 2), ("s32", 8 * 4)]
    assert float_bytes(gathers) == [16 * 64 * 64 * 4, 512 * 64 * 2]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "dp{}-fsdp{}-tp{}".format(*m))
def test_mesh_keeps_activations_split_over_the_batch_axes(mesh, reference_gathers, capfd):
    capfd.readouterr()
    gathers = all_gathers(compiled_step_hlo(mesh, BATCH_SIZE))
    assert REMAT_WARNING not in capfd.readouterr().err
    floats = float_bytes(gathers)
    assert floats, "FSDP gathers parameters, so the program has all-gathers"
    # the embedding table and the head are the largest parameters, float32
    largest_parameter = MODEL.vocab_size * MODEL.d_model * 4
    assert max(floats) <= max(float_bytes(reference_gathers)) == largest_parameter
    assert float_bytes(all_gathers(compiled_step_hlo(mesh, BATCH_SIZE // 2))) == floats
    # the embedding lookup gathers its data shard's token ids, (B / dp, S) int32, over fsdp
    token_ids = BATCH_SIZE // mesh[0] * SEQ_LEN * 4
    assert all(size <= token_ids for dtype, size in gathers if dtype not in FLOATS)
