"""Training layouts: chooses the model adapter and the layout a run asks for, and builds its
trainer (:class:`titan.layouts.contract.Trainer`).

- ``--layout spmd`` (the baseline, :class:`titan.layouts.spmd.SpmdTrainer`): one ``jax.jit``
  train step over one mesh, accumulating gradients over ``--microbatches``.
- ``--layout mpmd`` (:class:`titan.layouts.mpmd.PipelineTrainer`): one jitted program per
  chunk and action on its stage's devices, driven by a pipeline schedule from one Python
  process.

The model family comes through an adapter (:mod:`titan.models.adapters`): Titan's Llama, its
DiT for ``--task diffusion``, or a MaxText model (``--model-source maxtext``,
:mod:`titan.models.adapters.maxtext`). Families and layouts are registered once each, with the
builder that takes the config sections and values it reads (:data:`FAMILIES`,
:data:`LAYOUTS`); a name that is not registered is a one-line error naming the registered
ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol, TypeVar

import jax
import jax.numpy as jnp

from titan.config import (
    ComputeOptions,
    ModelOptions,
    ObservabilityOptions,
    OptimizerOptions,
    ParallelOptions,
    Remat,
    TrainerOptions,
    flag_of,
)
from titan.errors import TitanError
from titan.gpus import gpu_for_device_kind
from titan.layouts.contract import Trainer
from titan.layouts.memory_check import RematChoice, resolve_remat
from titan.layouts.mpmd import PipelineTrainer
from titan.layouts.spmd import SpmdTrainer
from titan.models.adapters.base import ModelAdapter
from titan.models.adapters.dit import DitAdapter
from titan.models.adapters.llama import LlamaAdapter
from titan.models.adapters.maxtext import MaxTextAdapter, MaxTextModel
from titan.models.adapters.maxtext_errors import check_attention_backend
from titan.ops import Ops
from titan.ops.linear import Linear
from titan.optimizer import build_optimizer
from titan.parallel.chunks import plan_chunks
from titan.parallel.fit import check_layout
from titan.parallel.mesh import build_stage_meshes
from titan.remat import AUTO
from titan.schedules import build_schedule
from titan.shapes import ModelConfig

T = TypeVar("T")


def compute_dtype(name: str, backend: str) -> jnp.dtype:
    """``--compute-dtype`` ``name``, with ``auto`` meaning bfloat16 on accelerators and float32
    on CPU (XLA:CPU has no fast bfloat16 matmul)."""
    if name == "auto":
        return jnp.dtype(jnp.float32 if backend == "cpu" else jnp.bfloat16)
    return jnp.dtype(name)


# Catalog entries whose FP8 is the "fnuz" formats (AMD ROCm documentation, "Data types and
# precision support": FP8 on MI300, gfx942); MI355X (gfx950) computes in the OCP ones.
FNUZ_FP8_GPUS = frozenset({"mi300x", "mi325x"})


def linear_layers(compute: ComputeOptions, backend: str, device_kind: str) -> Linear:
    """How the decoder blocks' linear layers compute (``--matmul-dtype``,
    ``--fused-projections``) on devices of ``device_kind`` (``jax.Device.device_kind``).
    ``float8`` runs where the catalog (:mod:`titan.gpus`) lists an FP8 peak for the device,
    and on the CPU, where XLA emulates FP8 (slowly: for tests, not for speed).

    Raises:
        TitanError: ``--matmul-dtype float8`` on an accelerator without FP8 in the catalog, or
            one the catalog does not list.
    """
    float8 = compute.matmul_dtype == "float8"
    spec = gpu_for_device_kind(device_kind)
    if float8 and backend != "cpu" and (spec is None or spec.fp8_flops is None):
        raise TitanError(
            f"--matmul-dtype float8 needs FP8 matmuls, which the catalog lists for none of "
            f"this run's devices ({device_kind}); use --matmul-dtype compute"
        )
    fnuz = float8 and spec is not None and spec.name in FNUZ_FP8_GPUS
    return Linear(float8=float8, fused=compute.fused_projections, fnuz=fnuz)


def _check_llama_only(compute: ComputeOptions, family: str) -> None:
    """Raises TitanError naming the first of ``--matmul-dtype`` and ``--fused-projections``
    set away from its default: they apply to Titan's Llama only, not to ``family``."""
    defaults = ComputeOptions()
    for name in ("matmul_dtype", "fused_projections"):
        if getattr(compute, name) != getattr(defaults, name):
            raise TitanError(
                f"{flag_of(name)} applies to Titan's Llama only, not to the {family} family"
            )


