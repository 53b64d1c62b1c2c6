"""The model seam: what the training layouts, checkpoints, the FLOPs model and the planner need
from a model family.

A family is plugged in as a :class:`ModelAdapter`. The layouts never build a model themselves:
they ask the adapter for a chunk's parameters (shapes, logical axes, initial values) and its
forward pass, and move what the adapter says crosses a chunk boundary. Titan's Llama
(:mod:`titan.models.adapters.llama`) is the first family; a family whose decoder stacks layers on
another axis sets :attr:`ModelAdapter.layer_axis`, and one without a token loss (diffusion)
returns its own scalar loss from the last chunk's forward pass. The state a layout trains is the
parameters and their optimizer state only: a family with state besides its parameters (an MoE
router's bias) refuses it where it builds the model (:mod:`titan.models.adapters.maxtext`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from titan.parallel.chunks import Chunk
from titan.shapes import ModelConfig

PyTree = Any  # a JAX pytree of arrays
LossAndTerms = tuple[jax.Array, dict[str, jax.Array]]  # ModelAdapter.forward with loss_terms


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StageInputs:
    """A (micro)batch split by where each part enters the model.

    Attributes:
        first: what the first chunk takes in, (B, ...) (token ids for a language model).
        every: arrays every chunk takes, each (B, ...) (document ids for attention masks).
        last: arrays only the last chunk's loss takes, each (B, ...) (next-token targets).
    """

    first: jax.Array
    every: dict[str, jax.Array]
    last: dict[str, jax.Array]


class ModelAdapter(Protocol):
    """A model family as the layouts see it.

    Attributes:
        n_layers: layers the model is cut into chunks along.
        layer_axis: the axis of a layer-stacked parameter that indexes layers (0 for Titan's
            Llama; MaxText's scanned decoders use 1).
        config: the model's shape as Titan's planner and records read it (for another family,
            the Llama of the same widths).
    """

    # Read-only: a family may hold them as properties or frozen dataclass fields.
    @property
    def n_layers(self) -> int: ...
    @property
    def layer_axis(self) -> int: ...
    @property
    def config(self) -> ModelConfig: ...

    def describe(self) -> dict[str, Any]:
        """What ``run_start`` records of the model: ``family`` (the family's name), who serves
        its layers, its shape."""
        ...

    def param_count(self) -> int:
        """Parameters of the whole model."""
        ...

    def token_flops(self) -> tuple[dict[str, float], dict[str, float]]:
        """(model, hardware) training FLOPs per token, each keyed by attention convention
        (``causal``: causal attention halved, ``full``: attention in full); hardware FLOPs
        include the forward work that the remat policy redoes."""
        ...

    def abstract_params(self, chunk: Chunk) -> tuple[PyTree, PyTree]:
        """(shapes, logical axes) of ``chunk``'s parameters: a tree of
        ``jax.ShapeDtypeStruct`` and the same tree with a ``PartitionSpec`` of logical axis
        names per leaf (mapped to mesh axes by :mod:`titan.parallel.sharding`)."""
        ...

    def init_params(self, key: jax.Array) -> PyTree:
        """The whole model's initial parameters for ``key`` (traceable: the layouts jit it into
        their shardings and cut the chunks from it, so every layout starts from the same
        values)."""
        ...

    def is_layer_stacked(self, path: tuple) -> bool:
        """Whether the parameter at ``path`` (a pytree key path) stacks the chunk's layers
        along :attr:`layer_axis` (re-cut at chunk boundaries); others belong to one chunk."""
        ...

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes and dtypes of one global batch as the data loader delivers it."""
        ...

    def stage_inputs(self, batch: dict[str, Any]) -> StageInputs:
        """Split a (micro)batch (host or device arrays of :meth:`batch_shapes`) by where each
        part enters the model."""
        ...

    def activation(self, rows: int, dtype: jnp.dtype) -> tuple[tuple[int, ...], jnp.dtype]:
        """(shape, dtype) of what crosses a chunk boundary for ``rows`` rows."""
        ...

    def loss_terms(self) -> tuple[str, ...]:
        """Names of the terms that the last chunk's loss holds besides the data loss (MaxText's
        MoE load-balancing loss, ``moe_lb_loss``), each a field of the step record
        (:class:`titan.telemetry.events.Step`); empty for most models. With any, the last
        chunk's :meth:`forward` returns ``(loss, {name: term})``, and only the SPMD layout
        trains the model."""
        ...

    def forward(
        self,
        chunk: Chunk,
        params: PyTree,
        x: jax.Array,
        every: dict[str, jax.Array],
        last: dict[str, jax.Array],
        dtype: jnp.dtype,
    ) -> jax.Array | LossAndTerms:
        """``chunk``'s forward pass in the compute ``dtype``: the activations it hands on, or,
        for the last chunk, the scalar mean loss (float32) of the rows (with its
        :meth:`loss_terms`, if any).

        Args:
            x: :attr:`StageInputs.first` for the first chunk, else the previous chunk's output.
            every, last: as :class:`StageInputs` (``last`` is used by the last chunk only).
        """
        ...


class ImageModelAdapter(ModelAdapter, Protocol):
    """A diffusion family as ``titan sample`` sees it besides the layouts' seam (DiT's)."""

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        ...

    def predict(
        self, params: PyTree, noisy: jax.Array, t: jax.Array, labels: jax.Array, dtype: jnp.dtype
    ) -> jax.Array:
        """The whole model's (B, H, W, C) float32 prediction (what the samplers step with)."""
        ...


def cast_tree(tree: PyTree, dtype: jnp.dtype) -> PyTree:
    """Every leaf of ``tree`` as ``dtype`` (parameters to the compute dtype)."""
    return jax.tree.map(lambda leaf: leaf.astype(dtype), tree)


def next_token_batch(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The batch of a next-token language model: ``tokens`` (B, S + 1) int32 (inputs and
    shifted targets) and ``segment_ids`` (B, S) int32 (document ids of the packed rows)."""
    return {
        "tokens": jax.ShapeDtypeStruct((batch_size, seq_len + 1), jnp.int32),
        "segment_ids": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32),
    }


def next_token_inputs(batch: dict[str, Any]) -> StageInputs:
    """A :func:`next_token_batch` split: ``tokens[:, :-1]`` into the first chunk, the document
    ids into every chunk, ``tokens[:, 1:]`` as the loss's targets."""
    tokens = batch["tokens"]
    return StageInputs(
        tokens[:, :-1], {"segment_ids": batch["segment_ids"]}, {"targets": tokens[:, 1:]}
    )
