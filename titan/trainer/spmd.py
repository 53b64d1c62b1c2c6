"""The SPMD layout (``--layout spmd``): one jitted train step over one device mesh.

Forward, backward, global-norm clipping and AdamW run in one ``jax.jit`` program; parameters
and optimizer state are sharded by the logical rules of :mod:`titan.parallel.sharding`
(DP/FSDP/TP), the batch is split over data x fsdp. Parameters are kept in ``param_dtype``
(float32 master weights by default); forward and backward run in ``compute_dtype``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from titan.models.adapters.base import ModelAdapter
from titan.observability.events import Compile, Event
from titan.optimizer import clip_by_global_norm
from titan.parallel.chunks import Chunk
from titan.parallel.mesh import DeviceMesh
from titan.trainer_state import Batch, ChunkState, StepMetrics, TrainState, chunk_item


@dataclass
class SpmdTrainer:
    """One jitted step (forward, backward, clipping, AdamW) over one mesh; the state has one
    chunk, the whole model (a :class:`titan.trainer_state.Trainer`).

    Attributes:
        adapter: the model family.
        mesh: the device mesh.
        chunks: the one chunk (the whole model).
        tx: the optimizer (AdamW, :mod:`titan.optimizer`).
        lr_schedule: learning rate as a function of the step.
        compute_dtype: dtype of forward and backward.
        grad_clip: global-norm clip (0 disables).
        batch_size: global batch (rows per step).
    """

    adapter: ModelAdapter
    mesh: DeviceMesh
    chunks: list[Chunk]
    tx: optax.GradientTransformation
    lr_schedule: optax.Schedule
    compute_dtype: jnp.dtype
    grad_clip: float
    batch_size: int

    def __post_init__(self) -> None:
        self.mesh.batch_sharding(self.batch_size)
        self.chunk_shardings, self.chunk_abstract = self._chunk_shardings(self.chunks[0], self.mesh)
        self._lowered: Any = None
        self._compiled: Any = None

    def _chunk_shardings(self, chunk: Chunk, mesh: DeviceMesh) -> tuple[Any, ChunkState]:
        shapes, logical = self.adapter.abstract_params(chunk)
        return mesh.state_shardings(self.tx, shapes, logical)

    def describe(self) -> dict[str, Any]:
        return {
            "layout": "spmd",
            "mesh": self.mesh.mesh_shape,
            "devices": self.mesh.device_count,
            "chunks": [[c.start, c.end] for c in self.chunks],
        }

    def _init_chunk(self, key: jax.Array) -> ChunkState:
        params = self.adapter.init_params(key)
        return {"params": params, "opt_state": self.tx.init(params)}

    def init_state(self, seed: int) -> TrainState:
        """Fresh state, created directly in its shardings (nothing materialised unsharded)."""
        init = jax.jit(self._init_chunk, out_shardings=self.chunk_shardings)
        return TrainState(0, (init(jax.random.key(seed)),))

    def _step(self, chunk: ChunkState, step: jax.Array, batch: dict[str, jax.Array]):
        whole = self.chunks[0]
        inputs = self.adapter.stage_inputs(batch)

        def loss_fn(params):
            return self.adapter.forward(
                whole, params, inputs.first, inputs.every, inputs.last, self.compute_dtype
            )

        loss, grads = jax.value_and_grad(loss_fn)(chunk["params"])
        grad_norm = optax.tree.norm(grads)
        grads = clip_by_global_norm(grads, grad_norm, self.grad_clip)
        updates, opt_state = self.tx.update(grads, chunk["opt_state"], chunk["params"])
        metrics = {"loss": loss, "grad_norm": grad_norm, "lr": self.lr_schedule(step)}
        new_chunk = {
            "params": optax.apply_updates(chunk["params"], updates),
            "opt_state": opt_state,
        }
        return new_chunk, metrics

    def trace(self) -> float:
        """Trace and lower the train step (this resolves op providers). Returns seconds."""
        replicated = self.mesh.replicated()
        jitted = jax.jit(
            self._step,
            in_shardings=(
                self.chunk_shardings,
                replicated,
                self.mesh.batch_sharding(self.batch_size),
            ),
            out_shardings=(self.chunk_shardings, replicated),
            donate_argnums=0,
        )
        step = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        start = time.perf_counter()
        with self.mesh.tracing():
            self._lowered = jitted.lower(
                self.chunk_abstract, step, self.adapter.batch_shapes(self.batch_size)
            )
        return time.perf_counter() - start

    def compile(self) -> list[Compile]:
        """XLA-compile the lowered step (after :meth:`trace`). Returns the compile event."""
        start = time.perf_counter()
        self._compiled = self._lowered.compile()
        return [Compile(what="train_step", seconds=time.perf_counter() - start)]

    def step(self, state: TrainState, batch: Batch) -> tuple[TrainState, StepMetrics]:
        """One optimizer step (asynchronous dispatch). Returns (new state, metrics on device)."""
        chunk, metrics = self._compiled(
            state.chunks[0], np.int32(state.step), self.mesh.shard_batch(batch, self.batch_size)
        )
        return TrainState(state.step + 1, (chunk,)), metrics

    def abstract_items(
        self, chunks: list[Chunk] | None = None, mesh: DeviceMesh | None = None
    ) -> dict[str, ChunkState]:
        if chunks is None and mesh is None:
            return {chunk_item(0): self.chunk_abstract}
        mesh = mesh or self.mesh
        return {
            chunk_item(c.index): self._chunk_shardings(c, mesh)[1] for c in chunks or self.chunks
        }

    def start_events(self) -> list[Event]:
        return []

    def drain_events(self) -> list[Event]:
        return []

    def step_fields(self) -> dict[str, Any]:
        return {}

    def next_step_blocks(self) -> bool:
        """Whether the next :meth:`step` call waits for the device (never, here)."""
        return False
