"""The Llama model: published parameter counts (abstract shapes, nothing allocated)."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import print_saved_residuals

from titan.models.llama import Llama
from titan.ops import Ops
from titan.shapes import PRESETS


def abstract_param_count(preset: str) -> int:
    model = Llama(PRESETS[preset], Ops("cpu"))

    def init():
        tokens = jnp.zeros((1, 8), jnp.int32)
        return model.init(jax.random.key(0), tokens, tokens, tokens, tokens)

    return sum(leaf.size for leaf in jax.tree.leaves(nn.unbox(jax.eval_shape(init))))


@pytest.mark.parametrize(
    ("preset", "published"),
    [("llama3-8b", 8.03e9), ("llama3-70b", 70.55e9), ("llama3-405b", 405.85e9)],
)
def test_presets_match_published_parameter_counts(preset, published):
    count = abstract_param_count(preset)
    assert abs(count - published) / published < 1e-3
    assert count == PRESETS[preset].param_count()


def test_tiny_is_a_few_million_parameters():
    shape = PRESETS["tiny"]
    assert 2e6 < dataclasses.replace(shape, vocab_size=4096).param_count() < 10e6


def _residuals_and_grads(remat: str, document_mask: bool = True) -> tuple[list[str], dict]:
    """What the backward pass keeps (descriptions) and the gradients of a 2-layer float32
    model whose attention is the Pallas kernel (interpreted on CPU), on two packed documents."""
    tiny = PRESETS["tiny"]
    cfg = dataclasses.replace(tiny, vocab_size=64, n_layers=2, d_model=64, n_heads=4, ffn_dim=96)
    ops = Ops("cpu", {"attention": "pallas"})
    model = Llama(cfg, ops, remat=remat).clone(document_mask=document_mask)
    tokens = jax.random.randint(jax.random.key(1), (1, 32), 0, 64)
    positions = jnp.broadcast_to(jnp.arange(32), (1, 32))
    segments = (positions >= 12).astype(jnp.int32)
    init = Llama(cfg, ops.unforced()).init
    params = nn.unbox(init(jax.random.key(0), tokens, positions, segments, tokens))

    def loss(p):
        return jnp.mean(model.apply(p, tokens, positions, segments, tokens))

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, params)
    return printed.getvalue().splitlines(), jax.grad(loss)(params)


def _same(a: dict, b: dict) -> bool:
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return all(jnp.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in leaves)


@pytest.mark.slow
def test_dots_attention_remat_keeps_the_attention_kernel_output_and_the_same_gradients():
    dots, dots_grads = _residuals_and_grads("dots")
    kept, kept_grads = _residuals_and_grads("dots-attention")
    _, reference = _residuals_and_grads("none")
    # Two more residuals, stacked over the layers by the scan: the kernel's output
    # (layers, B, S, H, D) and its float32 log-sum-exp (layers, B, H, S).
    assert len(kept) == len(dots) + 2
    lse = "f32[2,1,4,32] output of scan"
    assert not any(lse in d for d in dots) and any(lse in d for d in kept)
    assert _same(dots_grads, reference) and _same(kept_grads, reference)


@pytest.mark.slow
def test_causal_attention_mask_lets_documents_see_earlier_ones():
    _, document = _residuals_and_grads("none")
    _, causal = _residuals_and_grads("none", document_mask=False)
    assert not _same(document, causal)


@pytest.mark.slow
def test_unrolled_layer_loop_has_no_while_loop_and_the_same_loss_and_gradients():
    cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=64, n_layers=4, d_model=32, ffn_dim=48)
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))
    segments = jnp.zeros((2, 16), jnp.int32)
    model = Llama(cfg, Ops("cpu"), remat="dots")
    params = nn.unbox(model.init(jax.random.key(0), tokens, positions, segments, tokens))

    def value_and_grad(unroll: int):
        stage = model.clone(layer_unroll=unroll)
        loss = lambda p: jnp.mean(stage.apply(p, tokens, positions, segments, tokens))  # noqa: E731
        step = jax.jit(jax.value_and_grad(loss)).lower(params).compile()
        return step(params), step.as_text()

    (rolled, rolled_grads), rolled_hlo = value_and_grad(1)
    for unroll in (0, 2):
        (loss, grads), hlo = value_and_grad(unroll)
        assert jnp.allclose(loss, rolled, rtol=1e-6) and _same(grads, rolled_grads)
        assert (" while(" in hlo) == (unroll == 2)
    assert " while(" in rolled_hlo
