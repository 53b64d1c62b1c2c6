"""What the families Titan builds itself as flax stages (its Llama and its DiT) share behind the
model seam: layers stacked along axis 0 under the ``layers`` key, parameters created by running a
chunk's module, no state besides the parameters."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax

from titan.models.adapters.base import PyTree
from titan.parallel.chunks import Chunk, whole_model


class FlaxStages:
    """Methods of :class:`titan.models.adapters.base.ModelAdapter` common to Titan's own flax
    families. A subclass has ``family``, ``config`` (a :class:`titan.shapes.ModelConfig`) and
    ``boxed_params(chunk, key)``: the chunk's parameters as ``nn.LogicallyPartitioned`` boxes."""

    family: str
    config: Any
    boxed_params: Any  # (chunk, key) -> the chunk's boxed parameters (a method of the subclass)

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    def describe(self) -> dict[str, Any]:
        return {"family": self.family, "layers_by": "titan"}

    def param_count(self) -> int:
        return self.config.param_count()

    def abstract_params(self, chunk: Chunk) -> tuple[PyTree, PyTree]:
        boxed = jax.eval_shape(functools.partial(self.boxed_params, chunk), jax.random.key(0))
        return nn.unbox(boxed), nn.get_partition_spec(boxed)

    def init_params(self, key: jax.Array) -> PyTree:
        """The whole model's initial parameters for ``key`` (the layouts cut chunks from it,
        so every layout starts from the same values)."""
        return nn.unbox(self.boxed_params(whole_model(self.n_layers), key))

    def is_layer_stacked(self, path: tuple) -> bool:
        return any(getattr(key, "key", None) == "layers" for key in path)