def _titan_llama(
    shape: ModelConfig, model: ModelOptions, compute: ComputeOptions, seq_len: int, ops: Ops
) -> LlamaAdapter:
    """Titan's Llama of ``shape``."""
    return LlamaAdapter(
        shape,
        ops,
        seq_len,
        remat=compute.remat,
        layer_unroll=compute.layer_unroll,
        document_mask=compute.attention_mask == "document",
        param_dtype=jnp.dtype(compute.param_dtype),
        linear=linear_layers(compute, ops.backend, jax.devices()[0].device_kind),
    )


def _titan_dit(
    shape: ModelConfig, model: ModelOptions, compute: ComputeOptions, seq_len: int, ops: Ops
) -> DitAdapter:
    """Titan's DiT of ``shape`` (``--task diffusion``; a row is one image, not ``seq_len``).

    Raises:
        TitanError: ``--matmul-dtype`` or ``--fused-projections`` is set.
    """
    _check_llama_only(compute, "dit")
    return DitAdapter(
        shape,
        ops,
        remat=compute.remat,
        layer_unroll=compute.layer_unroll,
        param_dtype=jnp.dtype(compute.param_dtype),
    )


def _maxtext(
    shape: ModelConfig, model: ModelOptions, compute: ComputeOptions, seq_len: int, ops: Ops
) -> MaxTextAdapter:
    """The MaxText model of ``--maxtext-model``, its vocabulary the tokenizer's
    (``shape.vocab_size``) unless ``--maxtext-set vocab_size=...`` says otherwise.

    Raises:
        TitanError: ``--ops`` forces providers (MaxText's layers do not call Titan's
            operators), ``--matmul-dtype`` or ``--fused-projections`` is set, MaxText refuses
            the model, its attention kernel cannot run on the
            ops' backend, or its vocabulary is smaller than the tokenizer's.
    """
    if compute.ops:
        raise TitanError(
            "--ops does not apply to --model-source maxtext: MaxText's layers call their own "
            "kernels (choose them with --maxtext-set attention=...)"
        )
    _check_llama_only(compute, "maxtext")
    settings, tokenizer_vocab = model.maxtext_set, shape.vocab_size
    maxtext = MaxTextModel(
        model.maxtext_model,
        tuple(settings.items()),
        seq_len,
        vocab_size=0 if "vocab_size" in settings else tokenizer_vocab,
        remat=compute.remat,
        param_dtype=compute.param_dtype,
    )
    adapter = MaxTextAdapter(maxtext, document_mask=compute.attention_mask == "document")
    check_attention_backend(adapter.config_of(None).attention, ops.backend)
    if adapter.config.vocab_size < tokenizer_vocab:
        raise TitanError(
            f"--maxtext-set vocab_size={adapter.config.vocab_size} is smaller than the "
            f"tokenizer's {tokenizer_vocab} pieces"
        )
    return adapter


class FamilyBuilder(Protocol):
    """Builds a family's adapter from the run's model shape, ``--model-source`` options,
    compute options, tokens per sequence (``--seq-len``) and operators."""

    def __call__(
        self,
        shape: ModelConfig,
        model: ModelOptions,
        compute: ComputeOptions,
        seq_len: int,
        ops: Ops,
    ) -> ModelAdapter: ...


# The model families a run can train, by name (:func:`family_name`).
FAMILIES: dict[str, FamilyBuilder] = {
    "llama": _titan_llama,
    "dit": _titan_dit,
    "maxtext": _maxtext,
}


