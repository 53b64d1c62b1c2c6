"""The model seam: a family's chunks compose to the whole model, and re-cutting works along any
layer axis."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import trainer_of

from titan import config
from titan.config import TrainConfig, model_config
from titan.errors import TitanError
from titan.layouts.builders import LAYOUTS, build_adapter
from titan.models.adapters.llama import LlamaAdapter
from titan.ops import Ops
from titan.parallel.chunks import cut_layers, join_layers, plan_chunks, whole_model
from titan.shapes import ModelConfig

SHAPE = ModelConfig("seam", 97, 32, 4, 4, 2, 64)


def _adapter() -> LlamaAdapter:
    return LlamaAdapter(SHAPE, Ops("cpu", {}), seq_len=8)


def _batch(rows: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SHAPE.vocab_size, (rows, 9), dtype=np.int32)
    return {"tokens": tokens, "segment_ids": np.zeros((rows, 8), np.int32)}


def _host(shapes):
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=_cpu()), shapes)


def _cpu():
    return jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])


@pytest.mark.slow
def test_llama_chunks_compose_to_the_whole_model_loss():
    adapter = _adapter()
    whole = whole_model(SHAPE.n_layers)
    params = adapter.init_params(jax.random.key(0))
    inputs = adapter.stage_inputs(_batch())
    dtype = jnp.dtype(jnp.float32)
    expected = adapter.forward(whole, params, inputs.first, inputs.every, inputs.last, dtype)

    joined = join_layers([params], adapter.is_layer_stacked, adapter.layer_axis)
    x = inputs.first
    for chunk in plan_chunks(SHAPE.n_layers, 2, 1, (1, 3)):
        target = _host(adapter.abstract_params(chunk)[0])
        chunk_params = cut_layers(
            joined, target, chunk, adapter.is_layer_stacked, adapter.layer_axis
        )
        x = adapter.forward(chunk, chunk_params, x, inputs.every, inputs.last, dtype)
    assert float(x) == pytest.approx(float(expected), rel=1e-6)
    shape, _ = adapter.activation(2, dtype)
    assert shape == (2, 8, SHAPE.d_model)


@pytest.mark.parametrize("axis", [0, 1])
def test_recut_joins_and_cuts_along_the_family_layer_axis(axis):
    layers = np.arange(2 * 6 * 3, dtype=np.float32).reshape((6, 2, 3) if axis == 0 else (2, 6, 3))
    whole = {"layers": {"w": layers}, "embed": np.ones(4, np.float32)}

    def stacked(path):
        return getattr(path[0], "key", None) == "layers"

    chunks = plan_chunks(6, 3, 1)
    joined = join_layers([whole], stacked, axis)
    pieces = []
    for chunk in chunks:
        shape = list(layers.shape)
        shape[axis] = chunk.n_layers
        target = {"layers": {"w": jax.ShapeDtypeStruct(tuple(shape), np.float32, sharding=_cpu())}}
        if chunk.first:
            target["embed"] = jax.ShapeDtypeStruct((4,), np.float32, sharding=_cpu())
        pieces.append(jax.device_get(cut_layers(joined, target, chunk, stacked, axis)))
    assert [p["layers"]["w"].shape[axis] for p in pieces] == [2, 2, 2]
    rejoined = join_layers(pieces, stacked, axis)
    np.testing.assert_array_equal(rejoined["['layers']['w']"], layers)
    np.testing.assert_array_equal(rejoined["['embed']"], whole["embed"])


def test_an_unregistered_family_is_refused_naming_the_registered_ones():
    cfg = TrainConfig.of(preset="tiny")
    moe = dataclasses.replace(SHAPE, family="moe")
    with pytest.raises(TitanError) as refused:
        build_adapter(moe, cfg.model, cfg.compute, cfg.data.seq_len, Ops("cpu", {}))
    assert str(refused.value) == "the model family must be one of llama, dit, maxtext, got 'moe'"
    assert isinstance(
        build_adapter(SHAPE, cfg.model, cfg.compute, cfg.data.seq_len, Ops("cpu", {})), LlamaAdapter
    )


def test_an_unregistered_layout_is_refused_naming_the_registered_ones(monkeypatch):
    assert tuple(LAYOUTS) == config.LAYOUTS  # the --layout choices are the registered layouts
    monkeypatch.delitem(LAYOUTS, "mpmd")
    cfg = TrainConfig.of(preset="tiny", layout="mpmd", pp=2, microbatches=2, dp=1)
    with pytest.raises(TitanError) as refused:
        trainer_of(cfg, model_config(cfg.model.shape, SHAPE.vocab_size), Ops("cpu", {}))
    assert str(refused.value) == "--layout must be one of spmd, got 'mpmd'"
