"""Training layouts: builds the trainer for the layout a run asks for.

- ``--layout spmd`` (the baseline, :class:`SpmdTrainer`): one ``jax.jit`` train step over one
  mesh, parameters and optimizer state sharded by the logical rules, the batch split over
  data x fsdp.
- ``--layout mpmd`` (:class:`titan.mpmd.pipeline.PipelineTrainer`): one jitted program per stage
  and action on its own device group, driven by a schedule from one Python process.

Both expose the same interface to the training loop: ``describe()``, ``init_state(seed)``,
``trace()``, ``compile()`` (compile event fields), ``step(state, batch)`` (new state, metrics on
device), ``checkpoint_items(state)`` / ``abstract_items()`` / ``state_from_items(items, step)``
(per-chunk ``{"params", "opt_state"}``, the checkpoint format shared by the layouts),
``start_events()`` and ``drain_events()`` (layout-specific events of
:mod:`titan.observability.events`), ``step_fields()`` (host
figures of the last step) and ``next_step_blocks()`` (the next step is a synchronous, timed one).

A batch is ``{"tokens": (B, S + 1) int32, "segment_ids": (B, S) int32}``. Parameters are kept
in ``param_dtype`` (float32 master weights by default); forward and backward run in
``compute_dtype``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import optax

from titan.config import ModelConfig, TrainConfig
from titan.models.llama import LlamaStage
from titan.observability.events import Event
from titan.ops import Ops
from titan.trainer.layout import (
    Chunk,
    MeshLayout,
    build_group_layouts,
    cast_tree,
    chunk_state_layout,
    plan_chunks,
)
from titan.trainer.optimizer import build_optimizer, clip_by_global_norm


def compute_dtype(cfg: TrainConfig, backend: str) -> jnp.dtype:
    """``--compute-dtype``, with ``auto`` meaning bfloat16 on accelerators and float32 on CPU
    (XLA:CPU has no fast bfloat16 matmul)."""
    if cfg.compute_dtype == "auto":
        return jnp.dtype(jnp.float32 if backend == "cpu" else jnp.bfloat16)
    return jnp.dtype(cfg.compute_dtype)


def chunk_model(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops, chunk: Chunk) -> LlamaStage:
    """The flax module of one model chunk (the whole model for a single chunk)."""
    return LlamaStage(
        model_cfg,
        ops,
        chunk.n_layers,
        has_embedding=chunk.first,
        has_head=chunk.last,
        remat=cfg.remat,
        layer_unroll=cfg.layer_unroll,
        document_mask=cfg.attention_mask == "document",
        param_dtype=jnp.dtype(cfg.param_dtype),
    )


def init_params(model: LlamaStage, seq_len: int, key: jax.Array) -> Any:
    """Boxed (logically partitioned) parameters of ``model``; use under ``jax.eval_shape`` for
    shapes only."""
    tokens = jnp.zeros((1, seq_len), jnp.int32)
    inputs = tokens
    if not model.has_embedding:
        inputs = jnp.zeros((1, seq_len, model.config.d_model), jnp.float32)
    # flax creates parameters by running the model in float32: let the registry choose
    # providers for that trace, since a provider forced for the bf16 step may refuse float32.
    creator = model.clone(ops=model.ops.unforced())
    return creator.init(key, inputs, tokens, tokens, tokens)["params"]


def abstract_chunk_state(
    model: LlamaStage, layout: MeshLayout, tx: optax.GradientTransformation, seq_len: int
) -> tuple[Any, Any]:
    """(shardings, abstract ``{"params", "opt_state"}``) of one chunk on ``layout``."""
    boxed = jax.eval_shape(functools.partial(init_params, model, seq_len), jax.random.key(0))
    return chunk_state_layout(layout, tx, boxed)


def abstract_items_for_chunks(trainer: Any, chunks: list[Chunk], layout: MeshLayout) -> dict:
    """Abstract per-chunk checkpoint items of any chunk list on ``layout`` (to restore a
    checkpoint written by another layout)."""
    items = {}
    for chunk in chunks:
        model = chunk_model(trainer.cfg, trainer.model_cfg, trainer.ops, chunk)
        items[f"chunk_{chunk.index}"] = abstract_chunk_state(
            model, layout, trainer.tx, trainer.cfg.seq_len
        )[1]
    return items


def batch_shapes(cfg: TrainConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global batch."""
    return {
        "tokens": jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len + 1), jnp.int32),
        "segment_ids": jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), jnp.int32),
    }


