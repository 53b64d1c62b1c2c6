"""Training layouts: chooses the model adapter and the layout a run asks for, and builds its
trainer (:class:`titan.trainer_state.Trainer`).

- ``--layout spmd`` (the baseline, :class:`titan.trainer.spmd.SpmdTrainer`): one ``jax.jit``
  train step over one mesh, accumulating gradients over ``--microbatches``.
- ``--layout mpmd`` (:class:`titan.mpmd.pipeline.PipelineTrainer`): one jitted program per
  chunk and action on its stage's devices, driven by a pipeline schedule from one Python
  process.

The model family comes through an adapter (:mod:`titan.models.adapters`): Titan's Llama, its
DiT for ``--task diffusion``, or a MaxText model (``--model-source maxtext``,
:mod:`titan.models.adapters.maxtext`). Families and layouts are registered once each, with the
builder that takes what it needs from the config (:data:`FAMILIES`, :data:`LAYOUTS`); a name
that is not registered is a one-line error naming the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

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
from titan.parallel.chunks import plan_chunks
from titan.parallel.fit import check_layout
from titan.parallel.mesh import build_stage_meshes
from titan.schedules import build_schedule
from titan.shapes import ModelConfig
from titan.trainer.memory_check import RematChoice, resolve_remat
from titan.trainer.spmd import SpmdTrainer
from titan.trainer_state import Trainer

T = TypeVar("T")


def compute_dtype(cfg: TrainConfig, backend: str) -> jnp.dtype:
    """``--compute-dtype``, with ``auto`` meaning bfloat16 on accelerators and float32 on CPU
    (XLA:CPU has no fast bfloat16 matmul)."""
    if cfg.compute.compute_dtype == "auto":
        return jnp.dtype(jnp.float32 if backend == "cpu" else jnp.bfloat16)
    return jnp.dtype(cfg.compute.compute_dtype)


def _titan_llama(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> LlamaAdapter:
    """Titan's Llama of shape ``model_cfg``."""
    return LlamaAdapter(
        model_cfg,
        ops,
        cfg.data.seq_len,
        remat=cfg.compute.remat,
        layer_unroll=cfg.compute.layer_unroll,
        document_mask=cfg.compute.attention_mask == "document",
        param_dtype=jnp.dtype(cfg.compute.param_dtype),
    )