def family_name(model: ModelOptions, shape: ModelConfig) -> str:
    """The :data:`FAMILIES` entry a run trains: ``maxtext`` under ``--model-source maxtext``,
    else the family of its Titan ``shape`` (``llama``, or ``dit`` for ``--task diffusion``)."""
    return "maxtext" if model.model_source == "maxtext" else shape.family


def _registered(registry: dict[str, T], name: str, what: str) -> T:
    """``registry[name]``.

    Raises:
        TitanError: ``name`` is not registered (one line naming ``what`` and the registered
            names).
    """
    if name not in registry:
        raise TitanError(f"{what} must be one of {', '.join(registry)}, got {name!r}")
    return registry[name]


def build_adapter(
    shape: ModelConfig, model: ModelOptions, compute: ComputeOptions, seq_len: int, ops: Ops
) -> ModelAdapter:
    """The model family of the run (:func:`family_name`), built from :data:`FAMILIES`.
    ``--remat auto`` is resolved for training by :func:`build_run_trainer`; an adapter built
    otherwise (generation, sampling, import and export) runs no backward pass and takes
    ``none``.

    Raises:
        TitanError: the family is not registered, or its builder refuses the run (MaxText:
            not installed, refuses the model, a vocabulary smaller than the tokenizer's,
            ``--ops`` given).
    """
    if compute.remat == AUTO:
        compute = dataclasses.replace(compute, remat="none")
    build = _registered(FAMILIES, family_name(model, shape), "the model family")
    return build(shape, model, compute, seq_len, ops)


def check_layout_fits(parallel: ParallelOptions, batch_size: int) -> str | None:
    """:func:`titan.parallel.fit.check_layout` on the devices present (``jax.devices()``):
    called before any data is read (:func:`build_trainer` builds the meshes later, after the
    tokenizer). Returns a note when the layout leaves devices idle, else None.

    Raises:
        TitanError: the layout asks for more devices than are present, or the rows per
            microbatch are not a multiple of dp x fsdp.
    """
    return check_layout(parallel, batch_size, len(jax.devices()), jax.default_backend())


class LayoutBuilder(Protocol):
    """Builds a layout's trainer of ``adapter``: the parallel and optimizer options, the
    compute dtype, the global batch (``--batch-size``), how often MPMD records its actions'
    timings (``--timing-every``) and how errors name the model (``--preset tiny``)."""

    def __call__(
        self,
        adapter: ModelAdapter,
        parallel: ParallelOptions,
        optimizer: OptimizerOptions,
        dtype: jnp.dtype,
        batch_size: int,
        timing_every: int,
        label: str,
    ) -> Trainer: ...


def _spmd(
    adapter: ModelAdapter,
    parallel: ParallelOptions,
    optimizer: OptimizerOptions,
    dtype: jnp.dtype,
    batch_size: int,
    timing_every: int,
    label: str,
) -> SpmdTrainer:
    """One jitted step over one mesh of dp x fsdp x tp devices, the whole model one chunk."""
    mesh = build_stage_meshes(parallel.dp, parallel.fsdp, parallel.tp, 1)[0]
    return SpmdTrainer(
        adapter,
        mesh,
        plan_chunks(adapter.n_layers, 1, 1),
        *build_optimizer(optimizer),
        dtype,
        optimizer.grad_clip,
        batch_size,
        parallel.microbatches,
    )


def _mpmd(
    adapter: ModelAdapter,
    parallel: ParallelOptions,
    optimizer: OptimizerOptions,
    dtype: jnp.dtype,
    batch_size: int,
    timing_every: int,
    label: str,
) -> PipelineTrainer:
    """``--pp`` stages of dp x fsdp x tp devices, ``--virtual-stages`` chunks each, driven by
    ``--schedule``."""
    par = parallel
    meshes = build_stage_meshes(par.dp, par.fsdp, par.tp, par.pp)
    chunks = plan_chunks(adapter.n_layers, par.pp, par.virtual_stages, par.stage_layers, label)
    return PipelineTrainer.build(
        adapter,
        meshes,
        chunks,
        build_schedule(par.schedule, par.pp, par.microbatches, par.virtual_stages),
        build_optimizer(optimizer),
        dtype,
        batch_size,
        optimizer.grad_clip,
        timing_every,
    )


