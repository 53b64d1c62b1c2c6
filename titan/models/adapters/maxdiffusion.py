"""The MaxDiffusion model API behind the model seam: diffusers' Flax ``UNet2DConditionModel``.

MaxDiffusion (Google's JAX diffusion trainer) is a fork of diffusers' Flax code; its Stable
Diffusion models are diffusers' Flax ``UNet2DConditionModel``, which ``diffusers`` 0.35.x still
ships (later releases dropped Flax). :class:`DiffusersUNetAdapter` trains that class under
Titan's SPMD layout (data parallel; its parameters are replicated) with Titan's diffusion
objectives and batches (:mod:`titan.diffusion.objectives`, :mod:`titan.data.images`): the same
batch as the DiT's (:mod:`titan.models.adapters.dit`), the class label embedded by a label table
of Titan's as the UNet's one-token ``encoder_hidden_states``. The UNet is one chunk (it has no
layer stack to cut), so it does not pipeline.

MaxDiffusion's own model classes (Wan, Flux) are not covered: ``maxdiffusion`` is not on the
package index and, from source, needs torch, TensorFlow and more, so Titan neither imports nor
tests them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from titan.errors import TitanError
from titan.models.adapters.base import ImageModelAdapter, PyTree, StageInputs, cast_tree
from titan.models.adapters.dit import image_batch_shapes, image_stage_inputs
from titan.models.dit import weighted_mse
from titan.models.llama import INIT_STD
from titan.parallel.chunks import Chunk, whole_model
from titan.shapes import ModelConfig

FORWARD_TO_TRAINING = 3.0  # forward + backward = 3 x forward (Kaplan et al. 2020, Sec. 2.1)


@dataclass(frozen=True)
class UNetShape:
    """The ``FlaxUNet2DConditionModel`` arguments Titan sets (the rest keep diffusers' defaults).

    Attributes:
        image_size, channels: the image is image_size x image_size x channels (in and out).
        labels: rows of the label table (classes plus the null label).
        block_out_channels, layers_per_block, attention_head_dim, cross_attention_dim,
        down_block_types, up_block_types, mid_block_type: as diffusers names them
            (``mid_block_type=None``: no mid block).
    """

    image_size: int
    channels: int
    labels: int
    block_out_channels: tuple[int, ...] = (32, 64)
    layers_per_block: int = 1
    attention_head_dim: int = 8
    cross_attention_dim: int = 32
    down_block_types: tuple[str, ...] = ("CrossAttnDownBlock2D", "DownBlock2D")
    up_block_types: tuple[str, ...] = ("UpBlock2D", "CrossAttnUpBlock2D")
    mid_block_type: str | None = "UNetMidBlock2DCrossAttn"


@dataclass(frozen=True)
class DiffusersUNetAdapter:
    """diffusers' Flax ``UNet2DConditionModel`` as a
    :class:`titan.models.adapters.base.ModelAdapter` (one chunk, replicated parameters)."""

    shape: UNetShape
    family: str = "diffusers-unet"
    n_layers: int = 1
    layer_axis: int = 0
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.shape.image_size, self.shape.image_size, self.shape.channels)

    @property
    def config(self) -> ModelConfig:
        """The UNet in the terms of a Titan shape, for the records: no Titan shape describes a
        UNet, so this holds what maps, the label table (``vocab_size``), the width of a label's
        embedding (``d_model``, one head), the one chunk (``n_layers``) and the image; the
        planner does not model the UNet."""
        s = self.shape
        return ModelConfig(
            self.family,
            s.labels,
            s.cross_attention_dim,
            self.n_layers,
            n_heads=1,
            n_kv_heads=1,
            ffn_dim=0,
            family=self.family,
            image_size=s.image_size,
            channels=s.channels,
        )

    def module(self, dtype: Any = jnp.float32) -> Any:
        """The ``FlaxUNet2DConditionModel`` (diffusers is imported here, on first use: it takes
        seconds and imports torch when torch is installed)."""
        from diffusers import FlaxUNet2DConditionModel

        s = self.shape
        return FlaxUNet2DConditionModel(
            sample_size=s.image_size,
            in_channels=s.channels,
            out_channels=s.channels,
            down_block_types=s.down_block_types,
            up_block_types=s.up_block_types,
            mid_block_type=s.mid_block_type,
            block_out_channels=s.block_out_channels,
            layers_per_block=s.layers_per_block,
            attention_head_dim=s.attention_head_dim,
            cross_attention_dim=s.cross_attention_dim,
            dtype=dtype,
        )

    def _init(self, key: jax.Array) -> PyTree:
        unet_key, label_key = jax.random.split(key)
        s = self.shape
        sample = jnp.zeros((1, s.channels, s.image_size, s.image_size), jnp.float32)
        context = jnp.zeros((1, 1, s.cross_attention_dim), jnp.float32)
        unet = self.module().init(unet_key, sample, jnp.zeros((1,)), context)["params"]
        table = INIT_STD * jax.random.normal(label_key, (s.labels, s.cross_attention_dim))
        return {"unet": unet, "label_table": table}

    def abstract_params(self, chunk: Chunk) -> tuple[PyTree, PyTree]:
        shapes = jax.eval_shape(self._init, jax.random.key(0))
        return shapes, jax.tree.map(lambda a: PartitionSpec(*["replicated"] * a.ndim), shapes)

    def init_params(self, key: jax.Array) -> PyTree:
        return self._init(key)

    def describe(self) -> dict[str, Any]:
        return {"family": self.family, "layers_by": f"diffusers {metadata.version('diffusers')}"}

    def param_count(self) -> int:
        shapes, _ = self.abstract_params(whole_model(1))
        return sum(leaf.size for leaf in jax.tree.leaves(shapes))

    def token_flops(self) -> tuple[dict[str, float], dict[str, float]]:
        """Training FLOPs per pixel: 3 x the forward FLOPs of one image that XLA's cost
        analysis counts, over its H x W pixels (the UNet has no closed-form count here)."""
        if "flops" not in self._cache:
            shapes, _ = self.abstract_params(whole_model(1))
            batch = image_stage_inputs(image_batch_shapes(1, self.image_shape))
            forward = functools.partial(self.forward, None, dtype=jnp.float32)
            lowered = jax.jit(forward).lower(shapes, batch.first, batch.every, batch.last)
            cost = lowered.cost_analysis()
            if cost is None:  # JAX: unavailable on this backend
                raise TitanError(
                    "maxdiffusion: XLA's cost analysis, which counts its FLOPs, is "
                    f"unavailable on {jax.default_backend()}"
                )
            cost = cost[0] if isinstance(cost, list) else cost
            pixels = self.shape.image_size**2
            self._cache["flops"] = FORWARD_TO_TRAINING * float(cost["flops"]) / pixels
        per_pixel = self._cache["flops"]
        return {"causal": per_pixel, "full": per_pixel}, {"causal": per_pixel, "full": per_pixel}

    def is_layer_stacked(self, path: tuple) -> bool:
        return False

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        return image_batch_shapes(batch_size, self.image_shape)

    def stage_inputs(self, batch: dict[str, Any]) -> StageInputs:
        return image_stage_inputs(batch)

    def activation(self, rows: int, dtype: jnp.dtype) -> tuple[tuple[int, ...], jnp.dtype]:
        return (rows, *self.image_shape), dtype

    def predict(self, params: PyTree, noisy, t, labels, dtype: jnp.dtype) -> jax.Array:
        """The (B, H, W, C) float32 prediction for NHWC ``noisy``."""
        context = jnp.take(params["label_table"], labels, axis=0)[:, None, :].astype(dtype)
        sample = noisy.astype(dtype).transpose(0, 3, 1, 2)
        out = (
            self.module(dtype)
            .apply({"params": cast_tree(params["unet"], dtype)}, sample, t, context)
            .sample
        )
        return out.transpose(0, 2, 3, 1).astype(jnp.float32)

    def loss_terms(self) -> tuple[str, ...]:
        return ()

    def forward(
        self,
        chunk: Chunk | None,
        params: PyTree,
        x: jax.Array,
        every: dict[str, jax.Array],
        last: dict[str, jax.Array],
        dtype: jnp.dtype,
    ) -> jax.Array:
        prediction = self.predict(params, x, every["t"], every["labels"], dtype)
        return jnp.mean(weighted_mse(prediction, last["target"], last["weight"]))


_SEAM: type[ImageModelAdapter] = DiffusersUNetAdapter  # mypy checks the family against the seam
