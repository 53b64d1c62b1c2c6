"""The SPMD layout (``--layout spmd``): one jitted train step over one device mesh.

Forward, backward, global-norm clipping and AdamW run in one ``jax.jit`` program; parameters
and optimizer state are sharded by the logical rules of :mod:`titan.parallel.sharding`
(DP/FSDP/TP), the batch is split over data x fsdp. Parameters are kept in ``param_dtype``
(float32 master weights by default); forward and backward run in ``compute_dtype``.

With ``--microbatches M`` > 1 the step accumulates gradients (in float32) over M microbatches
of B/M rows with a ``jax.lax.scan`` inside the same program, then clips and updates once; the
activations of one microbatch are live at a time. M = 1 is the program without the scan.

The step checks its loss and gradient norm on the device: when either is not finite the new
state is the old one, selected inside the program (:func:`titan.optimizer.keep_if_not_finite`),
and the metrics' ``finite`` flag says so (read one step late, with the other metrics).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from titan.layouts.contract import Batch, ChunkState, StepMetrics, TrainState
from titan.layouts.description import LayoutDescription
from titan.models.adapters.base import ModelAdapter
from titan.optimizer import (
    applied_learning_rate,
    clip_by_global_norm,
    finite_step,
    keep_if_not_finite,
)
from titan.parallel.chunks import Chunk, chunk_item, chunk_ranges
from titan.parallel.fit import microbatch_rows
from titan.parallel.mesh import DeviceMesh
from titan.parallel.sharding import BATCH_AXES
from titan.telemetry.device_memory import program_memory
from titan.telemetry.events import Compile, Event

Terms = dict[str, Any]  # a loss's named terms (ModelAdapter.loss_terms), scalars


@dataclass
class SpmdTrainer:
    """One jitted step (forward, backward, clipping, AdamW) over one mesh; the state has one
    chunk, the whole model (a :class:`titan.layouts.contract.Trainer`).

    Attributes:
        adapter: the model family.
        mesh: the device mesh.
        chunks: the one chunk (the whole model).
        tx: the optimizer (AdamW, :mod:`titan.optimizer`).
        lr_schedule: learning rate as a function of the step.
        compute_dtype: dtype of forward and backward.
        grad_clip: global-norm clip (0 disables).
        batch_size: global batch (rows per step).
        microbatches: gradient-accumulation microbatches per step (1: none).

    Raises (on construction):
        TitanError: a batch, or a microbatch, whose rows do not split over dp x fsdp, or a
            parameter dimension that does not divide its mesh axis.
    """

    adapter: ModelAdapter
    mesh: DeviceMesh
    chunks: list[Chunk]
    tx: optax.GradientTransformation
    lr_schedule: optax.Schedule
    compute_dtype: jnp.dtype
    grad_clip: float
    batch_size: int
    microbatches: int = 1

    def __post_init__(self) -> None:
        self.mesh.batch_sharding(self.batch_size)
        microbatch_rows(self.batch_size, self.microbatches, self.mesh.mesh_shape)
        self.chunk_shardings, self.chunk_abstract = self._chunk_shardings(self.chunks[0], self.mesh)
        self._lowered: Any = None
        self._compiled: Any = None
        self._eval: Any = None

    def _chunk_shardings(self, chunk: Chunk, mesh: DeviceMesh) -> tuple[Any, ChunkState]:
        shapes, logical = self.adapter.abstract_params(chunk)
        return mesh.state_shardings(self.tx, shapes, logical)

    def describe(self) -> LayoutDescription:
        """The layout as recorded in ``run_start`` and in checkpoints."""
        return LayoutDescription(
            "spmd",
            self.mesh.mesh_shape,
            self.mesh.device_count,
            chunk_ranges(self.chunks),
            microbatches=self.microbatches,
        )

    def _init_chunk(self, key: jax.Array) -> ChunkState:
        params = self.adapter.init_params(key)
        return {"params": params, "opt_state": self.tx.init(params)}

    def init_state(self, seed: int) -> TrainState:
        """Fresh state, created directly in its shardings (nothing materialised unsharded)."""
        init = jax.jit(self._init_chunk, out_shardings=self.chunk_shardings)
        return TrainState(0, (init(jax.random.key(seed)),))

    def _loss(self, params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, Terms]:
        """(the mean loss, its :meth:`~titan.models.adapters.base.ModelAdapter.loss_terms`) of
        one batch or microbatch."""
        inputs = self.adapter.stage_inputs(batch)
        out = self.adapter.forward(
            self.chunks[0], params, inputs.first, inputs.every, inputs.last, self.compute_dtype
        )
        return out if isinstance(out, tuple) else (out, {})  # a tuple: the loss and its terms

    def _loss_and_grads(self, params: Any, batch: dict[str, jax.Array]) -> tuple[Any, Any]:
        """((mean loss, its terms), gradients in the parameters' dtype) of one batch or
        microbatch."""
        return jax.value_and_grad(self._loss, has_aux=True)(params, batch)

    def _eval_step(self, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        """The mean loss of a batch, forward only, microbatch by microbatch (equal rows: the
        mean of their means) so that no more activations are live than in a train step."""
        if self.microbatches == 1:
            return self._loss(params, batch)[0]
        split = self._split_microbatches(batch)
        return jnp.mean(jax.lax.map(lambda microbatch: self._loss(params, microbatch)[0], split))

    def eval_loss(self, state: TrainState, batch: Batch) -> jax.Array:
        """The mean loss of ``batch`` under ``state``'s parameters, forward only (evaluation;
        jitted on the first call). Returns a replicated float32 scalar."""
        if self._eval is None:
            shardings = (self.chunk_shardings["params"], self.mesh.batch_sharding(self.batch_size))
            self._eval = jax.jit(
                self._eval_step, in_shardings=shardings, out_shardings=self.mesh.replicated()
            )
        placed = self.mesh.shard_batch(batch, self.batch_size)
        with self.mesh.tracing():
            return self._eval(state.chunks[0]["params"], placed)

    def _split_microbatches(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """(B, ...) -> (M, B/M, ...): microbatch i takes rows i, M + i, 2M + i, ... so that
        each device's contiguous rows hold rows of every microbatch and nothing moves."""
        m = self.microbatches
        sharding = NamedSharding(self.mesh.jax_mesh, PartitionSpec(None, BATCH_AXES))

        def split(x: jax.Array) -> jax.Array:
            x = x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)
            return jax.lax.with_sharding_constraint(x, sharding)

        return jax.tree.map(split, batch)

    def _accumulated_loss_and_grads(
        self, params: Any, batch: dict[str, jax.Array]
    ) -> tuple[tuple[jax.Array, Terms], Any]:
        """((mean loss, mean terms), mean gradients) over the microbatches, summed in float32
        by a scan: one microbatch's activations are live at a time. Equal rows per microbatch,
        so the mean of the microbatch means is the batch's mean."""
        m = self.microbatches
        grad_shardings = self.chunk_shardings["params"]
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        zeros = jax.lax.with_sharding_constraint(zeros, grad_shardings)

        def accumulate(carry, microbatch):
            sums, grad_sum = carry
            loss_and_terms, grads = self._loss_and_grads(params, microbatch)
            sums = jax.tree.map(lambda a, v: a + v.astype(jnp.float32), sums, loss_and_terms)
            grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
            grad_sum = jax.lax.with_sharding_constraint(grad_sum, grad_shardings)
            return (sums, grad_sum), None

        terms = {name: jnp.zeros((), jnp.float32) for name in self.adapter.loss_terms()}
        start = ((jnp.zeros((), jnp.float32), terms), zeros)
        (sums, grad_sum), _ = jax.lax.scan(accumulate, start, self._split_microbatches(batch))
        grads = jax.tree.map(lambda g, p: (g / m).astype(p.dtype), grad_sum, params)
        return jax.tree.map(lambda total: total / m, sums), grads

    def _step(self, chunk: ChunkState, batch: dict[str, jax.Array]):
        if self.microbatches == 1:
            (loss, terms), grads = self._loss_and_grads(chunk["params"], batch)
        else:
            (loss, terms), grads = self._accumulated_loss_and_grads(chunk["params"], batch)
        grad_norm = optax.tree.norm(grads)
        grads = clip_by_global_norm(grads, grad_norm, self.grad_clip)
        updates, opt_state = self.tx.update(grads, chunk["opt_state"], chunk["params"])
        finite = finite_step(loss, grad_norm)
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": applied_learning_rate(self.lr_schedule, chunk["opt_state"]),
            "finite": finite,
            **terms,  # Step fields of the same names
        }
        updated = {"params": optax.apply_updates(chunk["params"], updates), "opt_state": opt_state}
        return keep_if_not_finite(finite, updated, chunk), metrics

    def trace(self) -> float:
        """Trace and lower the train step (this resolves op providers). Returns seconds."""
        replicated = self.mesh.replicated()
        jitted = jax.jit(
            self._step,
            in_shardings=(self.chunk_shardings, self.mesh.batch_sharding(self.batch_size)),
            out_shardings=(self.chunk_shardings, replicated),
            donate_argnums=0,
        )
        start = time.perf_counter()
        with self.mesh.tracing():
            self._lowered = jitted.lower(
                self.chunk_abstract, self.adapter.batch_shapes(self.batch_size)
            )
        return time.perf_counter() - start

    def compile(self) -> list[Compile]:
        """XLA-compile the lowered step (after :meth:`trace`). Returns the compile event."""
        start = time.perf_counter()
        self._compiled = self._lowered.compile()
        seconds = time.perf_counter() - start
        return [Compile(what="train_step", seconds=seconds, memory=program_memory(self._compiled))]

    def step(self, state: TrainState, batch: Batch) -> tuple[TrainState, StepMetrics]:
        """One optimizer step (asynchronous dispatch). Returns (new state, metrics on device)."""
        chunk, metrics = self._compiled(
            state.chunks[0], self.mesh.shard_batch(batch, self.batch_size)
        )
        return TrainState(state.step + 1, (chunk,)), metrics

    def process_rows(self, batch_size: int) -> np.ndarray:
        """(R,) indices of the batch rows this process's devices hold."""
        return self.mesh.process_rows(batch_size)

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
