"""Step time: compute at an achievable fraction of peak, memory-bound work, exposed
communication and the pipeline bubble.

For the most loaded device (the last pipeline stage, which also holds the output head), one
optimizer step takes

    t_stage = (matmul FLOPs + attention FLOPs / ATTENTION_EFFICIENCY) / (peak x eta)
              + bytes / (HBM bandwidth x MEMORY_EFFICIENCY)
    t_step  = t_stage x (1 + bubble) + exposed communication

- FLOPs: forward, backward (2 x forward) and recomputation (``titan.flops``) of the
  stage's layers and head for the tokens of one data-parallel replica, split over TP. A flash
  kernel executes the causal half of attention; a materialized score matrix all of it.
- ``eta``, the achievable fraction of peak for these matmuls, comes from the calibration: a
  mapping catalog name -> measured fraction (from the performance database, or
  ``bench/planner_accuracy.py``), or :data:`DEFAULT_ACHIEVABLE_FRACTION` when the device has no
  measurements.
- with ``--matmul-dtype float8`` the decoder blocks' linear-layer FLOPs (forward, backward and
  recomputed) run at the device's dense FP8 peak (``GpuSpec.fp8_flops``) at the same ``eta``,
  the head and attention at the bf16 one (:func:`float8_saving_s`); the quantization passes
  count as nothing (unmeasured);
- attention FLOPs (q k^T and the weighted sum of values) run at ``ATTENTION_EFFICIENCY`` of
  the matmuls' fraction (flash kernels and XLA's batched score products reach less of peak than
  the projections' GEMMs);
- bytes: the memory-bound kernels (norms, RoPE, SwiGLU activation, residuals, softmax of a
  materialized attention, the loss over the vocabulary, the optimizer update and, with
  microbatches, the float32 gradient accumulation), counted from what each writes and reads:
  :func:`elementwise_bytes_per_token`. ``eta`` (the default), ``ATTENTION_EFFICIENCY`` and
  ``MEMORY_EFFICIENCY`` are fitted together on half of a random draw of configurations
  (``bench/planner_accuracy.py --evaluate``) and scored on the other half.
- bubble (Narayanan et al. 2021, Sec. 2.2.1 and 2.2.2; Qi et al. 2023, Sec. 3.1), as a fraction
  of the ideal pipeline time: GPipe and 1F1B (pp - 1) / m; interleaved 1F1B (pp - 1) / (v m);
  ZB-H1 (pp - 1 + max(0, pp - m)) / (3 m), a third of 1F1B's for m >= pp. Titan's zero-bubble
  backward costs more than B: its input-gradient program (I) and its weight-gradient program
  (W) each run the stage's VJP, and W re-derives the activation-gradient chain that I computed
  (``titan.layouts.mpmd``), so I + W = B + I, with I one forward's worth of matmuls plus the
  recomputation (the per-action times of ``bench/results/pipeline-h200x2.json``).
- communication (``titan.planning.collectives``): TP all-reduces activations twice per layer in
  the forward pass, twice in the backward and twice more in a full recomputation (Shoeybi et al.
  2019, "Megatron-LM", Sec. 3), on the critical path; FSDP all-gathers each layer's weights in
  the forward and again in the backward and reduce-scatters its gradients, per microbatch
  (Rajbhandari et al. 2020, ZeRO-3); DP all-reduces the gradients once per step; pipeline stages
  send each microbatch's activations forward and their gradients back. On accelerators XLA runs
  DP and FSDP collectives asynchronously, overlapped with the compute of other layers: only what
  exceeds the compute of its phase, plus one layer's share that nothing can hide, is exposed.
  XLA:CPU runs collectives synchronously: all of it is exposed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from titan.flops import (
    ATTENTION_CONVENTIONS,
    TokenFlops,
    layer_recompute_flops,
    model_flops_per_token,
    token_flops,
)
from titan.gpus import GpuSpec
from titan.planning import collectives
from titan.planning.memory import (
    DTYPE_BYTES,
    Layout,
    Precision,
    layer_activation_bytes,
    layer_params,
    stage_layers,
)
from titan.remat import effective_policy
from titan.schedules import SCHEDULES, bubble_ratio
from titan.shapes import ModelConfig

# Achievable fraction of dense peak for the matmuls of a training step, used when the
# calibration has no entry for the device: fitted, with ATTENTION_EFFICIENCY and
# MEMORY_EFFICIENCY, on the fitting half of draw 1 of bench/results/planner_draws.json (one
# H200; ``python bench/planner_accuracy.py --evaluate``, which scores them on the other half).
# The same machine's bf16 8192^3 matmul reaches 0.88 to 0.90 of peak.
DEFAULT_ACHIEVABLE_FRACTION = 0.719
# Fraction of HBM bandwidth that the memory-bound fusions reach, and attention's achievable
# fraction of peak relative to the matmuls' (eta: flash kernels and XLA's batched score
# matmuls run at a lower fraction than the projections' GEMMs): fitted with
# DEFAULT_ACHIEVABLE_FRACTION (above; 0.599 of bandwidth, attention at 0.309 of peak).
MEMORY_EFFICIENCY = 0.599
ATTENTION_EFFICIENCY = 0.430
# Memory traffic of one element of a materialized (float32) score matrix per token, bytes:
# forward: scores written (4), masked and softmaxed in a reduction that reads them twice (8) and
# writes float32 probabilities (4), read again for their compute-dtype copy (4; the copy's own
# p bytes are added in the code); backward: probability gradients written and read (8), read
# with the probabilities (4), score gradients written and read (8), the mask applied again
# (4 + 4). Counted from titan.ops.native.attention.
SCORE_FORWARD_BYTES = 20
SCORE_BACKWARD_BYTES = 28
# Passes over the activations one layer saves (written forward, read backward) and over their
# gradients (written and read backward).
SAVED_PASSES = 2
GRADIENT_PASSES = 2
# Loss over the vocabulary, bytes per token per vocabulary entry: float32 logits written, read
# by the log-sum-exp, exponentials written, read by the backward, logit gradients written (5 x 4).
LOSS_BYTES_PER_VOCAB = 20
# Optimizer step, bytes per local parameter per param-dtype byte: gradient norm (read 1), clip
# (read and write 2), AdamW (read gradient, moments and weights 4, write moments and weights 3).
OPTIMIZER_PASSES = 10


def bubble_fraction(layout: Layout) -> float:
    """Idle pipeline time as a fraction of the ideal (bubble-free) step time, from the schedule
    registry (``titan.schedules.bubble_ratio``, the formula behind the executor's
    ``theoretical_bubble``)."""
    if layout.pp == 1:
        return 0.0
    return bubble_ratio(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages)


def achievable_fraction(gpu: GpuSpec, calibration: Mapping[str, float]) -> float:
    """The calibrated fraction of peak for ``gpu`` (by catalog name), else the default."""
    return calibration.get(gpu.name, DEFAULT_ACHIEVABLE_FRACTION)


def elementwise_bytes_per_token(
    model: ModelConfig, seq_len: int, remat: str, precision: Precision
) -> float:
    """Bytes the memory-bound kernels of one decoder layer move per token in forward, backward
    and recomputation (module docstring), before any TP split: the saved activations are
    written once and read once, the activation gradients (as large as everything the layer
    would save without recomputation) written once and read once; recomputed values feed their
    consumers inside fusions. A materialized score matrix adds its own passes, twice forward
    when attention is recomputed."""
    p = DTYPE_BYTES[precision.compute_dtype]
    saved = layer_activation_bytes(model, seq_len, remat, p, "flash", precision.swiglu)
    whole = layer_activation_bytes(model, seq_len, "none", p, "flash", precision.swiglu)
    traffic = SAVED_PASSES * (saved.replicated + saved.sharded)
    traffic += GRADIENT_PASSES * (whole.replicated + whole.sharded)
    if precision.attention == "materialized":
        forward = (SCORE_FORWARD_BYTES + p) * (2 if remat != "none" else 1)
        traffic += (forward + SCORE_BACKWARD_BYTES) * model.n_heads * seq_len
    return traffic


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per optimizer step and its parts, for the most loaded device.

    Attributes:
        compute_s: matmul and attention FLOPs at the achievable fraction of peak.
        memory_s: memory-bound kernels and the optimizer update.
        bubble_s: pipeline bubble.
        tp_s, fsdp_s, dp_s, pp_s: exposed communication of each kind.
        step_s: the whole step.
        device_flops: FLOPs one device executes per step (recomputation included), of which
            attention_flops in attention's score and value products.
        memory_bytes: bytes the memory-bound kernels move per step on one device.
        tokens: tokens per step over all devices.
        achievable_fraction: the ``eta`` used.
    """

    compute_s: float
    memory_s: float
    bubble_s: float
    tp_s: float
    fsdp_s: float
    dp_s: float
    pp_s: float
    step_s: float
    device_flops: float
    attention_flops: float
    memory_bytes: float
    tokens: float
    achievable_fraction: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    def as_dict(self) -> dict[str, float]:
        names = ("compute_s", "memory_s", "bubble_s", "tp_s", "fsdp_s", "dp_s", "pp_s")
        return {name: getattr(self, name) for name in names} | {"step_s": self.step_s}


