"""Memory per device: parameters, gradients, optimizer state, activations and transients.

Everything is in bytes per device, for the stage that holds the most (the first pipeline
stage for activations, with the embedding; the last stage for the output head and its logits).

States (per parameter, in ``--param-dtype``, as Titan keeps them; Rajbhandari et al. 2020,
"ZeRO", Sec. 3.1, count the same 16 bytes per parameter for mixed-precision AdamW: fp32 master
weights 4, two fp32 moments 4 + 4, and 16-bit weights and gradients 2 + 2):

- master weights: ``param_bytes``; AdamW's two moments: ``param_bytes`` each (the compiled
  programs' arguments are exactly 3 x ``param_bytes`` per parameter: bench/results/
  planner_draws.json); gradients: the compute dtype, which is what the backward pass of the
  compute-dtype weights emits (the layer scan's stacked output; XLA fuses the conversion to
  the parameter dtype into the clipping and the update); accumulated over microbatches (SPMD
  ``--microbatches``, MPMD) also a float32 accumulator (``titan.layouts.spmd``), 4 bytes per
  parameter. So 16 bytes per parameter with float32 master weights and bf16 compute, as in
  ZeRO, and 20 with accumulation;
- the compute-dtype copy of the weights (``bf16`` cast of the fp32 masters, kept by autodiff
  for the backward pass): 2 bytes per parameter when the dtypes differ;
- with FSDP, each device keeps 1/fsdp of every matrix, and gathers one layer's weights (two,
  with prefetch) in the compute dtype when it needs them.

Matrices are sharded over ``fsdp`` x ``tp`` (TP shards heads, KV heads, MLP and vocabulary;
FSDP the model dimension: ``titan.parallel.sharding``); norm scales are replicated.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Sec. 4.1 (per layer, s b h (34 + 5 a s / h) bytes for GPT with 16-bit
activations), adapted to what Titan's Llama saves for the backward pass, counted with
``jax._src.ad_checkpoint.saved_residuals`` on ``titan.models.llama`` with the providers that
serve on GPUs (docs/planner.md): RMSNorm keeps its float32 input and normalised output, the
native SwiGLU its float32 projections while the fused (Pallas) one keeps only its compute-dtype
inputs and product, there is no dropout, keys and values are ``n_kv_heads`` wide (GQA), and
attention keeps either the (s, s) probabilities (``materialized``) or only a log-sum-exp per
head (``flash``, Dao et al. 2022). The bytes per token and layer that each ``--remat`` policy
saves are registered with the policy (``titan.remat.REMAT_POLICIES``, ``RematPolicy.saved``),
next to the JAX policy the model runs. Outside the layers the loss keeps the final norm's
inputs (:data:`HEAD_SAVED_PER_D`) and, unless the cross-entropy is chunked, the float32 logits
(:data:`LOGIT_BYTES` per vocabulary entry).

Without sequence parallelism the replicated part stays whole on every TP rank (Korthikanti
et al. 2022, Sec. 4.2.2: s b h (10 + 24 / t + 5 a s / (h t))); with it (``sequence_parallel``)
everything divides by ``tp`` (ibid., s b h (34 + 5 a s / h) / t). Titan's SPMD rules do not
shard the sequence today, so the planner assumes no sequence parallelism.

Microbatches in flight on the first pipeline stage, registered with each schedule
(``titan.schedules.ScheduleSpec.in_flight_bound``; Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Sec. 2.2): GPipe keeps
all ``m``; 1F1B keeps ``pp``; ZB-H1 keeps ``pp`` in Qi et al. 2023 (Sec. 3.1), whose W
needs only stashed inputs and output gradients, but ``2 pp - 1`` in Titan, whose W reruns the
stage's VJP and so keeps each deferred microbatch's residuals (``titan.schedules``,
``Schedule.in_flight_bound``);
interleaving with ``v`` chunks keeps pp (1 + (pp - 1) / (pp v)) stage-equivalents (Korthikanti et
al. 2022, Sec. 4.2.3).

Transient memory, the larger of two moments of the backward pass: one layer's backward (the
gradients of everything the layer computes, as large as what it keeps without recomputation,
``none``, and with a materialized attention the float32 gradients of its probabilities and
scores, 8 h s) and the loss's backward (the logits' gradient in the compute dtype). A materialized
attention without recomputation also keeps its boolean mask and the float32 zeros of the masked
select once for all layers (5 h s bytes per token).

No workspace is added: on the H200 the compiled programs' peak (XLA's buffer assignment,
arguments + outputs - aliases + temporaries) matched the allocator's ``peak_bytes_in_use``
within 0.01% in every configuration of bench/results/planner_draws.json. Scored on the
held-out half of that suite the estimate is within 5.3% on average (worst 11.9%) of the
compiled peak; a "fits" verdict adds :data:`FIT_MARGIN` (the largest under-estimate on the
fitting half). XLA:CPU partitions FSDP as a split contraction and gathers activations instead
of weights, so measured FSDP memory on CPU is far above the ZeRO-3 figure modelled here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from titan.config import ParallelOptions, flag_of
from titan.errors import TitanError
from titan.flops import kv_dim, layer_matmul_params
from titan.gpus import GpuSpec
from titan.remat import REMAT_POLICIES
from titan.schedules import SCHEDULES, check_schedule_options
from titan.shapes import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# Margin a "fits" verdict keeps: the largest under-prediction of the compiled programs' peak
# over the fitting half of draw 1 of bench/results/planner_draws.json
# (``python bench/planner_accuracy.py --evaluate`` prints it), so that no configuration of that
# half that the planner calls a fit needs more than the capacity.
FIT_MARGIN = 0.19


@dataclass(frozen=True)
class Layout:
    """A parallel layout, as the flags of ``titan train``.

    Attributes:
        dp, fsdp, tp: data, fully-sharded data and tensor parallel sizes (one mesh per stage).
        pp: pipeline stages; microbatches: microbatches per step (gradient accumulation when
            ``pp`` is 1); schedule: one of :data:`SCHEDULES` (ignored when ``pp`` is 1);
            virtual_stages: model chunks per stage (interleaved schedule).
        remat: ``none``, ``dots`` or ``full``.
        sequence_parallel: activations outside attention and MLP are also split over ``tp``.
    """

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    remat: str = "none"
    sequence_parallel: bool = False

    @classmethod
    def from_parallel(cls, parallel: ParallelOptions, gpus: int, remat: str) -> Layout:
        """The layout of ``titan train``'s parallel options on ``gpus`` GPUs: ``dp`` 0 takes the
        GPUs left by fsdp x tp x pp."""
        dp = parallel.dp or max(gpus // (parallel.fsdp * parallel.tp * parallel.pp), 1)
        return cls(
            dp=dp,
            fsdp=parallel.fsdp,
            tp=parallel.tp,
            pp=parallel.pp,
            microbatches=parallel.microbatches,
            schedule=parallel.schedule,
            virtual_stages=parallel.virtual_stages,
            remat=remat,
        )

    @property
    def devices(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def replicas(self) -> int:
        """Ways the batch is split: dp x fsdp."""
        return self.dp * self.fsdp

    def options(self) -> dict[str, int | str]:
        """The layout as options of ``titan plan`` and ``titan train``, by config field name:
        the parallel sizes, the microbatches, with a pipeline the schedule and its virtual
        stages (``titan train`` also needs ``--layout mpmd`` then), and ``remat``."""
        pipeline = ("schedule", "virtual_stages") if self.pp > 1 else ()
        names = ("dp", "fsdp", "tp", "pp", "microbatches", *pipeline, "remat")
        return {name: getattr(self, name) for name in names}

    def flags(self) -> str:
        """:meth:`options` as command-line flags, e.g. ``--dp 2 --fsdp 4 ... --remat dots``."""
        return " ".join(f"{flag_of(name)} {value}" for name, value in self.options().items())

    def label(self) -> str:
        """Short text of the layout, e.g. ``dp2 fsdp4 tp8 pp2 m16 1f1b remat=dots``."""
        parts = [f"dp{self.dp}", f"fsdp{self.fsdp}", f"tp{self.tp}"]
        if self.pp > 1:
            parts += [f"pp{self.pp}", self.schedule]
            if self.virtual_stages > 1:
                parts.append(f"v{self.virtual_stages}")
        if self.microbatches > 1:
            parts.append(f"m{self.microbatches}")
        return " ".join(parts + [f"remat={self.remat}"])


def check_layout(model: ModelConfig, layout: Layout, gpus: int, batch_sequences: int) -> None:
    """Reject layouts Titan cannot run.

    Raises:
        TitanError: the layout's devices differ from ``gpus``; a mesh axis does not divide the
            dimension it shards; the batch does not split into replicas x microbatches; a
            schedule option does not fit; the layers do not split evenly into the pipeline's
            chunks.
    """
    if layout.devices != gpus:
        raise TitanError(
            f"--dp {layout.dp} x --fsdp {layout.fsdp} x --tp {layout.tp} x --pp {layout.pp} = "
            f"{layout.devices} devices, but --gpus is {gpus}"
        )
    for size, flag, dims in (
        (layout.tp, "--tp", ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")),
        (layout.fsdp, "--fsdp", ("d_model",)),
    ):
        for dim in dims:
            if getattr(model, dim) % size:
                raise TitanError(f"{flag} {size} does not divide {dim} {getattr(model, dim)}")
    if batch_sequences % (layout.replicas * layout.microbatches):
        raise TitanError(
            f"the batch of {batch_sequences} sequences does not split into dp x fsdp = "
            f"{layout.replicas} replicas x {layout.microbatches} microbatches"
        )
    _check_pipeline(model, layout)


def _check_pipeline(model: ModelConfig, layout: Layout) -> None:
    check_schedule_options(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages)
    chunks = layout.pp * layout.virtual_stages
    if model.n_layers % chunks:
        # titan train splits the layers evenly unless --stage-layers is given
        # (titan.parallel.chunks.plan_chunks), and the planner prices the even split.
        raise TitanError(
            f"--pp {layout.pp} x --virtual-stages {layout.virtual_stages} = {chunks} chunks "
            f"do not split {model.n_layers} layers evenly"
        )


def stage_layers(model: ModelConfig, layout: Layout) -> int:
    """Decoder layers on the most loaded pipeline stage (even split, rounded up per chunk)."""
    chunks = layout.pp * layout.virtual_stages
    return math.ceil(model.n_layers / chunks) * layout.virtual_stages


def in_flight_microbatches(layout: Layout) -> float:
    """Microbatches whose activations the first stage holds at its peak, in units of one
    microbatch through all of the stage's layers: the schedule's registered bound on chunk-
    microbatches in flight (``titan.schedules.ScheduleSpec.in_flight_bound``, which the
    executor's validator checks on every schedule it runs), over the chunks per stage."""
    pp, m, v = layout.pp, layout.microbatches, layout.virtual_stages
    if pp == 1:
        return 1.0
    return SCHEDULES[layout.schedule].in_flight_bound(0, pp, m, v) / v


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes per token of one layer: ``replicated`` (whole on every TP rank without sequence
    parallelism) and ``sharded`` (split over TP)."""

    replicated: float
    sharded: float

    def per_device(self, tp: int, sequence_parallel: bool) -> float:
        if sequence_parallel:
            return (self.replicated + self.sharded) / tp
        return self.replicated + self.sharded / tp


@functools.cache
def layer_activation_bytes(
    model: ModelConfig,
    seq_len: int,
    remat: str,
    compute_bytes: int,
    attention: str,
    swiglu: str = "native",
) -> ActivationBytes:
    """Bytes per token that one decoder layer keeps for the backward pass (module docstring).

    Args:
        remat: a :data:`titan.remat.REMAT_POLICIES` name, whose ``saved`` it prices.
        compute_bytes: bytes of the compute dtype (2 for bfloat16, 4 for float32).
        attention: ``flash`` or ``materialized``.
        swiglu: ``fused`` (the Pallas SwiGLU, whose VJP keeps its compute-dtype inputs) or
            ``native``.
    """
    d, kv, f, h = model.d_model, kv_dim(model), model.ffn_dim, model.n_heads
    saved = REMAT_POLICIES[remat].saved(compute_bytes, d, kv, f, h, seq_len, attention, swiglu)
    return ActivationBytes(*saved)


@functools.cache
def layer_params(model: ModelConfig) -> tuple[int, int]:
    """(matrix parameters, norm parameters) of one decoder layer."""
    return layer_matmul_params(model), 2 * model.d_model


_MEMORY_PARTS = (
    "weights",
    "gradients",
    "optimizer",
    "compute_weights",
    "activations",
    "transient",
    "workspace",
)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device at the peak of a step, by component; ``capacity`` is the usable memory
    of the device (:attr:`titan.gpus.GpuSpec.usable_bytes`)."""

    weights: float
    gradients: float
    optimizer: float
    compute_weights: float
    activations: float
    transient: float
    workspace: float
    capacity: float

    @functools.cached_property
    def total(self) -> float:
        return sum(getattr(self, name) for name in _MEMORY_PARTS)

    @property
    def fits(self) -> bool:
        """The total with the :data:`FIT_MARGIN` added is within the capacity."""
        return self.total * (1 + FIT_MARGIN) <= self.capacity

    @property
    def fit_bytes(self) -> float:
        """The total with its margin (what ``fits`` compares with the capacity)."""
        return self.total * (1 + FIT_MARGIN)

    def as_dict(self) -> dict[str, float]:
        """Each part and the total, bytes."""
        return {name: getattr(self, name) for name in _MEMORY_PARTS} | {"total": self.total}


# Attention providers that keep only a log-sum-exp per head (Dao et al. 2022), not the (s, s)
# probabilities: the ``flash`` entries of the activation model (titan.ops.providers).
FLASH_ATTENTION_PROVIDERS = ("cudnn", "pallas", "splash")


def attention_kernel(provider: str | None) -> str:
    """``flash`` or ``materialized``: how the activation model prices an attention provider."""
    return "flash" if provider in FLASH_ATTENTION_PROVIDERS else "materialized"


@dataclass(frozen=True)
class Precision:
    """Dtypes and kernels of a run: ``param_dtype`` (master weights, AdamW moments) and
    ``compute_dtype`` (matmuls and activations); ``attention`` is ``flash`` or
    ``materialized``; ``swiglu`` ``fused`` (the Pallas provider) or ``native``; ``loss``
    ``materialized`` (the full (tokens, vocabulary) logits exist) or ``chunked``; ``matmul``
    the dtype of the decoder blocks' linear layers (``--matmul-dtype``: ``compute`` or
    ``float8``, priced at the device's FP8 peak by :func:`titan.planning.step.estimate_step`)."""

    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    attention: str = "flash"
    swiglu: str = "fused"
    loss: str = "materialized"
    matmul: str = "compute"

    @classmethod
    def of_providers(
        cls, param_dtype: str, compute_dtype: str, served: dict[str, str]
    ) -> Precision:
        """The precision of a run whose operators were served by ``served`` (op -> provider,
        as ``run_start`` records it); an op not listed is priced as its larger kernel."""
        return cls(
            param_dtype,
            compute_dtype,
            attention_kernel(served.get("attention")),
            "fused" if served.get("swiglu") == "pallas" else "native",
            "chunked" if served.get("cross_entropy") == "chunked" else "materialized",
        )


# Bytes per token that the loss keeps from the forward to the backward pass besides the logits:
# the last layer's output, the final RMSNorm's float32 input, normalised output and scale, and
# its compute-dtype output (10 d for bfloat16 compute), counted with
# ``jax._src.ad_checkpoint.saved_residuals`` on ``titan.models.llama`` (docs/planner.md).
HEAD_SAVED_PER_D = 10
# A materialized loss keeps the float32 logits (4 bytes per vocabulary entry and token), ibid.
LOGIT_BYTES = 4


def memory_per_device(
    model: ModelConfig,
    layout: Layout,
    gpu: GpuSpec,
    seq_len: int,
    batch_sequences: int,
    precision: Precision,
) -> MemoryBreakdown:
    """Peak bytes per device of one training step (module docstring), for ``batch_sequences``
    sequences of ``seq_len`` tokens per step over the whole layout."""
    param_bytes = DTYPE_BYTES[precision.param_dtype]
    compute_bytes = DTYPE_BYTES[precision.compute_dtype]
    shards = layout.fsdp * layout.tp
    layers = stage_layers(model, layout)
    matrices, norms = layer_params(model)
    table = model.vocab_size * model.d_model
    stage_params = layers * (matrices / shards + norms) + table / shards
    if layout.pp == 1:
        stage_params += table / shards + model.d_model
    weights = stage_params * param_bytes
    compute_weights = stage_params * compute_bytes if compute_bytes != param_bytes else 0.0
    if layout.fsdp > 1:
        compute_weights += 2 * matrices / layout.tp * compute_bytes
    # The backward pass emits the gradients of the compute-dtype copy (the layer scan's
    # stacked output); accumulated over microbatches they are summed into float32 buffers
    # (titan.layouts.spmd, titan.layouts.mpmd), next to the current microbatch's.
    accumulated = layout.pp > 1 or layout.microbatches > 1
    gradients = stage_params * (compute_bytes + (4 if accumulated else 0))

    tokens = batch_sequences * seq_len / (layout.replicas * layout.microbatches)

    def per_token(remat: str) -> float:
        return layer_activation_bytes(
            model, seq_len, remat, compute_bytes, precision.attention, precision.swiglu
        ).per_device(layout.tp, layout.sequence_parallel)

    saved, whole = per_token(layout.remat), per_token("none")
    logits = LOGIT_BYTES * model.vocab_size / layout.tp if precision.loss == "materialized" else 0
    activations = saved * layers * tokens * in_flight_microbatches(layout)
    activations += (HEAD_SAVED_PER_D * model.d_model + logits) * tokens
    if layout.remat == "none" and precision.attention == "materialized":
        activations += 5 * model.n_heads / layout.tp * seq_len * tokens
    # The larger of one layer's backward (the gradients of everything the layer computes, as
    # large as what it keeps without recomputation; with recomputation also the recomputed
    # values, which the gradients replace as they are consumed) and the loss's backward (the
    # logits' gradient in the compute dtype, which feeds the head's two matmuls).
    logit_gradient = compute_bytes * logits / LOGIT_BYTES
    # A materialized softmax's backward also holds the float32 gradients of the probabilities
    # and of the scores (4 + 4 bytes per score; titan.ops.native.attention).
    score_gradients = 0.0
    if precision.attention == "materialized":
        score_gradients = 8 * model.n_heads / layout.tp * seq_len
    transient = max(whole + score_gradients, logit_gradient) * tokens
    return MemoryBreakdown(
        weights=weights,
        gradients=gradients,
        optimizer=2 * weights,
        compute_weights=compute_weights,
        activations=activations,
        transient=transient,
        workspace=0.0,
        capacity=gpu.usable_bytes,
    )