# The training layouts, by ``--layout`` name (:data:`titan.config.LAYOUTS`).
LAYOUTS: dict[str, LayoutBuilder] = {
    "spmd": _spmd,
    "mpmd": _mpmd,
}


def build_trainer(
    adapter: ModelAdapter,
    parallel: ParallelOptions,
    optimizer: OptimizerOptions,
    dtype: jnp.dtype,
    batch_size: int,
    timing_every: int,
    label: str = "the model",
) -> Trainer:
    """The trainer of ``parallel.layout`` (:data:`LAYOUTS`) for the model family ``adapter``
    (:func:`build_adapter`), in compute dtype ``dtype`` (:func:`compute_dtype`), for global
    batches of ``batch_size`` rows, validated against the devices present.

    Raises:
        TitanError: the layout is not registered, the layout does not fit the devices, the
            layers do not split into the chunks asked for, or a batch/parameter dimension does
            not divide its mesh axis.
    """
    build = _registered(LAYOUTS, parallel.layout, "--layout")
    return build(adapter, parallel, optimizer, dtype, batch_size, timing_every, label)


def remat_choice(
    shape: ModelConfig,
    options: TrainerOptions,
    usable_override: float = 0.0,
    served: Mapping[str, str] | None = None,
) -> RematChoice:
    """The ``--remat`` policy a run of ``shape`` trains with, ``auto`` resolved on the devices
    present (:func:`titan.layouts.memory_check.resolve_remat`; ``usable_override``:
    ``--debug-usable-memory``; ``served``: the providers that served in a trace, None before
    one)."""
    dtype = str(compute_dtype(options.compute.compute_dtype, jax.default_backend()))
    devices = jax.local_devices()
    layout_devices = len(jax.devices())
    return resolve_remat(shape, options, layout_devices, dtype, devices, usable_override, served)


def with_remat(options: TrainerOptions, remat: Remat) -> TrainerOptions:
    """``options`` with ``--remat`` set to ``remat``."""
    return dataclasses.replace(options, compute=dataclasses.replace(options.compute, remat=remat))


def build_run_trainer(shape: ModelConfig, ops: Ops, options: TrainerOptions) -> Trainer:
    """The trainer ``titan train`` builds for a run of the model ``shape``: the family's adapter
    (:func:`build_adapter`) with ``--remat auto`` resolved (:func:`remat_choice`), then the
    layout's trainer (:func:`build_trainer`) in ``--compute-dtype`` on this backend.

    Raises:
        TitanError: as :func:`build_adapter` and :func:`build_trainer`.
    """
    o = with_remat(options, remat_choice(shape, options).remat)
    adapter = build_adapter(shape, o.model, o.compute, o.seq_len, ops)
    dtype = compute_dtype(o.compute.compute_dtype, jax.default_backend())
    return build_trainer(
        adapter, o.parallel, o.optimizer, dtype, o.batch_size, o.timing_every, o.model.label
    )


def one_device_trainer(
    shape: ModelConfig,
    model: ModelOptions,
    compute: ComputeOptions,
    optimizer: OptimizerOptions,
    seq_len: int,
    ops: Ops,
) -> Trainer:
    """The whole model of a saved run (its options ``model``, ``compute``, ``optimizer``,
    ``--seq-len``) as one SPMD chunk on one device, in its compute dtype on this backend: what
    ``titan generate`` and ``titan sample`` restore a checkpoint onto (the chunks of any layout
    are joined into it).

    Its linear layers compute in the compute dtype whatever the run's ``--matmul-dtype``: FP8 is
    a training option, and the device that generates may have no FP8.

    Raises:
        TitanError: the run's model family refuses to build here (MaxText not installed).
    """
    compute = dataclasses.replace(compute, matmul_dtype=ComputeOptions().matmul_dtype)
    adapter = build_adapter(shape, model, compute, seq_len, ops)
    dtype = compute_dtype(compute.compute_dtype, jax.default_backend())
    timing_every = ObservabilityOptions().timing_every  # SPMD records no action timings
    return build_trainer(adapter, ParallelOptions(dp=1), optimizer, dtype, 1, timing_every)
