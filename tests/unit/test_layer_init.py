"""The parameters are created by a rolled layer loop whatever ``--layer-unroll`` says
(``titan.models.layer_stack.INIT_LAYER_UNROLL``), and hold the values an unrolled init gives."""

from __future__ import annotations

import dataclasses
import re
import sys

import jax
import numpy as np
import pytest

from titan.models.adapters.dit import DitAdapter
from titan.models.adapters.llama import LlamaAdapter
from titan.ops import Ops
from titan.shapes import PRESETS, ModelConfig

LLAMA = ModelConfig("three-layers", 512, 64, 3, 4, 2, 128)
OPS = Ops("cpu", from_env=False)


def _adapters():
    yield LlamaAdapter(LLAMA, OPS, 16)
    yield DitAdapter(dataclasses.replace(PRESETS["dit-tiny"], vocab_size=11), OPS)  # 10 digits


@pytest.mark.slow
@pytest.mark.parametrize("adapter", _adapters(), ids=lambda a: type(a).__name__)
def test_init_is_rolled_and_gives_the_unrolled_values(adapter, monkeypatch: pytest.MonkeyPatch):
    n_layers = adapter.config.n_layers
    key = jax.random.key(3)
    program = jax.jit(adapter.init_params).lower(key).compile().as_text()
    trips = re.findall(r'known_trip_count":\{"n":"(\d+)"', program)
    assert str(n_layers) in trips  # one loop over the layers, not a copy of a layer per layer

    got = adapter.init_params(key)
    monkeypatch.setattr(sys.modules[type(adapter).__module__], "INIT_LAYER_UNROLL", n_layers)
    expected = adapter.init_params(key)  # the same init, its loop unrolled
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
