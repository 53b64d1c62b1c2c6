"""Budget planner: from a model shape, a GPU, a count and a token budget to memory, step time,
throughput, MFU, total time, GPU-hours, energy and cost, for one layout or for every layout.

Energy is GPU board energy only: GPUs x TDP x :data:`POWER_FRACTION_OF_TDP` x time (no host,
network, cooling or PUE). Cost is GPU-hours x the price per GPU-hour given.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from titan.errors import TitanError
from titan.gpus import GpuSpec
from titan.planning.collectives import interconnect, slice_error
from titan.planning.memory import (
    Layout,
    MemoryBreakdown,
    Precision,
    check_layout,
    memory_per_device,
)
from titan.planning.step import Cluster, StepEstimate, estimate_step, model_flops_utilization
from titan.remat import REMAT_POLICIES
from titan.schedules import SCHEDULES
from titan.shapes import ModelConfig

# Average board power during training as a fraction of TDP: Latif et al. 2025, "Empirically
# calibrated H100 node power models for reducing uncertainty in AI training energy estimation"
# (arXiv:2506.14551), Abstract: compute-intensive training on 8-GPU H100 nodes runs at 76% of the
# rated power.
POWER_FRACTION_OF_TDP = 0.76
SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6
# The largest global batch planned, in tokens: 2^40, about 65,000 times Llama 3 405B's 16M
# tokens per step (Meta 2024, "The Llama 3 Herd of Models", Sec. 3.4.1). It bounds the trial
# divisions of the batch (:func:`divisors`) to about a million, a tenth of a second.
MAX_BATCH_TOKENS = 2**40


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.

    Attributes:
        model: the model shape.
        gpu: the catalog entry.
        gpus: GPU count; gpus_per_node: GPUs sharing a scale-up domain.
        seq_len: tokens per sequence; batch_tokens: global batch per step, in tokens.
        tokens: training budget, in tokens.
        price_per_gpu_hour: currency units per GPU-hour, or None (no cost).
        precision: dtypes and attention kernel.
        calibration: catalog name -> achievable fraction of peak (``titan.planning.step``).
    """

    model: ModelConfig
    gpu: GpuSpec
    gpus: int
    gpus_per_node: int
    seq_len: int
    batch_tokens: int
    tokens: float
    price_per_gpu_hour: float | None = None
    precision: Precision = Precision()
    calibration: Mapping[str, float] = field(default_factory=dict)

    @property
    def batch_sequences(self) -> int:
        return self.batch_tokens // self.seq_len

    @property
    def steps(self) -> int:
        """Whole steps of the budget: ceil(tokens / batch tokens), as ``titan train --steps``
        runs it (a budget below one batch is one step)."""
        return math.ceil(self.tokens / self.batch_tokens)


def check_request(request: PlanRequest) -> None:
    """Reject impossible inputs (one-line :class:`TitanError` naming the flag)."""
    for flag, value in (
        (request.gpu.count_flag, request.gpus),
        ("--gpus-per-node", request.gpus_per_node),
        ("--seq-len", request.seq_len),
        ("--batch-tokens", request.batch_tokens),
    ):
        if value < 1:
            raise TitanError(f"{flag} must be >= 1, got {value}")
    if request.batch_tokens > MAX_BATCH_TOKENS:
        raise TitanError(
            f"--batch-tokens must be <= {MAX_BATCH_TOKENS:,} (2^40), got {request.batch_tokens:,}"
        )
    if request.gpu.torus_dims:  # a TPU: a slice, or slices of --gpus-per-node chips
        if request.gpus_per_node > request.gpu.gpus_per_node:
            error = slice_error(request.gpu, request.gpus_per_node)
            raise TitanError(f"--gpus-per-node {request.gpus_per_node} {error}")
        one_slice = min(request.gpus, request.gpus_per_node)
        error = slice_error(request.gpu, one_slice)
        if error is not None:
            flag = request.gpu.count_flag if one_slice == request.gpus else "--gpus-per-node"
            raise TitanError(f"{flag} {one_slice} {error}")
    if request.gpus > request.gpus_per_node and request.gpus % request.gpus_per_node:
        raise TitanError(
            f"{request.gpu.count_flag} {request.gpus} does not fill whole "
            f"{'slices' if request.gpu.torus_dims else 'nodes'} of --gpus-per-node "
            f"{request.gpus_per_node}"
        )
    if request.batch_tokens % request.seq_len:
        raise TitanError(
            f"--batch-tokens {request.batch_tokens} is not a multiple of --seq-len "
            f"{request.seq_len}"
        )
    if not 0 < request.tokens < math.inf:
        raise TitanError(f"--tokens must be a finite number > 0, got {request.tokens}")
    price = request.price_per_gpu_hour
    if price is not None and not 0 <= price < math.inf:
        raise TitanError(f"--price must be a finite number >= 0, got {price}")