@dataclass(frozen=True)
class Cluster:
    """Where a layout runs: the GPU model, its count per node and the calibration."""

    gpu: GpuSpec
    gpus_per_node: int
    calibration: Mapping[str, float]


def float8_saving_s(gpu: GpuSpec, eta: float, linear_flops: float) -> float:
    """Seconds saved when the blocks' linear-layer FLOPs (``linear_flops``: forward, backward
    and recomputed, not the head's) run at the device's dense FP8 peak instead of its bf16 one,
    at the same achievable fraction ``eta`` (``--matmul-dtype float8``).

    Raises:
        ValueError: the device has no FP8 peak (``titan plan`` refuses it first, naming the
            option).
    """
    if gpu.fp8_flops is None:
        raise ValueError(f"{gpu.label} has no FP8 peak in the catalog")
    return linear_flops / (gpu.bf16_flops * eta) - linear_flops / (gpu.fp8_flops * eta)


def estimate_step(
    model: ModelConfig,
    layout: Layout,
    cluster: Cluster,
    seq_len: int,
    batch_sequences: int,
    precision: Precision,
) -> StepEstimate:
    """Seconds per step of ``layout`` (module docstring) for ``batch_sequences`` sequences of
    ``seq_len`` tokens per step."""
    gpu = cluster.gpu
    eta = achievable_fraction(gpu, cluster.calibration)
    compute_bytes = DTYPE_BYTES[precision.compute_dtype]
    param_bytes = DTYPE_BYTES[precision.param_dtype]
    tp, m = layout.tp, layout.microbatches
    layers = stage_layers(model, layout)
    replica_tokens = batch_sequences * seq_len / layout.replicas
    microbatch_tokens = replica_tokens / m

    flops = token_flops(model, seq_len, causal=precision.attention == "flash")
    remat = effective_policy(layout.remat, precision.attention)
    split_backward = layout.pp > 1 and SCHEDULES[layout.schedule].split_backward

    def layer_flops(f: TokenFlops) -> float:
        recompute = layer_recompute_flops(f, remat)
        total = 3 * (f.layer_matmul + f.layer_attention) + recompute
        if split_backward:
            # Titan's split backward re-derives the activation-gradient chain in W (module
            # docstring): one more forward's worth of matmuls and the recomputation again.
            total += f.layer_matmul + f.layer_attention + recompute
        return total

    head_passes = 4 if split_backward else 3
    attention_only = dataclasses.replace(flops, layer_matmul=0.0, head=0.0, layer_output=0.0)
    attention_flops = replica_tokens * layers * layer_flops(attention_only) / tp
    device_flops = replica_tokens * (layers * layer_flops(flops) + head_passes * flops.head) / tp
    matmul_flops = device_flops - attention_flops
    compute_s = (matmul_flops + attention_flops / ATTENTION_EFFICIENCY) / (gpu.bf16_flops * eta)
    if precision.matmul == "float8":
        compute_s -= float8_saving_s(
            gpu, eta, matmul_flops - replica_tokens * head_passes * flops.head / tp
        )

    matrices, norms = layer_params(model)
    local_params = layers * (matrices / (layout.fsdp * tp) + norms)
    local_params += 2 * model.vocab_size * model.d_model / (layout.fsdp * tp * layout.pp)
    traffic = replica_tokens * (
        layers * elementwise_bytes_per_token(model, seq_len, remat, precision)
        + LOSS_BYTES_PER_VOCAB * model.vocab_size
    )
    casts = 2 * (param_bytes + compute_bytes) if param_bytes != compute_bytes else 0
    traffic = traffic / tp + local_params * (OPTIMIZER_PASSES * param_bytes + casts)
    if m > 1 or layout.pp > 1:
        # Each microbatch adds its gradients into float32 accumulators: read both, write one.
        traffic += local_params * (2 * 4 + compute_bytes) * m
    memory_s = traffic / (gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY)

    stage_s = compute_s + memory_s
    overlap = gpu.name != "cpu"
    comm = _Communication(cluster, layout, layers, overlap)
    tp_s = comm.tensor(microbatch_tokens * model.d_model * compute_bytes, m)
    layer_bytes = matrices / tp * compute_bytes
    fsdp_s = comm.fsdp(layer_bytes, stage_s)
    dp_s = comm.data(local_params * compute_bytes, stage_s)
    pp_s = comm.pipeline(microbatch_tokens * model.d_model * compute_bytes)
    bubble_s = stage_s * bubble_fraction(layout)
    step_s = stage_s + bubble_s + tp_s + fsdp_s + dp_s + pp_s
    return StepEstimate(
        compute_s=compute_s,
        memory_s=memory_s,
        bubble_s=bubble_s,
        tp_s=tp_s,
        fsdp_s=fsdp_s,
        dp_s=dp_s,
        pp_s=pp_s,
        step_s=step_s,
        device_flops=device_flops,
        attention_flops=attention_flops,
        memory_bytes=traffic,
        tokens=batch_sequences * seq_len,
        achievable_fraction=eta,
    )