def microbatch_loss(model: LlamaStage, dtype: jnp.dtype, params: Any, tokens, segment_ids):
    """Mean token loss (float32 scalar, nats) of the whole model on (B, S + 1) tokens."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    nll = model.apply({"params": cast_tree(params, dtype)}, inputs, positions, segment_ids, targets)
    return jnp.mean(nll)


@dataclass
class SpmdTrainer:
    """The SPMD baseline: one jitted step (forward, backward, clipping, AdamW) over one mesh.

    The state is ``{"step": int32 scalar, "params": tree, "opt_state": tree}``.
    """

    cfg: TrainConfig
    model: LlamaStage
    layout: MeshLayout
    chunks: list[Chunk]
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    compute_dtype: jnp.dtype
    chunk_shardings: Any
    chunk_abstract: Any
    _lowered: Any = None
    _compiled: Any = None
    _events: list = field(default_factory=list)

    @property
    def model_cfg(self) -> ModelConfig:
        return self.model.config

    @property
    def ops(self) -> Ops:
        return self.model.ops

    @property
    def state_shardings(self) -> dict[str, Any]:
        return {"step": self.layout.replicated(), **self.chunk_shardings}

    def describe(self) -> dict[str, Any]:
        """The layout as recorded in ``run_start`` and in checkpoints."""
        return {
            "layout": "spmd",
            "mesh": self.layout.mesh_shape,
            "devices": int(self.layout.mesh.devices.size),
            "chunks": [[c.start, c.end] for c in self.chunks],
        }

    def _init_state(self, key: jax.Array) -> dict[str, Any]:
        import flax.linen as nn

        params = nn.unbox(init_params(self.model, self.cfg.seq_len, key))
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": self.tx.init(params),
        }

    def init_state(self, seed: int) -> dict[str, Any]:
        """Fresh state, created directly in its shardings (nothing materialised unsharded)."""
        init = jax.jit(self._init_state, out_shardings=self.state_shardings)
        return init(jax.random.key(seed))

    def _step(self, state: dict[str, Any], batch: dict[str, jax.Array]):
        loss_fn = functools.partial(microbatch_loss, self.model, self.compute_dtype)
        loss, grads = jax.value_and_grad(loss_fn)(
            state["params"], batch["tokens"], batch["segment_ids"]
        )
        grad_norm = optax.tree.norm(grads)
        grads = clip_by_global_norm(grads, grad_norm, self.cfg.grad_clip)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        metrics = {"loss": loss, "grad_norm": grad_norm, "lr": self.schedule(state["step"])}
        new_state = {
            "step": state["step"] + 1,
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }
        return new_state, metrics

    def trace(self) -> float:
        """Trace and lower the train step (this resolves op providers). Returns seconds."""
        batch_sharding = self.layout.batch_sharding(self.cfg.batch_size)
        jitted = jax.jit(
            self._step,
            in_shardings=(self.state_shardings, batch_sharding),
            out_shardings=(self.state_shardings, self.layout.replicated()),
            donate_argnums=0,
        )
        abstract = {
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=self.layout.replicated()),
            **self.chunk_abstract,
        }
        start = time.perf_counter()
        with self.layout.tracing():
            self._lowered = jitted.lower(abstract, batch_shapes(self.cfg))
        return time.perf_counter() - start

    def compile(self) -> list[dict[str, Any]]:
        """XLA-compile the lowered step (after :meth:`trace`). Returns compile event fields."""
        start = time.perf_counter()
        self._compiled = self._lowered.compile()
        return [{"what": "train_step", "seconds": time.perf_counter() - start}]

    def step(self, state: dict[str, Any], batch: dict[str, Any]):
        """One optimizer step (asynchronous dispatch). Returns (new state, metrics on device)."""
        return self._compiled(state, self.layout.shard_batch(batch))

    def checkpoint_items(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"chunk_0": {"params": state["params"], "opt_state": state["opt_state"]}}

    def abstract_items(self) -> dict[str, Any]:
        return {"chunk_0": self.chunk_abstract}

    def state_from_items(self, items: dict[str, Any], step: int) -> dict[str, Any]:
        step_array = jax.device_put(jnp.int32(step), self.layout.replicated())
        return {"step": step_array, **items["chunk_0"]}

    def start_events(self) -> list[Event]:
        return []

    def drain_events(self) -> list[Event]:
        return []

    def step_fields(self) -> dict[str, Any]:
        return {}

    def next_step_blocks(self) -> bool:
        """Whether the next :meth:`step` call waits for the device (never, here)."""
        return False


def build_trainer(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops):
    """The trainer for ``cfg.layout``, validated against the devices present.

    Raises:
        TitanError: the layout does not fit the devices, the layers do not split into the
            chunks asked for, or a batch/parameter dimension does not divide its mesh axis.
    """
    layouts = build_group_layouts(cfg)
    chunks = plan_chunks(cfg, model_cfg)
    tx, schedule = build_optimizer(cfg)
    dtype = compute_dtype(cfg, jax.default_backend())
    if cfg.layout == "mpmd":
        from titan.mpmd.pipeline import PipelineTrainer

        return PipelineTrainer.build(cfg, model_cfg, ops, layouts, chunks, tx, schedule, dtype)
    layout = layouts[0]
    layout.batch_sharding(cfg.batch_size)
    model = chunk_model(cfg, model_cfg, ops, chunks[0])
    shardings, abstract = abstract_chunk_state(model, layout, tx, cfg.seq_len)
    return SpmdTrainer(cfg, model, layout, chunks, tx, schedule, dtype, shardings, abstract)