@dataclass(frozen=True)
class Plan:
    """The estimate of one layout: memory per device, step time and the totals of the run."""

    request: PlanRequest
    layout: Layout
    memory: MemoryBreakdown
    step: StepEstimate

    @property
    def mfu(self) -> dict[str, float]:
        r = self.request
        return model_flops_utilization(r.model, r.seq_len, self.step.tokens_per_s, r.gpu, r.gpus)

    @property
    def total_s(self) -> float:
        """The run's time, seconds: :attr:`PlanRequest.steps` whole steps of the step time."""
        return self.request.steps * self.step.step_s

    @property
    def gpu_hours(self) -> float:
        return self.request.gpus * self.total_s / SECONDS_PER_HOUR

    @property
    def energy_kwh(self) -> float | None:
        """Device energy, kWh; None where the catalog has no power figure (TPU v5e, v5p, v6e)."""
        tdp_w = self.request.gpu.tdp_w
        if tdp_w is None:
            return None
        power_w = self.request.gpus * tdp_w * POWER_FRACTION_OF_TDP
        return power_w * self.total_s / JOULES_PER_KWH

    @property
    def cost(self) -> float | None:
        price = self.request.price_per_gpu_hour
        return None if price is None else price * self.gpu_hours

    def as_dict(self) -> dict:
        """JSON-ready summary (bytes, seconds, FLOP/s, kWh)."""
        return {
            "layout": self.layout.label(),
            "layout_fields": {
                name: getattr(self.layout, name)
                for name in ("dp", "fsdp", "tp", "pp", "microbatches", "schedule")
            }
            | {"virtual_stages": self.layout.virtual_stages, "remat": self.layout.remat},
            "memory_bytes": self.memory.as_dict(),
            "capacity_bytes": self.memory.capacity,
            "fit_bytes": self.memory.fit_bytes,
            "fits": self.memory.fits,
            "step_s": self.step.as_dict(),
            "tokens_per_s": self.step.tokens_per_s,
            "achievable_fraction": self.step.achievable_fraction,
            "mfu": self.mfu,
            "total_s": self.total_s,
            "gpu_hours": self.gpu_hours,
            "device_unit": self.request.gpu.unit,  # what gpu_hours counts the hours of
            "energy_kwh": self.energy_kwh,
            "interconnect": interconnect(
                self.request.gpu, self.request.gpus, self.request.gpus_per_node
            ),
            "cost": self.cost,
        }


def plan(request: PlanRequest, layout: Layout) -> Plan:
    """Estimate ``layout`` for ``request``.

    Raises:
        TitanError: impossible request or a layout Titan cannot run there.
    """
    check_request(request)
    check_layout(request.model, layout, request.gpus, request.batch_sequences)
    return _estimate(request, layout, _memory(request, layout))


def _memory(request: PlanRequest, layout: Layout) -> MemoryBreakdown:
    return memory_per_device(
        request.model,
        layout,
        request.gpu,
        request.seq_len,
        request.batch_sequences,
        request.precision,
    )


def _estimate(request: PlanRequest, layout: Layout, memory: MemoryBreakdown) -> Plan:
    cluster = Cluster(request.gpu, request.gpus_per_node, request.calibration)
    step = estimate_step(
        request.model,
        layout,
        cluster,
        request.seq_len,
        request.batch_sequences,
        request.precision,
    )
    return _check_totals(Plan(request, layout, memory, step))


def _check_totals(p: Plan) -> Plan:
    """``p`` when its totals are finite numbers.

    Raises:
        TitanError: a total overflows a float (``--tokens`` and ``--price`` are each finite,
            their products need not be), naming both options.
    """
    totals = (p.total_s, p.gpu_hours, p.energy_kwh or 0.0, p.cost or 0.0)
    if all(math.isfinite(total) for total in totals):
        return p
    price = p.request.price_per_gpu_hour
    given = f"--tokens {p.request.tokens:g}" + ("" if price is None else f" at --price {price:g}")
    raise TitanError(f"{given}: the run's totals overflow a float (over {sys.float_info.max:.1e})")