@dataclass(frozen=True)
class _Communication:
    """Exposed communication of each kind, for the mesh (tp innermost, then fsdp, dp, pp)."""

    cluster: Cluster
    layout: Layout
    layers: int
    overlap: bool

    def _link(self, size: int, stride: int) -> collectives.Link:
        return collectives.group_link(
            self.cluster.gpu, size, stride, self.cluster.gpus_per_node, self.layout.devices
        )

    def _exposed(self, comm_s: float, window_s: float) -> float:
        if not self.overlap:
            return comm_s
        return max(comm_s - window_s, 0.0) + comm_s / self.layers

    def tensor(self, activation_bytes: float, microbatches: int) -> float:
        """All-reduces of one microbatch's (tokens, d) activations, per layer, all exposed."""
        per_layer = 6 if self.layout.remat == "full" else 4
        one = collectives.all_reduce_s(
            activation_bytes, self.layout.tp, self._link(self.layout.tp, 1)
        )
        return one * per_layer * self.layers * microbatches

    def fsdp(self, layer_bytes: float, stage_s: float) -> float:
        """Weight all-gathers (forward and backward) and gradient reduce-scatters per
        microbatch, overlapped with the forward (1/3) and backward (2/3) compute."""
        size = self.layout.fsdp
        link = self._link(size, self.layout.tp)
        gather = collectives.all_gather_s(layer_bytes, size, link) * self.layers
        scatter = collectives.reduce_scatter_s(layer_bytes, size, link) * self.layers
        m = self.layout.microbatches
        return self._exposed(gather * m, stage_s / 3) + self._exposed(
            (gather + scatter) * m, 2 * stage_s / 3
        )

    def data(self, gradient_bytes: float, stage_s: float) -> float:
        """Gradient all-reduce over ``dp`` once per step, overlapped with the backward."""
        size = self.layout.dp
        if size == 1:
            return 0.0
        link = self._link(size, self.layout.tp * self.layout.fsdp)
        return self._exposed(collectives.all_reduce_s(gradient_bytes, size, link), 2 * stage_s / 3)

    def pipeline(self, activation_bytes: float) -> float:
        """Activations forward and gradients back between stages: the fill and drain transfers
        are exposed, the steady-state ones overlap with compute."""
        pp = self.layout.pp
        if pp == 1:
            return 0.0
        stride = self.layout.dp * self.layout.fsdp * self.layout.tp
        return 2 * (pp - 1) * collectives.p2p_s(activation_bytes, self._link(2, stride))


