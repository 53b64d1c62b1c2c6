"""Training layouts: chooses the model adapter and the layout a run asks for, and builds its
trainer (:class:`titan.trainer.state.Trainer`).

- ``--layout spmd`` (the baseline, :class:`titan.trainer.spmd.SpmdTrainer`): one ``jax.jit``
  train step over one mesh.
- ``--layout mpmd`` (:class:`titan.mpmd.pipeline.PipelineTrainer`): one jitted program per
  chunk and action on its stage's devices, driven by a pipeline schedule from one Python
  process.

The model family comes through an adapter (:mod:`titan.models.adapters`): Titan's Llama.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titan.config import ModelConfig, TrainConfig
from titan.errors import TitanError
from titan.models.adapters.base import ModelAdapter
from titan.models.adapters.llama import LlamaAdapter
from titan.mpmd.pipeline import PipelineTrainer
from titan.mpmd.schedules import build_schedule
from titan.ops import Ops
from titan.parallel.chunks import plan_chunks
from titan.parallel.mesh import build_stage_layouts
from titan.trainer.optimizer import build_optimizer
from titan.trainer.spmd import SpmdTrainer
from titan.trainer.state import Trainer


def compute_dtype(cfg: TrainConfig, backend: str) -> jnp.dtype:
    """``--compute-dtype``, with ``auto`` meaning bfloat16 on accelerators and float32 on CPU
    (XLA:CPU has no fast bfloat16 matmul)."""
    if cfg.compute_dtype == "auto":
        return jnp.dtype(jnp.float32 if backend == "cpu" else jnp.bfloat16)
    return jnp.dtype(cfg.compute_dtype)


def build_adapter(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> ModelAdapter:
    """The model family of the run: Titan's Llama of shape ``model_cfg``."""
    return LlamaAdapter(
        model_cfg,
        ops,
        cfg.seq_len,
        remat=cfg.remat,
        layer_unroll=cfg.layer_unroll,
        document_mask=cfg.attention_mask == "document",
        param_dtype=jnp.dtype(cfg.param_dtype),
    )


def _stage_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise TitanError(f"--stage-layers {text!r} must be integers") from None


def build_trainer(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> Trainer:
    """The trainer for ``cfg.layout``, validated against the devices present.

    Raises:
        TitanError: the layout does not fit the devices, the layers do not split into the
            chunks asked for, or a batch/parameter dimension does not divide its mesh axis.
    """
    pp = cfg.pp if cfg.layout == "mpmd" else 1
    layouts = build_stage_layouts(cfg.dp, cfg.fsdp, cfg.tp, pp)
    adapter = build_adapter(cfg, model_cfg, ops)
    dtype = compute_dtype(cfg, jax.default_backend())
    optimizer = build_optimizer(cfg)
    if cfg.layout == "spmd":
        chunks = plan_chunks(adapter.n_layers, 1, 1)
        return SpmdTrainer(
            adapter, layouts[0], chunks, *optimizer, dtype, cfg.grad_clip, cfg.batch_size
        )
    stage_layers = _stage_layers(cfg.stage_layers)
    label = f"--preset {cfg.preset}"
    chunks = plan_chunks(adapter.n_layers, pp, cfg.virtual_stages, stage_layers, label)
    schedule = build_schedule(cfg.schedule, pp, cfg.microbatches, cfg.virtual_stages)
    return PipelineTrainer.build(
        adapter,
        layouts,
        chunks,
        schedule,
        optimizer,
        dtype,
        cfg.batch_size,
        cfg.grad_clip,
        cfg.timing_every,
    )
