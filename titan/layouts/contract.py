"""The trainer contract: the state both layouts train, and what the training entry needs from a
layout's trainer.

A run's state is a :class:`TrainState`: the number of steps done and one :class:`ChunkState`
per model chunk (:mod:`titan.parallel.chunks`), in model order. SPMD trains one chunk (the
whole model, on one mesh); MPMD one per pipeline stage and virtual stage, each on its stage's
devices. Checkpoints hold the chunks as items ``chunk_<c>`` (:mod:`titan.checkpoint.checkpointer`),
so a checkpoint of one layout restores onto another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

import jax
import jax.numpy as jnp
import numpy as np

from titan.layouts.description import LayoutDescription
from titan.models.adapters.base import ModelAdapter
from titan.parallel.chunks import Chunk, chunk_item
from titan.parallel.mesh import DeviceMesh
from titan.telemetry.events import Compile, Event

PyTree = Any  # a JAX pytree of arrays (parameters, optimizer moments)
Batch = dict[str, np.ndarray]  # one global batch on the host: the adapter's batch_shapes()


class ChunkState(TypedDict):
    """The trained state of one model chunk.

    Attributes:
        params: the chunk's parameters in ``param_dtype`` (float32 master weights by default).
        opt_state: the optimizer's state for them (AdamW moments in the same dtype).
    """

    params: PyTree
    opt_state: PyTree


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TrainState:
    """The state of a run, for either layout (a pytree whose leaves are the chunks' arrays).

    Attributes:
        step: optimizer steps done, skipped ones included (host int).
        chunks: one :class:`ChunkState` per model chunk, in model order.
    """

    step: int = field(metadata={"static": True})
    chunks: tuple[ChunkState, ...]

    def items(self) -> dict[str, ChunkState]:
        """The checkpoint items: ``chunk_<c>`` -> the chunk's state."""
        return {chunk_item(c): chunk for c, chunk in enumerate(self.chunks)}

    @classmethod
    def from_items(cls, items: dict[str, ChunkState], step: int) -> TrainState:
        """The state of checkpoint items (``chunk_0`` .. ``chunk_<n-1>``) at ``step``."""
        return cls(step, tuple(items[chunk_item(c)] for c in range(len(items))))


class StepMetrics(TypedDict):
    """What one step returns on the device (float32 scalars, read one step late).

    Attributes:
        loss: mean loss of the step's batch (token cross-entropy in nats for language models).
        grad_norm: global L2 norm of the gradients before clipping.
        lr: the learning rate the step's update applied, or would have applied had it been
            skipped (:func:`titan.optimizer.applied_learning_rate`).
        finite: bool, the loss and gradient norm were finite, so the update was applied (when
            False the state is the previous step's; :func:`titan.optimizer.finite_step`).
    """

    loss: jax.Array
    grad_norm: jax.Array
    lr: jax.Array
    finite: jax.Array


class Trainer(Protocol):
    """What the training entry (:mod:`titan.trainer.train`), checkpoints and benchmarks need
    from a layout's trainer: :class:`titan.layouts.spmd.SpmdTrainer` and
    :class:`titan.layouts.mpmd.PipelineTrainer`.

    Attributes:
        adapter: the model family (:class:`titan.models.adapters.base.ModelAdapter`).
        chunks: the model chunks this layout trains, in model order.
        compute_dtype: dtype of the forward and backward passes.
    """

    adapter: ModelAdapter
    chunks: list[Chunk]
    compute_dtype: jnp.dtype

    def describe(self) -> LayoutDescription:
        """The layout as recorded in ``run_start`` and checkpoints (their JSON form:
        :meth:`~titan.layouts.description.LayoutDescription.to_json`)."""
        ...

    def init_state(self, seed: int) -> TrainState:
        """A fresh state, created in its shardings; the same values for a seed in every
        layout."""
        ...

    def trace(self) -> float:
        """Trace and lower what can be lowered before compiling (resolves op providers).
        Returns seconds."""
        ...

    def compile(self) -> list[Compile]:
        """Compile the step's programs ahead of time. Returns the ``compile`` events."""
        ...

    def step(self, state: TrainState, batch: Batch) -> tuple[TrainState, StepMetrics]:
        """One optimizer step, dispatched asynchronously. ``state`` is donated. A step whose
        loss or gradient norm is not finite returns the state unchanged (selected on the
        device) and ``finite`` False in its metrics."""
        ...

    def eval_loss(self, state: TrainState, batch: Batch) -> Any:
        """The mean loss of ``batch`` under ``state``'s parameters, forward passes only
        (``--eval-every``); ``state`` is not donated. Returns a float32 scalar on the device
        (this process's copy)."""
        ...

    def process_rows(self, batch_size: int) -> np.ndarray | None:
        """(R,) int64 indices of the rows of a (B, ...) global batch this process materialises,
        or None for all of them."""
        ...

    def abstract_items(
        self, chunks: list[Chunk] | None = None, mesh: DeviceMesh | None = None
    ) -> dict[str, ChunkState]:
        """Checkpoint items as ``jax.ShapeDtypeStruct`` trees carrying their shardings: this
        trainer's chunks on its devices, or other ``chunks`` on ``layout`` (to read a
        checkpoint that another layout wrote)."""
        ...

    def start_events(self) -> list[Event]:
        """Layout-specific events recorded once, after compiling."""
        ...

    def drain_events(self) -> list[Event]:
        """Layout-specific events queued by the steps since the last call."""
        ...

    def step_fields(self) -> dict[str, Any]:
        """Host-side figures of the last step, added to its ``step`` event."""
        ...

    def next_step_blocks(self) -> bool:
        """Whether the next :meth:`step` waits for the device (a timed step)."""
        ...