def model_flops_utilization(
    model: ModelConfig, seq_len: int, tokens_per_s: float, gpu: GpuSpec, gpus: int
) -> dict[str, float]:
    """MFU under both attention conventions: model FLOPs per token (no recomputation) x
    tokens/s / (GPUs x dense ``bf16_flops`` peak)."""
    peak = gpus * gpu.bf16_flops
    return {
        convention: model_flops_per_token(model, seq_len, convention) * tokens_per_s / peak
        for convention in ATTENTION_CONVENTIONS
    }


@dataclass(frozen=True)
class Measurement:
    """A measured run, as the calibration needs it: its inputs to :func:`estimate_step` and its
    median step time (seconds, compilation and warm-up steps left out)."""

    model: ModelConfig
    layout: Layout
    gpu: GpuSpec
    gpus_per_node: int
    seq_len: int
    batch_sequences: int
    precision: Precision
    step_s: float

    def predict_s(self, eta: float) -> float:
        """The step time predicted with achievable fraction ``eta``."""
        cluster = Cluster(self.gpu, self.gpus_per_node, {self.gpu.name: eta})
        return estimate_step(
            self.model, self.layout, cluster, self.seq_len, self.batch_sequences, self.precision
        ).step_s


def calibrate(measurements: Sequence[Measurement]) -> dict[str, float]:
    """The calibration of :func:`estimate_step`: for each GPU (catalog name) with measurements,
    the achievable fraction that fits them best (:func:`fit_achievable_fraction`)."""
    by_gpu: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_gpu.setdefault(m.gpu.name, []).append(m)
    return {
        name: fit_achievable_fraction(
            functools.partial(_predictions, group), [m.step_s for m in group]
        )
        for name, group in by_gpu.items()
    }


def _predictions(group: Sequence[Measurement], eta: float) -> list[float]:
    return [m.predict_s(eta) for m in group]


def fit_achievable_fraction(
    predict: Callable[[float], Sequence[float]], measured_s: Sequence[float]
) -> float:
    """The ``eta`` in (0, 1] whose predictions ``predict(eta)`` (seconds, one per measurement)
    best match ``measured_s``: least mean absolute log error, by a coarse grid then golden-section
    refinement (the error is unimodal in eta for this model). Each error is
    ``log(p) - log(t)``, which, unlike ``log(p / t)``, holds for times far apart (a ratio that
    overflows or underflows the float range).

    Raises:
        ValueError: a prediction or measurement of zero or below.
    """

    def loss(eta: float) -> float:
        pairs = zip(predict(eta), measured_s, strict=True)
        return sum(abs(math.log(p) - math.log(t)) for p, t in pairs)

    grid = [i / 100 for i in range(1, 101)]
    best = min(grid, key=loss)
    low, high = max(best - 0.01, 0.005), min(best + 0.01, 1.0)
    ratio = 0.6180339887
    for _ in range(30):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if loss(a) < loss(b):
            high = b
        else:
            low = a
    return (low + high) / 2
