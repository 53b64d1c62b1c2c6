"""The Llama model: published parameter counts (abstract shapes, nothing allocated)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from titan.config import PRESETS
from titan.models.llama import Llama
from titan.ops import Ops


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
    import dataclasses

    assert 2e6 < dataclasses.replace(shape, vocab_size=4096).param_count() < 10e6
