"""The planner's activation bytes (``titan.remat.REMAT_POLICIES``' ``saved``, and the loss's
residuals in ``titan.planning.memory``) are what JAX saves for the backward pass of Titan's
Llama: the residuals of a small model, counted with ``saved_residuals`` (tracing only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from titan.models.llama import LlamaStage
from titan.ops import Ops
from titan.planning.memory import HEAD_SAVED_PER_D, LOGIT_BYTES, layer_activation_bytes
from titan.shapes import ModelConfig

MODEL = ModelConfig("probe", 1000, 256, 3, 2, 1, 384)
SEQ, BATCH = 256, 2


def _residual_bytes_per_token(remat: str, ops: dict[str, str]) -> tuple[float, float]:
    """(bytes per token of one layer's stacked residuals, bytes per token of the others),
    with bfloat16 parameters and compute; the parameters themselves are not counted."""
    module = LlamaStage(MODEL, Ops("cpu", ops), MODEL.n_layers, remat=remat, layer_unroll=1)
    tokens = jnp.zeros((BATCH, SEQ), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(SEQ), (BATCH, SEQ))
    segments = jnp.ones((BATCH, SEQ), jnp.int32)
    shapes = jax.eval_shape(
        lambda: module.init(jax.random.key(0), tokens, positions, segments, tokens)
    )
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), shapes)

    def loss(p):
        return module.apply(p, tokens, positions, segments, tokens).mean()

    stacked = other = 0
    for aval, source in saved_residuals(loss, params):
        if "argument" in source:
            continue
        size = int(np.prod(aval.shape)) * aval.dtype.itemsize
        if aval.shape and aval.shape[0] == MODEL.n_layers:
            stacked += size
        else:
            other += size
    per_token = BATCH * SEQ
    return stacked / MODEL.n_layers / per_token, other / per_token


@pytest.mark.parametrize("remat", ["none", "dots", "dots-attention", "full"])
@pytest.mark.parametrize(
    ("ops", "attention", "swiglu"),
    [
        ({"attention": "pallas", "swiglu": "pallas"}, "flash", "fused"),
        ({}, "materialized", "native"),
    ],
)
def test_saved_bytes_per_layer_are_what_jax_saves(remat, ops, attention, swiglu):
    stacked, _ = _residual_bytes_per_token(remat, {**ops, "cross_entropy": "native"})
    priced = layer_activation_bytes(MODEL, SEQ, remat, 2, attention, swiglu)
    assert priced.replicated + priced.sharded == pytest.approx(stacked, rel=1e-3)


def test_the_loss_keeps_its_norm_inputs_and_the_float32_logits_unless_chunked():
    _, native = _residual_bytes_per_token("full", {"cross_entropy": "native"})
    _, chunked = _residual_bytes_per_token("full", {"cross_entropy": "chunked"})
    d, v = MODEL.d_model, MODEL.vocab_size
    assert native == pytest.approx(HEAD_SAVED_PER_D * d + LOGIT_BYTES * v, rel=0.01)
    assert chunked == pytest.approx(HEAD_SAVED_PER_D * d, rel=0.02)
