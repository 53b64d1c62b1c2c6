"""The decoder's linear layers: FP8 with current scaling (numerics, gradients, training, resume
across the switch, where it is refused) and fused projections (the same values as separate
GEMMs, the same parameters)."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import events, run_in_process

from titan.config import ComputeOptions, ModelOptions, OptimizerOptions
from titan.errors import TitanError
from titan.layouts.builders import linear_layers, one_device_trainer
from titan.models.llama import LlamaStage
from titan.ops import Ops
from titan.ops.linear import OCP_FP8, Linear, float8_einsum, quantize
from titan.shapes import PRESETS

F32 = jnp.float32
# Unit roundoff of E4M3 (3 mantissa bits) and E5M2 (2): 2^-4 and 2^-3 (Micikevicius et al.
# 2022, Table 1). A product of two rounded operands is off by at most about the sum of theirs.
E4M3_U, E5M2_U = 2.0**-4, 2.0**-3
# The four linear layers of a block: Q/K/V, output, MLP in, MLP out.
SPECS = {
    "bse,ehd->bshd": ((2, 8, 32), (32, 4, 16)),
    "bshd,hde->bse": ((2, 8, 4, 16), (4, 16, 32)),
    "bse,ef->bsf": ((2, 8, 32), (32, 48)),
    "bsf,fe->bse": ((2, 8, 48), (48, 32)),
}


def _operands(spec: str, dtype=F32):
    x_shape, w_shape = SPECS[spec]
    kx, kw = jax.random.split(jax.random.key(0))
    return jax.random.normal(kx, x_shape, dtype), (jax.random.normal(kw, w_shape) * 0.02).astype(
        dtype
    )


def _relative(a, b) -> float:
    a, b = jnp.asarray(a, F32), jnp.asarray(b, F32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def _rounded(t, dtype):
    q, scale = quantize(t, dtype)
    return q.astype(F32) * scale


def test_quantize_maps_the_absolute_maximum_to_the_formats_largest_value():
    t = jnp.array([-3.0, 0.5, 1.5, 2.0])
    for dtype, top in zip(OCP_FP8, (448.0, 57344.0), strict=True):
        q, scale = quantize(t, dtype)
        assert q.dtype == dtype and float(scale) == pytest.approx(3.0 / top)
        assert float(jnp.max(jnp.abs(q.astype(F32)))) == top
    q, scale = quantize(jnp.zeros(3), OCP_FP8[0])  # no amax: scale 1, zeros stay zeros
    assert float(scale) == 1.0 and not jnp.any(q.astype(F32))


@pytest.mark.parametrize("spec", SPECS)
def test_float8_einsum_is_the_einsum_of_e4m3_rounded_operands(spec):
    x, w = _operands(spec)
    reference = jnp.einsum(spec, x, w)
    out = float8_einsum(spec, False, x, w)
    assert out.dtype == x.dtype and out.shape == reference.shape
    error = _relative(out, reference)
    assert 2.0**-9 < error < 2 * E4M3_U  # rounded (more than bf16 would), within E4M3's bound
    rounded = jnp.einsum(spec, _rounded(x, OCP_FP8[0]), _rounded(w, OCP_FP8[0]))
    np.testing.assert_allclose(out, rounded, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS)
def test_float8_gradients_use_the_e5m2_rounded_gradient_and_the_e4m3_operands(spec):
    x, w = _operands(spec)
    g = jax.random.normal(jax.random.key(2), jnp.einsum(spec, x, w).shape)
    _, pullback = jax.vjp(lambda a, b: float8_einsum(spec, False, a, b), x, w)
    dx, dw = pullback(g)
    _, exact = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), x, w)
    ex, ew = exact(g)
    assert _relative(dx, ex) < E4M3_U + E5M2_U and _relative(dw, ew) < E4M3_U + E5M2_U
    x8, w8 = _rounded(x, OCP_FP8[0]), _rounded(w, OCP_FP8[0])
    _, rounded = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), x8, w8)
    rx, rw = rounded(_rounded(g, OCP_FP8[1]))
    np.testing.assert_allclose(dx, rx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, rw, rtol=1e-5, atol=1e-6)


def test_float8_einsum_refuses_an_einsum_that_is_no_linear_layer():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="not a linear layer's einsum"):
        float8_einsum("be,be->b", False, x, x)


def test_fused_projections_equal_the_separate_ones():
    x, wq = _operands("bse,ehd->bshd")
    wk = wq[:, :2] * 2
    weights = (wq, wk, wk + 1)
    separate = Linear().project("bse,ehd->bshd", x, weights)
    fused = Linear(fused=True).project("bse,ehd->bshd", x, weights)
    assert [f.shape for f in fused] == [(2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16)]
    for a, b in zip(fused, separate, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _tiny_model(linear: Linear):
    cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=64, n_layers=2, d_model=32, ffn_dim=64)
    return LlamaStage(cfg, Ops("cpu"), cfg.n_layers, linear=linear)


def _loss_and_grads(linear: Linear, params=None):
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))
    segments = jnp.zeros((2, 16), jnp.int32)
    model = _tiny_model(linear)
    if params is None:
        params = nn.unbox(model.init(jax.random.key(0), tokens, positions, segments, tokens))

    def loss(p):
        return jnp.mean(model.apply(p, tokens, positions, segments, tokens))

    return params, *jax.value_and_grad(loss)(params)


@pytest.mark.slow
def test_float8_and_fused_llama_keep_the_parameters_and_the_loss_within_fp8_rounding():
    params, plain_loss, plain_grads = _loss_and_grads(Linear())
    for linear in (Linear(float8=True), Linear(fused=True), Linear(float8=True, fused=True)):
        same, loss, grads = _loss_and_grads(linear, params)
        assert jax.tree.structure(grads) == jax.tree.structure(plain_grads)  # same parameters
        assert float(loss) == pytest.approx(float(plain_loss), rel=0.01)
        block = grads["params"]["layers"]
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):  # gradients flow
            got, want = block[name], plain_grads["params"]["layers"][name]
            assert bool(jnp.all(jnp.isfinite(got))) and float(jnp.linalg.norm(got)) > 0
            bound = 1e-5 if not linear.float8 else 4 * (E4M3_U + E5M2_U)
            assert _relative(got, want) < bound, (linear, name)


def test_float8_is_refused_on_an_accelerator_without_fp8_and_emulated_on_the_cpu():
    float8 = ComputeOptions(matmul_dtype="float8")
    assert linear_layers(float8, "gpu", "NVIDIA H200") == Linear(float8=True)
    assert linear_layers(float8, "cpu", "cpu") == Linear(float8=True)
    assert linear_layers(float8, "rocm", "AMD Instinct MI300X").fnuz
    assert not linear_layers(float8, "rocm", "AMD Instinct MI355X").fnuz
    for kind in ("NVIDIA A100-SXM4-80GB", "TPU v5 lite", "Some GPU"):
        with pytest.raises(TitanError, match="--matmul-dtype float8 needs FP8 matmuls"):
            linear_layers(float8, "gpu", kind)
    fused = ComputeOptions(fused_projections=True)
    assert linear_layers(fused, "gpu", "NVIDIA A100-SXM4-80GB") == Linear(fused=True)


def test_a_float8_runs_model_restored_for_generation_computes_in_the_compute_dtype():
    compute = ComputeOptions(matmul_dtype="float8", fused_projections=True)
    shape = dataclasses.replace(PRESETS["tiny"], vocab_size=64, n_layers=2, d_model=32)
    trainer = one_device_trainer(
        shape, ModelOptions(), compute, OptimizerOptions(), 16, Ops("cpu", from_env=False)
    )
    assert trainer.adapter.linear == Linear(fused=True)


@pytest.mark.slow
def test_a_float8_run_learns_and_resumes_across_the_switch_both_ways(small_options):
    options = {**small_options, "run_id": "switch", "steps": 4, "matmul_dtype": "float8"}
    code, run_dir = run_in_process(options)
    assert code == 0
    losses = [e["loss"] for e in events(run_dir, "step")]
    code, _ = run_in_process({**options, "steps": 6, "matmul_dtype": "compute"}, resume=run_dir)
    assert code == 0
    code, _ = run_in_process({**options, "steps": 8, "fused_projections": True}, resume=run_dir)
    assert code == 0
    starts = events(run_dir, "run_start")
    assert [s["resumed_from_step"] for s in starts] == [None, 4, 6]
    assert [s["config"]["matmul_dtype"] for s in starts] == ["float8", "compute", "float8"]
    steps = events(run_dir, "step")
    assert [e["step"] for e in steps] == list(range(1, 9))
    losses = [e["loss"] for e in steps]
    assert losses[-1] < losses[0] - 0.3  # it learns in FP8, and keeps learning after each switch
