"""Titan's DiT (:mod:`titan.models.dit`) behind the model seam.

A chunk is a :class:`titan.models.dit.DitStage` with the chunk's blocks, the embedding on the
first chunk and the final layer and loss on the last; parameters keep their names in every chunk
and blocks stack on axis 0, so chunks re-cut as the Llama's. A batch (:mod:`titan.data.images`)
is ``{"noisy": (B, H, W, C), "t": (B,), "labels": (B,) int32, "target": (B, H, W, C),
"weight": (B,)}``, float32 unless said: the first chunk takes ``noisy``, every chunk the
timesteps and labels (only the first uses them), the loss the target and weight. What crosses a
chunk boundary is (B, 1 + N, E): the conditioning row and the N patch tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp

from titan.flops import training_flops_per_token
from titan.models.adapters.base import ImageModelAdapter, PyTree, StageInputs, cast_tree
from titan.models.adapters.flax_stages import FlaxStages
from titan.models.dit import DitStage
from titan.models.layer_stack import INIT_LAYER_UNROLL
from titan.ops import Ops
from titan.parallel.chunks import Chunk, whole_model
from titan.shapes import ModelConfig


def image_batch_shapes(
    batch_size: int, image_shape: tuple[int, int, int]
) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a diffusion batch (:mod:`titan.data.images`) of (H, W, C) images."""
    image = jax.ShapeDtypeStruct((batch_size, *image_shape), jnp.float32)
    rows = jax.ShapeDtypeStruct((batch_size,), jnp.float32)
    labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    return {"noisy": image, "t": rows, "labels": labels, "target": image, "weight": rows}


def image_stage_inputs(batch: dict[str, Any]) -> StageInputs:
    """A diffusion batch split: the noisy images enter the first chunk, timesteps and labels go
    to every chunk, target and weight to the loss."""
    return StageInputs(
        batch["noisy"],
        {"t": batch["t"], "labels": batch["labels"]},
        {"target": batch["target"], "weight": batch["weight"]},
    )


@dataclass(frozen=True)
class DitAdapter(FlaxStages):
    """Titan's DiT as a :class:`titan.models.adapters.base.ModelAdapter`.

    Attributes:
        config: the model shape (``family == "dit"``).
        ops: semantic operators.
        remat: the remat policy of every block.
        layer_unroll: blocks per iteration of the layer scan (0: chosen by depth).
        param_dtype: dtype of the master weights.
    """

    config: ModelConfig
    ops: Ops
    remat: str = "none"
    layer_unroll: int = 0
    param_dtype: Any = jnp.float32
    family: str = "dit"
    layer_axis: int = 0

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        cfg = self.config
        return (cfg.image_size, cfg.image_size, cfg.channels)

    def module(self, chunk: Chunk) -> DitStage:
        """The flax module of ``chunk``."""
        return DitStage(
            self.config,
            self.ops,
            chunk.n_layers,
            has_embedding=chunk.first,
            has_head=chunk.last,
            remat=self.remat,
            layer_unroll=self.layer_unroll,
            param_dtype=jnp.dtype(self.param_dtype),
        )

    def token_flops(self) -> tuple[dict[str, float], dict[str, float]]:
        """Training FLOPs per patch token (a DiT's FLOPs per image over its N patches;
        :func:`titan.flops.token_flops`)."""
        return training_flops_per_token(self.config, self.config.patches, self.remat)

    def boxed_params(self, chunk: Chunk, key: jax.Array) -> PyTree:
        """``chunk``'s parameters as ``nn.LogicallyPartitioned`` boxes."""
        cfg = self.config
        inputs = jnp.zeros((1, *self.image_shape), jnp.float32)
        if not chunk.first:
            inputs = jnp.zeros((1, 1 + cfg.patches, cfg.d_model), jnp.float32)
        t, labels = jnp.zeros((1,), jnp.float32), jnp.zeros((1,), jnp.int32)
        target, weight = jnp.zeros((1, *self.image_shape), jnp.float32), jnp.ones((1,))
        creator = self.module(chunk).clone(ops=self.ops.unforced(), layer_unroll=INIT_LAYER_UNROLL)
        return creator.init(key, inputs, t, labels, target, weight)["params"]

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        return image_batch_shapes(batch_size, self.image_shape)

    def stage_inputs(self, batch: dict[str, Any]) -> StageInputs:
        return image_stage_inputs(batch)

    def activation(self, rows: int, dtype: jnp.dtype) -> tuple[tuple[int, ...], jnp.dtype]:
        return (rows, 1 + self.config.patches, self.config.d_model), dtype

    def loss_terms(self) -> tuple[str, ...]:
        return ()

    def forward(
        self,
        chunk: Chunk,
        params: PyTree,
        x: jax.Array,
        every: dict[str, jax.Array],
        last: dict[str, jax.Array],
        dtype: jnp.dtype,
    ) -> jax.Array:
        if chunk.first:
            x = x.astype(dtype)
        outputs = self.module(chunk).apply(
            {"params": cast_tree(params, dtype)},
            x,
            every["t"],
            every["labels"],
            last.get("target"),
            last.get("weight"),
        )
        outputs = cast(jax.Array, outputs)  # apply without mutable= returns the output alone
        return jnp.mean(outputs) if chunk.last else outputs

    def predict(
        self, params: PyTree, noisy: jax.Array, t: jax.Array, labels: jax.Array, dtype: jnp.dtype
    ) -> jax.Array:
        """The whole model's (B, H, W, C) float32 prediction (what the samplers step with)."""
        module = self.module(whole_model(self.n_layers))
        out = module.apply({"params": cast_tree(params, dtype)}, noisy.astype(dtype), t, labels)
        return cast(jax.Array, out)  # apply without mutable= returns the output alone


_SEAM: type[ImageModelAdapter] = DitAdapter  # mypy checks the family against the seam
