"""FLOPs per token and MFU fields against XLA's own count of the training computation."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from titan.flops import (
    layer_recompute_flops,
    model_flops_per_token,
    token_flops,
    training_flops_per_token,
)
from titan.models.adapters.llama import LlamaAdapter
from titan.ops import Ops
from titan.parallel.chunks import whole_model
from titan.shapes import ModelConfig
from titan.telemetry.mfu import FlopsMeter, device_peak, hardware_flops_per_token

# XLA also counts elementwise work (norms, softmax, SiLU, the loss): 0.3 to 0.7% on top of the
# matmuls in these shapes (jax 0.10.2, XLA:CPU); the tolerance leaves room for other versions.
XLA_TOLERANCE = 0.03


def _xla_training_flops(
    m: ModelConfig, batch: int, seq_len: int, remat: str, layer_unroll: int = 0
) -> float:
    """FLOPs of forward + backward of the mean token loss, as counted by XLA:CPU.

    By default the layer loop is unrolled (``layer_unroll=0``), so the count covers every
    layer: XLA's cost analysis counts a while loop's body once, whatever its trip count.
    """
    adapter = LlamaAdapter(m, Ops("cpu", {}), seq_len, remat=remat, layer_unroll=layer_unroll)
    chunk = whole_model(m.n_layers)
    params = adapter.abstract_params(chunk)[0]

    def loss(p, batch):
        inputs = adapter.stage_inputs(batch)
        dtype = jnp.dtype(jnp.float32)
        return adapter.forward(chunk, p, inputs.first, inputs.every, inputs.last, dtype)

    compiled = jax.jit(jax.grad(loss)).lower(params, adapter.batch_shapes(batch)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


@pytest.mark.parametrize(
    ("m", "seq_len"),
    [
        (ModelConfig("gqa", 512, 256, 2, 4, 2, 1024), 64),
        (ModelConfig("mha", 1024, 384, 3, 6, 6, 1536), 32),
    ],
)
def test_training_flops_match_xla_count(m, seq_len):
    batch = 2
    xla = _xla_training_flops(m, batch, seq_len, "none")
    # The native attention provider computes the whole (s, s) score matrix: the full convention.
    formula = model_flops_per_token(m, seq_len, "full") * batch * seq_len
    assert formula == pytest.approx(xla, rel=XLA_TOLERANCE)


def test_full_remat_hardware_flops_match_xla_count():
    m, seq_len, batch = ModelConfig("gqa", 512, 256, 2, 4, 2, 1024), 64, 2
    xla = _xla_training_flops(m, batch, seq_len, "full")
    formula = hardware_flops_per_token(m, seq_len, "full", "full") * batch * seq_len
    # The recomputation leaves out the MLP down projection (2 d ffn per token), whose output
    # the backward pass does not need (titan.flops.TokenFlops.layer_output).
    assert formula == pytest.approx(xla, rel=XLA_TOLERANCE)
    down_projection = 2 * m.d_model * m.ffn_dim * batch * seq_len
    assert abs(formula + down_projection - xla) > 2 * abs(formula - xla)
    assert formula > model_flops_per_token(m, seq_len, "full") * batch * seq_len


@functools.cache
def _rolled_loop_flops(remat: str, layers: int) -> float:
    """XLA:CPU's FLOPs of the gradient of the mean loss of a rolled layer loop
    (``layer_unroll=1``, as the planner's accuracy draws run): the cost analysis counts the
    loop's body, one layer, once."""
    m = dataclasses.replace(ROLLED, n_layers=layers)
    return _xla_training_flops(m, ROLLED_BATCH, ROLLED_SEQ, remat, layer_unroll=1)


# Two layers: one would let XLA turn the loop into straight-line code.
ROLLED, ROLLED_SEQ, ROLLED_BATCH = ModelConfig("probe", 512, 256, 2, 4, 2, 768), 128, 2


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["dots", "full"])
def test_recomputed_flops_of_a_rolled_layer_are_what_xla_executes(remat: str):
    """The forward work a policy redoes per layer (``layer_recompute_flops``) is the compiled
    program's extra FLOPs over no remat, in the rolled loop of the planner's measurements."""
    layer = ROLLED_BATCH * ROLLED_SEQ * token_flops(ROLLED, ROLLED_SEQ, causal=False).layer_matmul
    # the body is counted once: a third layer adds no matmul FLOPs
    assert abs(_rolled_loop_flops("none", 3) - _rolled_loop_flops("none", 2)) < 0.1 * layer
    # the native attention materializes the whole score matrix: attention counted in full
    flops = token_flops(ROLLED, ROLLED_SEQ, causal=False)
    predicted = ROLLED_BATCH * ROLLED_SEQ * layer_recompute_flops(flops, remat)
    executed = _rolled_loop_flops(remat, 2) - _rolled_loop_flops("none", 2)
    # the rest is elementwise work (softmax, norms) that the planner prices as memory traffic
    assert executed == pytest.approx(predicted, rel=0.15)


def test_mfu_fields_use_the_peak_and_both_conventions():
    m = ModelConfig("a", 512, 256, 2, 4, 2, 1024)
    peak = device_peak(["NVIDIA H200"], 2, "bfloat16")
    assert peak.flops == pytest.approx(2 * 989.5e12) and peak.kind == "datasheet_dense_bfloat16"
    fields = FlopsMeter(*training_flops_per_token(m, 64, "dots"), peak).step_fields(
        tokens_per_s=1e6
    )
    causal, full = (
        fields["model_flops_per_token"]["causal"],
        fields["model_flops_per_token"]["full"],
    )
    assert causal < full
    assert fields["mfu"]["causal"] == pytest.approx(causal * 1e6 / (2 * 989.5e12))
    assert fields["mfu"]["hfu_causal"] > fields["mfu"]["causal"]
    assert fields["mfu"]["peak_flops"] == peak.flops


def test_no_mfu_without_a_datasheet_peak_for_the_devices_and_dtype():
    cpu = device_peak(["cpu"], 8, "float32")
    assert cpu.flops is None and "measured float32 matmul rate" in cpu.reason
    h200_float32 = device_peak(["NVIDIA H200"], 1, "float32")
    assert h200_float32.flops is None and "computes in float32" in h200_float32.reason
    assert device_peak(["NVIDIA H200", "NVIDIA H100"], 2, "bfloat16").flops is None
    unknown = device_peak(["Quantum Accelerator 9000"], 1, "bfloat16")
    assert unknown.flops is None and "not in the accelerator catalog" in unknown.reason
    m = ModelConfig("a", 512, 256, 2, 4, 2, 1024)
    meter = FlopsMeter(*training_flops_per_token(m, 64, "none"), unknown)
    step = meter.step_fields(tokens_per_s=1e3)
    assert step["mfu"] is None and step["mfu_reason"] == unknown.reason
    assert step["model_flops_per_token"]["causal"] > 0
