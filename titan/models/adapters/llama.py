"""Titan's Llama (:mod:`titan.models.llama`) behind the model seam.

A chunk is a :class:`titan.models.llama.LlamaStage` with the chunk's layers, the embedding on
the first chunk and the final norm, output head and loss on the last. Every parameter keeps its
name in every chunk, so chunks re-cut by stacking ``layers`` along axis 0. A batch is
``{"tokens": (B, S + 1) int32, "segment_ids": (B, S) int32}``: the first chunk takes
``tokens[:, :-1]``, the loss ``tokens[:, 1:]``, every chunk the document ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp

from titan.flops import training_flops_per_token
from titan.models.adapters.base import (
    ModelAdapter,
    PyTree,
    StageInputs,
    cast_tree,
    next_token_batch,
    next_token_inputs,
)
from titan.models.adapters.flax_stages import FlaxStages
from titan.models.layer_stack import INIT_LAYER_UNROLL
from titan.models.llama import PLAIN, LlamaStage
from titan.ops import Ops
from titan.ops.linear import Linear
from titan.parallel.chunks import Chunk
from titan.shapes import ModelConfig


@dataclass(frozen=True)
class LlamaAdapter(FlaxStages):
    """Titan's Llama as a :class:`titan.models.adapters.base.ModelAdapter`.

    Attributes:
        config: the model shape.
        ops: semantic operators (providers chosen per backend).
        seq_len: tokens per sequence of the run.
        remat: the remat policy of every block (:class:`titan.models.llama.LlamaStage`).
        layer_unroll: blocks per iteration of the layer scan (0: chosen by depth and remat).
        document_mask: attention stays within a document; False: causal over the sequence.
        param_dtype: dtype of the master weights.
        linear: how the blocks' linear layers compute (FP8, fused projections).
    """

    config: ModelConfig
    ops: Ops
    seq_len: int
    remat: str = "none"
    layer_unroll: int = 0
    document_mask: bool = True
    param_dtype: Any = jnp.float32
    linear: Linear = PLAIN
    family: str = "llama"
    layer_axis: int = 0

    def module(self, chunk: Chunk) -> LlamaStage:
        """The flax module of ``chunk`` (the whole model for :func:`whole_model`)."""
        return LlamaStage(
            self.config,
            self.ops,
            chunk.n_layers,
            has_embedding=chunk.first,
            has_head=chunk.last,
            remat=self.remat,
            layer_unroll=self.layer_unroll,
            document_mask=self.document_mask,
            param_dtype=jnp.dtype(self.param_dtype),
            linear=self.linear,
        )

    def token_flops(self) -> tuple[dict[str, float], dict[str, float]]:
        return training_flops_per_token(self.config, self.seq_len, self.remat)

    def boxed_params(self, chunk: Chunk, key: jax.Array) -> PyTree:
        """``chunk``'s parameters as ``nn.LogicallyPartitioned`` boxes (values and logical
        axes); under ``jax.eval_shape`` for shapes only."""
        tokens = jnp.zeros((1, self.seq_len), jnp.int32)
        inputs = tokens
        if not chunk.first:
            inputs = jnp.zeros((1, self.seq_len, self.config.d_model), jnp.float32)
        # flax creates parameters by running the model in float32: let the registry choose
        # providers for that trace, since a provider forced for the bf16 step may refuse float32.
        creator = self.module(chunk).clone(ops=self.ops.unforced(), layer_unroll=INIT_LAYER_UNROLL)
        return creator.init(key, inputs, tokens, tokens, tokens)["params"]

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        return next_token_batch(batch_size, self.seq_len)

    def stage_inputs(self, batch: dict[str, Any]) -> StageInputs:
        return next_token_inputs(batch)

    def activation(self, rows: int, dtype: jnp.dtype) -> tuple[tuple[int, ...], jnp.dtype]:
        return (rows, self.seq_len, self.config.d_model), dtype

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
        segment_ids = every["segment_ids"]
        positions = jnp.broadcast_to(jnp.arange(segment_ids.shape[1]), segment_ids.shape)
        outputs = self.module(chunk).apply(
            {"params": cast_tree(params, dtype)}, x, positions, segment_ids, last.get("targets")
        )
        outputs = cast(jax.Array, outputs)  # apply without mutable= returns the output alone
        return jnp.mean(outputs) if chunk.last else outputs


_SEAM: type[ModelAdapter] = LlamaAdapter  # mypy checks the family against the seam