def search(request: PlanRequest) -> list[Plan]:
    """Every layout of ``request.gpus`` GPUs that Titan can run and that fits in memory, fastest
    (most tokens/s) first.

    Raises:
        TitanError: impossible request.
    """
    check_request(request)
    plans = []
    for layout in candidate_layouts(request.model, request.gpus, request.batch_sequences):
        check_layout(request.model, layout, request.gpus, request.batch_sequences)
        memory = _memory(request, layout)
        if memory.fits:
            plans.append(_estimate(request, layout, memory))
    plans.sort(key=lambda p: -p.step.tokens_per_s)
    return plans


def tp_limit(model: ModelConfig) -> int:
    """The largest tensor-parallel size: the gcd of the dimensions tp shards (heads, KV heads,
    FFN, vocabulary)."""
    return math.gcd(model.n_heads, model.n_kv_heads, model.ffn_dim, model.vocab_size)


def max_layout_gpus(model: ModelConfig, batch_sequences: int) -> int:
    """An upper bound on the GPUs of any layout of ``model`` and the batch: dp x fsdp divides
    the batch, tp divides :func:`tp_limit`, pp is at most the layer count."""
    return batch_sequences * tp_limit(model) * model.n_layers


def check_layouts_exist(request: PlanRequest) -> None:
    """Refuse a GPU count no layout of the model and batch spans (``--search``).

    Raises:
        TitanError: an impossible request (:func:`check_request`), or no
            :func:`candidate_layouts` of ``request.gpus`` GPUs; names the rules.
    """
    check_request(request)
    m = request.model
    if next(candidate_layouts(m, request.gpus, request.batch_sequences), None) is None:
        raise TitanError(
            f"{request.gpu.count_flag} {request.gpus}: no layout splits this model and batch "
            f"over {request.gpus} {request.gpu.unit}s (dp x fsdp x tp x pp, dp x fsdp x "
            "microbatches dividing the "
            f"batch of {request.batch_sequences} sequences, fsdp d_model {m.d_model}, tp "
            f"{tp_limit(m)} (the gcd of heads, KV heads, FFN and vocabulary), pp the "
            f"{m.n_layers} layers)"
        )


@functools.lru_cache(maxsize=1024)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order, by trial division up to sqrt(n) (O(sqrt n):
    a million GPUs take a thousand trials, not a million); kept for the numbers a search asks
    again (the batch's rows per replica of each layout)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return (*small, *(n // k for k in reversed(small) if k * k != n))


def candidate_layouts(model: ModelConfig, gpus: int, batch_sequences: int) -> Iterator[Layout]:
    """Every (dp, fsdp, tp, pp, microbatches, schedule, virtual stages, remat) whose product of
    parallel sizes is ``gpus`` and that passes :func:`titan.planning.memory.check_layout`.

    The sizes are enumerated from the model, not from ``gpus``: tp divides the heads, KV heads,
    FFN and vocabulary sizes (the divisors of their gcd with ``gpus``), pp is at most the layer
    count, fsdp divides ``d_model``, and dp is what is left. So the candidates, and the time to
    rank them, are bounded by the model's shape whatever the GPU count (a million GPUs ranks in
    about a second). Pipeline stages (and interleaved chunks) split the layers evenly, as
    ``titan train`` does without ``--stage-layers``."""
    tp_gcd = math.gcd(gpus, tp_limit(model))
    for tp in divisors(tp_gcd):
        rest = gpus // tp
        for pp in (k for k in divisors(model.n_layers) if rest % k == 0):
            for fsdp in divisors(math.gcd(rest // pp, model.d_model)):
                dp = rest // (pp * fsdp)
                if batch_sequences % (dp * fsdp):
                    continue
                for m in divisors(batch_sequences // (dp * fsdp)):
                    for schedule, virtual in _schedules(model, pp, m):
                        for remat in REMAT_POLICIES:
                            yield Layout(dp, fsdp, tp, pp, m, schedule, virtual, remat)


def _schedules(model: ModelConfig, pp: int, m: int) -> Iterator[tuple[str, int]]:
    if pp == 1:
        yield "1f1b", 1
        return
    for schedule, spec in SCHEDULES.items():
        if not spec.virtual_stages:
            yield schedule, 1
        elif m % pp == 0:
            for virtual in (2, 4):
                if model.n_layers % (pp * virtual) == 0:
                    yield schedule, virtual
