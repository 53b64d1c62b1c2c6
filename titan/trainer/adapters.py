"""Training layouts: builds the train step for the layout a run asks for.

``--layout spmd`` (the baseline): one ``jax.jit`` train step over the SPMD mesh of
:mod:`titan.trainer.layout`, parameters and optimizer state sharded by the logical rules, the
batch split over data x fsdp.

The train state is a dict ``{"step": int32 scalar, "params": tree, "opt_state": tree}`` with
parameters in ``param_dtype`` (float32 master weights by default); the forward and backward run
in ``compute_dtype``. A batch is ``{"tokens": (B, S + 1) int32, "segment_ids": (B, S) int32}``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from titan.config import ModelConfig, TrainConfig
from titan.models.llama import Llama
from titan.ops import Ops
from titan.trainer.layout import SpmdLayout, build_spmd_layout
from titan.trainer.optimizer import build_optimizer


def compute_dtype(cfg: TrainConfig, backend: str) -> jnp.dtype:
    """``--compute-dtype``, with ``auto`` meaning bfloat16 on accelerators and float32 on CPU
    (XLA:CPU has no fast bfloat16 matmul)."""
    if cfg.compute_dtype == "auto":
        return jnp.dtype(jnp.float32 if backend == "cpu" else jnp.bfloat16)
    return jnp.dtype(cfg.compute_dtype)


def batch_shapes(cfg: TrainConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global batch."""
    return {
        "tokens": jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len + 1), jnp.int32),
        "segment_ids": jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), jnp.int32),
    }


@dataclass
class SpmdTrainer:
    """The SPMD baseline: state shardings, initialisation and the compiled train step."""

    cfg: TrainConfig
    model: Llama
    layout: SpmdLayout
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    compute_dtype: jnp.dtype
    state_shardings: Any
    abstract_state: Any
    _lowered: Any = None
    _compiled: Any = None

    def _init_state(self, key: jax.Array) -> dict[str, Any]:
        params = nn.unbox(_init_params(self.model, self.cfg.seq_len, key))
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": self.tx.init(params),
        }

    def init_state(self, seed: int) -> dict[str, Any]:
        """Fresh state, created directly in its shardings (nothing materialised unsharded)."""
        init = jax.jit(self._init_state, out_shardings=self.state_shardings)
        return init(jax.random.key(seed))

    def _loss(self, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
        compute = jax.tree.map(lambda p: p.astype(self.compute_dtype), params)
        nll = self.model.apply(
            {"params": compute}, inputs, targets, positions, batch["segment_ids"]
        )
        return jnp.mean(nll)

    def _step(self, state: dict[str, Any], batch: dict[str, jax.Array]):
        loss, grads = jax.value_and_grad(self._loss)(state["params"], batch)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "lr": self.schedule(state["step"]),
        }
        new_state = {
            "step": state["step"] + 1,
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }
        return new_state, metrics

    def trace(self) -> float:
        """Trace and lower the train step (this resolves op providers). Returns seconds."""
        batch_shardings = {
            key: self.layout.batch_sharding(self.cfg.batch_size) for key in batch_shapes(self.cfg)
        }
        jitted = jax.jit(
            self._step,
            in_shardings=(self.state_shardings, batch_shardings),
            out_shardings=(self.state_shardings, self.layout.replicated()),
            donate_argnums=0,
        )
        start = time.perf_counter()
        self._lowered = jitted.lower(self.abstract_state, batch_shapes(self.cfg))
        return time.perf_counter() - start

    def compile(self) -> float:
        """XLA-compile the lowered train step (after :meth:`trace`). Returns seconds."""
        start = time.perf_counter()
        self._compiled = self._lowered.compile()
        return time.perf_counter() - start

    def step(self, state: dict[str, Any], batch: dict[str, Any]):
        """One optimizer step (asynchronous dispatch). Returns (new state, metrics on device)."""
        return self._compiled(state, self.layout.shard_batch(batch))


def _init_params(model: Llama, seq_len: int, key: jax.Array) -> Any:
    dummy = jnp.zeros((1, seq_len), jnp.int32)
    return model.init(key, dummy, dummy, dummy, dummy)["params"]


def _state_shardings(
    layout: SpmdLayout, tx: optax.GradientTransformation, boxed_params: Any
) -> tuple[Any, Any]:
    """(shardings, abstract state with shardings) of the train state; optimizer moments follow
    the sharding of the parameter they belong to, scalars are replicated."""
    param_shardings = layout.param_shardings(boxed_params)
    abstract_params = nn.unbox(boxed_params)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_shardings = optax.tree_utils.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        abstract_opt,
        param_shardings,
        transform_non_params=lambda _: layout.replicated(),
    )
    shardings = {
        "step": layout.replicated(),
        "params": param_shardings,
        "opt_state": opt_shardings,
    }
    abstract = {
        "step": jax.ShapeDtypeStruct((), jnp.int32),
        "params": abstract_params,
        "opt_state": abstract_opt,
    }
    abstract = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        abstract,
        shardings,
    )
    return shardings, abstract


def build_trainer(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> SpmdTrainer:
    """The trainer for ``cfg.layout``, validated against the devices present.

    Raises:
        TitanError: the layout does not fit the devices, or a batch/parameter dimension does not
            divide its mesh axis.
    """
    layout = build_spmd_layout(cfg)
    layout.batch_sharding(cfg.batch_size)
    model = Llama(model_cfg, ops, remat=cfg.remat, param_dtype=jnp.dtype(cfg.param_dtype))
    tx, schedule = build_optimizer(cfg)
    boxed = jax.eval_shape(functools.partial(_init_params, model, cfg.seq_len), jax.random.key(0))
    shardings, abstract = _state_shardings(layout, tx, boxed)
    dtype = compute_dtype(cfg, jax.default_backend())
    return SpmdTrainer(cfg, model, layout, tx, schedule, dtype, shardings, abstract)
