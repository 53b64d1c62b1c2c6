"""The forward FLOPs the planner says a ``--remat`` policy redoes
(``titan.planning.models.layer_recompute_flops``) are what XLA executes: the compiled backward
of Titan's Llama, counted by ``cost_analysis()``, against the same program without remat."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from titan.models.llama import LlamaStage
from titan.ops import Ops
from titan.planning.models import layer_recompute_flops, token_flops
from titan.shapes import ModelConfig

# Two layers in a rolled loop, as the planner's accuracy draws run them (one layer would let XLA
# turn the loop into straight-line code, where it merges the recomputation with the forward).
MODEL = ModelConfig("probe", 512, 256, 2, 4, 2, 768)
SEQ, BATCH = 128, 2


@functools.cache
def _compiled_flops(remat: str, model: ModelConfig = MODEL) -> float:
    """FLOPs of the compiled gradient of the mean logits (float32, native operators on CPU)."""
    module = LlamaStage(model, Ops("cpu", {}), model.n_layers, remat=remat, layer_unroll=1)
    tokens = jnp.zeros((BATCH, SEQ), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(SEQ), (BATCH, SEQ))
    segments = jnp.ones((BATCH, SEQ), jnp.int32)
    params = module.init(jax.random.key(0), tokens, positions, segments, tokens)

    def loss(p):
        return module.apply(p, tokens, positions, segments, tokens).mean()

    analysis = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return float(analysis["flops"])


@pytest.fixture(scope="module")
def without_remat() -> float:
    """FLOPs without remat; XLA's cost analysis counts a loop's body once, whatever its trip
    count (checked here: a third layer adds no matmul FLOPs), so differences are per layer."""
    flops = _compiled_flops("none")
    deeper = _compiled_flops("none", dataclasses.replace(MODEL, n_layers=3))
    layer = BATCH * SEQ * token_flops(MODEL, SEQ, causal=False).layer_matmul
    assert abs(deeper - flops) < 0.1 * layer
    return flops


@pytest.mark.parametrize("remat", ["dots", "full"])
def test_recomputed_flops_are_what_xla_executes(remat: str, without_remat: float):
    # The native attention materializes the whole score matrix: attention counted in full.
    flops = token_flops(MODEL, SEQ, causal=False)
    predicted = BATCH * SEQ * layer_recompute_flops(flops, remat)
    executed = _compiled_flops(remat) - without_remat
    # The rest is elementwise work (softmax, norms) that the planner prices as memory traffic.
    assert executed == pytest.approx(predicted, rel=0.15)


def test_full_recomputation_skips_the_last_projection(without_remat: float):
    flops = token_flops(MODEL, SEQ, causal=False)
    whole_forward = BATCH * SEQ * (flops.layer_matmul + flops.layer_attention)
    executed = _compiled_flops("full") - without_remat
    assert executed < whole_forward - 0.8 * BATCH * SEQ * flops.layer_output
