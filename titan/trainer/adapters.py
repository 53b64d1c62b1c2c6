"""Training layouts: chooses the model adapter and the layout a run asks for, and builds its
trainer (:class:`titan.trainer_state.Trainer`).

- ``--layout spmd`` (the baseline, :class:`titan.trainer.spmd.SpmdTrainer`): one ``jax.jit``
  train step over one mesh, accumulating gradients over ``--microbatches``.
- ``--layout mpmd`` (:class:`titan.mpmd.pipeline.PipelineTrainer`): one jitted program per
  chunk and action on its stage's devices, driven by a pipeline schedule from one Python
  process.

The model family comes through an adapter (:mod:`titan.models.adapters`): Titan's Llama, its
DiT for ``--task diffusion``, or a MaxText model (``--model-source maxtext``,
:mod:`titan.models.adapters.maxtext`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titan.config import TrainConfig
from titan.errors import TitanError
from titan.models.adapters.base import ModelAdapter
from titan.models.adapters.dit import DitAdapter
from titan.models.adapters.llama import LlamaAdapter
from titan.models.adapters.maxtext import MaxTextAdapter, MaxTextModel
from titan.mpmd.pipeline import PipelineTrainer
from titan.ops import Ops
from titan.optimizer import build_optimizer
from titan.parallel.chunks import Chunk, plan_chunks
from titan.parallel.fit import check_layout
from titan.parallel.mesh import build_stage_meshes
from titan.schedules import build_schedule
from titan.shapes import ModelConfig
from titan.trainer.spmd import SpmdTrainer
from titan.trainer_state import Trainer


def compute_dtype(cfg: TrainConfig, backend: str) -> jnp.dtype:
    """``--compute-dtype``, with ``auto`` meaning bfloat16 on accelerators and float32 on CPU
    (XLA:CPU has no fast bfloat16 matmul)."""
    if cfg.compute.compute_dtype == "auto":
        return jnp.dtype(jnp.float32 if backend == "cpu" else jnp.bfloat16)
    return jnp.dtype(cfg.compute.compute_dtype)


def build_adapter(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> ModelAdapter:
    """The model family of the run: Titan's Llama or DiT of shape ``model_cfg``, or the MaxText
    model of ``--maxtext-model`` (its vocabulary the tokenizer's, ``model_cfg.vocab_size``, unless
    ``--maxtext-set vocab_size=...`` says otherwise).

    Raises:
        TitanError: MaxText is not installed or refuses the model, its vocabulary is smaller
            than the tokenizer's, or ``--ops`` forces providers (MaxText's layers do not call
            Titan's operators).
    """
    if cfg.model.model_source == "maxtext":
        return _maxtext_adapter(cfg, model_cfg.vocab_size)
    if model_cfg.family == "dit":
        return DitAdapter(
            model_cfg,
            ops,
            remat=cfg.compute.remat,
            layer_unroll=cfg.compute.layer_unroll,
            param_dtype=jnp.dtype(cfg.compute.param_dtype),
        )
    return LlamaAdapter(
        model_cfg,
        ops,
        cfg.data.seq_len,
        remat=cfg.compute.remat,
        layer_unroll=cfg.compute.layer_unroll,
        document_mask=cfg.compute.attention_mask == "document",
        param_dtype=jnp.dtype(cfg.compute.param_dtype),
    )


def _maxtext_adapter(cfg: TrainConfig, tokenizer_vocab: int) -> MaxTextAdapter:
    if cfg.compute.ops:
        raise TitanError(
            "--ops does not apply to --model-source maxtext: MaxText's layers call their own "
            "kernels (choose them with --maxtext-set attention=...)"
        )
    settings = cfg.model.maxtext_set
    model = MaxTextModel(
        cfg.model.maxtext_model,
        tuple(settings.items()),
        cfg.data.seq_len,
        vocab_size=0 if "vocab_size" in settings else tokenizer_vocab,
        remat=cfg.compute.remat,
        param_dtype=cfg.compute.param_dtype,
    )
    adapter = MaxTextAdapter(model, document_mask=cfg.compute.attention_mask == "document")
    if adapter.config.vocab_size < tokenizer_vocab:
        raise TitanError(
            f"--maxtext-set vocab_size={adapter.config.vocab_size} is smaller than the "
            f"tokenizer's {tokenizer_vocab} pieces"
        )
    return adapter


def _check_model_state(adapter: ModelAdapter, chunks: list[Chunk]) -> None:
    """Refuse a family that carries non-parameter state: neither layout threads it yet."""
    if any(jax.tree.leaves(adapter.model_state(chunk)) for chunk in chunks):
        raise TitanError(
            f"model family {adapter.family} carries non-parameter state, which the SPMD and "
            "MPMD layouts do not train yet"
        )


def check_layout_fits(cfg: TrainConfig) -> str | None:
    """:func:`titan.parallel.fit.check_layout` on the devices present (``jax.devices()``):
    called before any data is read (:func:`build_trainer` builds the meshes later, after the
    tokenizer). Returns a note when the layout leaves devices idle, else None.

    Raises:
        TitanError: the layout asks for more devices than are present, or the rows per
            microbatch are not a multiple of dp x fsdp.
    """
    return check_layout(
        cfg.parallel, cfg.data.batch_size, len(jax.devices()), jax.default_backend()
    )


def build_trainer(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> Trainer:
    """The trainer for ``cfg.parallel.layout``, validated against the devices present.

    Raises:
        TitanError: the layout does not fit the devices, the layers do not split into the
            chunks asked for, or a batch/parameter dimension does not divide its mesh axis.
    """
    par, batch_size, grad_clip = cfg.parallel, cfg.data.batch_size, cfg.optimizer.grad_clip
    pp = par.pp if par.layout == "mpmd" else 1
    meshes = build_stage_meshes(par.dp, par.fsdp, par.tp, pp)
    adapter = build_adapter(cfg, model_cfg, ops)
    dtype = compute_dtype(cfg, jax.default_backend())
    optimizer = build_optimizer(cfg)
    if par.layout == "spmd":
        chunks = plan_chunks(adapter.n_layers, 1, 1)
        _check_model_state(adapter, chunks)
        return SpmdTrainer(
            adapter, meshes[0], chunks, *optimizer, dtype, grad_clip, batch_size, par.microbatches
        )
    label = f"--preset {cfg.model.shape.name}"
    if cfg.model.model_source == "maxtext":
        label = f"--maxtext-model {cfg.model.maxtext_model}"
    chunks = plan_chunks(adapter.n_layers, pp, par.virtual_stages, par.stage_layers, label)
    _check_model_state(adapter, chunks)
    schedule = build_schedule(par.schedule, pp, par.microbatches, par.virtual_stages)
    return PipelineTrainer.build(
        adapter,
        meshes,
        chunks,
        schedule,
        optimizer,
        dtype,
        batch_size,
        grad_clip,
        cfg.observability.timing_every,
    )