def _titan_dit(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> DitAdapter:
    """Titan's DiT of shape ``model_cfg`` (``--task diffusion``)."""
    return DitAdapter(
        model_cfg,
        ops,
        remat=cfg.compute.remat,
        layer_unroll=cfg.compute.layer_unroll,
        param_dtype=jnp.dtype(cfg.compute.param_dtype),
    )


def _maxtext(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> MaxTextAdapter:
    """The MaxText model of ``--maxtext-model``, its vocabulary the tokenizer's
    (``model_cfg.vocab_size``) unless ``--maxtext-set vocab_size=...`` says otherwise.

    Raises:
        TitanError: ``--ops`` forces providers (MaxText's layers do not call Titan's
            operators), MaxText refuses the model, or its vocabulary is smaller than the
            tokenizer's.
    """
    if cfg.compute.ops:
        raise TitanError(
            "--ops does not apply to --model-source maxtext: MaxText's layers call their own "
            "kernels (choose them with --maxtext-set attention=...)"
        )
    settings, tokenizer_vocab = cfg.model.maxtext_set, model_cfg.vocab_size
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


# The model families a run can train, by name (:func:`family_name`): (the run's config, its
# model shape, the operators) -> the family's adapter.
FAMILIES: dict[str, Callable[[TrainConfig, ModelConfig, Ops], ModelAdapter]] = {
    "llama": _titan_llama,
    "dit": _titan_dit,
    "maxtext": _maxtext,
}


def family_name(cfg: TrainConfig, model_cfg: ModelConfig) -> str:
    """The :data:`FAMILIES` entry a run trains: ``maxtext`` under ``--model-source maxtext``,
    else the family of its Titan shape (``llama``, or ``dit`` for ``--task diffusion``)."""
    return "maxtext" if cfg.model.model_source == "maxtext" else model_cfg.family


def _registered(registry: dict[str, T], name: str, what: str) -> T:
    """``registry[name]``.

    Raises:
        TitanError: ``name`` is not registered (one line naming ``what`` and the registered
            names).
    """
    if name not in registry:
        raise TitanError(f"{what} must be one of {', '.join(registry)}, got {name!r}")
    return registry[name]


def build_adapter(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> ModelAdapter:
    """The model family of the run (:func:`family_name`), built from :data:`FAMILIES`.

    Raises:
        TitanError: the family is not registered, or its builder refuses the run (MaxText:
            not installed, refuses the model, a vocabulary smaller than the tokenizer's,
            ``--ops`` given).
    """
    build = _registered(FAMILIES, family_name(cfg, model_cfg), "the model family")
    return build(cfg, model_cfg, ops)


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


def _spmd(cfg: TrainConfig, adapter: ModelAdapter, dtype: jnp.dtype) -> SpmdTrainer:
    """One jitted step over one mesh of dp x fsdp x tp devices, the whole model one chunk."""
    par = cfg.parallel
    mesh = build_stage_meshes(par.dp, par.fsdp, par.tp, 1)[0]
    return SpmdTrainer(
        adapter,
        mesh,
        plan_chunks(adapter.n_layers, 1, 1),
        *build_optimizer(cfg),
        dtype,
        cfg.optimizer.grad_clip,
        cfg.data.batch_size,
        par.microbatches,
    )


def _mpmd(cfg: TrainConfig, adapter: ModelAdapter, dtype: jnp.dtype) -> PipelineTrainer:
    """``--pp`` stages of dp x fsdp x tp devices, ``--virtual-stages`` chunks each, driven by
    ``--schedule``."""
    par = cfg.parallel
    meshes = build_stage_meshes(par.dp, par.fsdp, par.tp, par.pp)
    label = f"--preset {cfg.model.shape.name}"
    if cfg.model.model_source == "maxtext":
        label = f"--maxtext-model {cfg.model.maxtext_model}"
    chunks = plan_chunks(adapter.n_layers, par.pp, par.virtual_stages, par.stage_layers, label)
    return PipelineTrainer.build(
        adapter,
        meshes,
        chunks,
        build_schedule(par.schedule, par.pp, par.microbatches, par.virtual_stages),
        build_optimizer(cfg),
        dtype,
        cfg.data.batch_size,
        cfg.optimizer.grad_clip,
        cfg.observability.timing_every,
    )


# The training layouts, by ``--layout`` name (:data:`titan.config.LAYOUTS`): (the run's config,
# the model family, the compute dtype) -> the layout's trainer.
LAYOUTS: dict[str, Callable[[TrainConfig, ModelAdapter, jnp.dtype], Trainer]] = {
    "spmd": _spmd,
    "mpmd": _mpmd,
}


def remat_choice(cfg: TrainConfig, model_cfg: ModelConfig) -> RematChoice:
    """The run's ``--remat`` policy, ``auto`` resolved for the devices present
    (:func:`titan.trainer.memory_check.resolve_remat`)."""
    dtype = str(compute_dtype(cfg, jax.default_backend()))
    return resolve_remat(cfg, model_cfg, len(jax.devices()), dtype, jax.local_devices())


def build_trainer(cfg: TrainConfig, model_cfg: ModelConfig, ops: Ops) -> Trainer:
    """The trainer of ``cfg.parallel.layout`` (:data:`LAYOUTS`) for the run's model family,
    validated against the devices present, with ``--remat auto`` resolved
    (:func:`remat_choice`).

    Raises:
        TitanError: the layout or the family is not registered, the layout does not fit the
            devices, the layers do not split into the chunks asked for, or a batch/parameter
            dimension does not divide its mesh axis.
    """
    build = _registered(LAYOUTS, cfg.parallel.layout, "--layout")
    cfg = cfg.replace(remat=remat_choice(cfg, model_cfg).remat)
    adapter = build_adapter(cfg, model_cfg, ops)
    return build(cfg, adapter, compute_dtype(cfg, jax.default_backend()))
