"""FLOPs per token and MFU fields against XLA's own count of the training computation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from titan.models.adapters.llama import LlamaAdapter
from titan.observability.flops import FlopsMeter, device_peak, hardware_flops_per_token
from titan.ops import Ops
from titan.parallel.chunks import whole_model
from titan.planning.models import model_flops_per_token, training_flops_per_token
from titan.shapes import ModelConfig

# XLA also counts elementwise work (norms, softmax, SiLU, the loss): 0.3 to 0.7% on top of the
# matmuls in these shapes (jax 0.10.2, XLA:CPU); the tolerance leaves room for other versions.
XLA_TOLERANCE = 0.03


def _xla_training_flops(m: ModelConfig, batch: int, seq_len: int, remat: str) -> float:
    """FLOPs of forward + backward of the mean token loss, as counted by XLA:CPU.

    The layer loop is unrolled (``layer_unroll=0``), so the count covers every layer: XLA's cost
    analysis counts a while loop's body once, whatever its trip count.
    """
    adapter = LlamaAdapter(m, Ops("cpu", {}), seq_len, remat=remat, layer_unroll=0)
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


def test_full_remat_hardware_flops_match_xla_count_but_the_dead_down_projection():
    m, seq_len, batch = ModelConfig("gqa", 512, 256, 2, 4, 2, 1024), 64, 2
    xla = _xla_training_flops(m, batch, seq_len, "full")
    formula = hardware_flops_per_token(m, seq_len, "full", "full") * batch * seq_len
    # titan.planning counts a whole layer forward as recomputed; XLA drops the recomputed MLP
    # down projection (2 d ffn per token), whose output the backward pass does not need.
    down_projection = 2 * m.d_model * m.ffn_dim * batch * seq_len
    assert formula - down_projection == pytest.approx(xla, rel=XLA_TOLERANCE)
    assert formula > model_flops_per_token(m, seq_len, "full") * batch * seq_len


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
    assert unknown.flops is None and "not in the GPU catalog" in unknown.reason
    m = ModelConfig("a", 512, 256, 2, 4, 2, 1024)
    meter = FlopsMeter(*training_flops_per_token(m, 64, "none"), unknown)
    step = meter.step_fields(tokens_per_s=1e3)
    assert step["mfu"] is None and step["mfu_reason"] == unknown.reason
    assert step["model_flops_per_token"]["causal"] > 0
