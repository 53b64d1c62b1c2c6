"""The memory check of ``titan train``, before compiling: the planner's estimate of the peak
bytes per device of this layout (:func:`titan.planning.memory.memory_per_device`, the model
``titan plan`` prints) against the device's usable memory.

Usable memory is the smallest ``bytes_limit`` of ``memory_stats()`` over the run's devices in
this process (the allocator's pool), or ``--debug-usable-memory``. XLA:CPU reports none: its
devices share the host's memory (:func:`titan.telemetry.device_memory.host_memory_bytes`),
so each has that divided by the run's devices in this process. Where neither is known the check
says unknown and is skipped. Above it, the run is refused with one line giving the
estimate and what would fit by the same estimator: the largest ``--batch-size`` (a multiple of
dp x fsdp x microbatches) and the ``--remat`` policies that fit at this batch size.
``--no-memory-check`` runs anyway.

One function makes the estimate, :func:`estimate_bytes`, for the providers the step's operators
are served by (:func:`run_precision`: those that served in the trace, else those the registry
serves unasked, :func:`auto_kernels`). ``--remat auto`` (the default) is resolved by it
(:func:`resolve_remat`): the first policy of :func:`titan.remat.auto_candidates` whose estimate
fits the usable memory, priced first with the providers the registry serves unasked and, once
the first candidate is traced, again with those that served (``titan train`` builds the policy
that choice names), so that the ``--remat auto`` line, the memory check and ``run_start``'s
``memory_check`` give one figure. The estimate is within 5.3% of the compiled peak on average
and 19% at worst (:data:`titan.planning.memory.FIT_MARGIN`), so ``titan train`` then holds the
choice against XLA's own figure: the compiled program's buffers (:attr:`titan.telemetry.events.
Compile.program_bytes`, which matched the allocator's peak within 0.01% on an H200). A program
over the usable memory passes the choice to the next candidate (:meth:`RematChoice.over`).
``titan plan``, which compiles nothing, keeps the margin instead.

The attention kernel is priced from the provider that served ``attention`` in the trace; when
none is known yet (MPMD traces while compiling) it is priced as ``flash``, the smaller estimate,
so that an unknown kernel never refuses a run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from titan.config import ComputeOptions, DataOptions, ParallelOptions, Remat, TrainerOptions
from titan.errors import TitanError
from titan.gpus import find_gpu, gpu_for_device_kind
from titan.ops.providers.platform import accelerator, fused_swiglu_by_default
from titan.planning.memory import Layout, Precision, memory_per_device
from titan.remat import AUTO, REMAT_POLICIES, auto_candidates
from titan.shapes import ModelConfig
from titan.telemetry.device_memory import host_memory_bytes, usable_bytes

GB = 1e9
# Providers assumed before the trace says which served: a fused attention kernel (module docstring)
UNKNOWN_KERNELS = {"attention": "pallas"}
# What --remat auto prices on a CUDA GPU, before the trace: also the fused SwiGLU, which the
# registry serves there unasked (titan.ops.providers.swiglu.preferred), as titan plan assumes.
AUTO_KERNELS = {**UNKNOWN_KERNELS, "swiglu": "pallas"}


def auto_kernels(platform: str) -> dict[str, str]:
    """The providers ``--remat auto`` prices on a device ``platform`` (``jax.Device.platform``)
    before the trace: :data:`AUTO_KERNELS` on CUDA, else :data:`UNKNOWN_KERNELS` (the SwiGLU
    kernel is opt-in on ROCm)."""
    return AUTO_KERNELS if fused_swiglu_by_default(accelerator(platform)) else UNKNOWN_KERNELS


def run_precision(
    param_dtype: str, compute_dtype: str, platform: str, served: Mapping[str, str]
) -> Precision:
    """The precision the estimate prices: ``served`` (op -> provider, from the trace), and for an
    op not traced yet the provider the registry serves unasked on ``platform``
    (:func:`auto_kernels`)."""
    return Precision.of_providers(param_dtype, compute_dtype, {**auto_kernels(platform), **served})


def estimate_bytes(
    model: ModelConfig,
    parallel: ParallelOptions,
    seq_len: int,
    batch_size: int,
    remat: str,
    layout_devices: int,
    device_kind: str,
    precision: Precision,
    usable: float | None = None,
) -> float:
    """The one memory estimate of a run: peak bytes per device of ``model`` laid out by
    ``parallel`` over ``layout_devices`` devices, with ``remat``, for batches of ``batch_size``
    rows of ``seq_len`` tokens (a DiT's row: its patches), in ``precision``
    (:func:`run_precision`), on devices of ``device_kind``: the planner's
    :func:`titan.planning.memory.memory_per_device` total, as ``titan plan`` prints it.
    ``--remat auto``, the memory check and ``run_start`` all read it.

    On a device whose compiler fits the program to the memory itself (:func:`compiler_fits`:
    a TPU), the estimate is at most ``usable`` (bytes per device, when known): XLA:TPU
    rematerializes a program that would need more, and refuses at compile one it cannot bring
    under (module docstring)."""
    layout = Layout.from_parallel(parallel, layout_devices, remat)
    # Only the workspace allowance (none on CPU, one figure for every accelerator) is read from
    # the catalog entry; an accelerator the catalog does not list uses the H200's.
    gpu = gpu_for_device_kind(device_kind) or find_gpu("h200")
    tokens = model.patches or seq_len  # a DiT's row is one image
    total = memory_per_device(model, layout, gpu, tokens, batch_size, precision).total
    if usable is not None and compiler_fits(device_kind):
        return min(total, usable)
    return total


def compiler_fits(device_kind: str) -> bool:
    """Whether XLA fits a program to the memory of a ``device_kind`` device itself: on a TPU its
    compiler rematerializes a program whose buffers would exceed the HBM and refuses at compile
    (``RESOURCE_EXHAUSTED``) one it cannot bring under. Measured on one TPU v5e
    (docs/planner.md): a 0.32B Llama at 16 x 2048 tokens without remat, estimated at 85.2 GB,
    compiled to 17.0 GB and ran; at 32 x 2048 with full remat the compile was refused. So there
    the compiler, not the estimate, is the memory check."""
    spec = gpu_for_device_kind(device_kind)
    return spec is not None and spec.accelerator == "tpu"


@dataclass(frozen=True)
class MemoryCheck:
    """The outcome, as ``run_start``'s ``memory_check``.

    Attributes:
        estimate_bytes: the planner's peak per device of the run's layout.
        usable_bytes: the usable memory per device, or None when unknown.
        source: where ``usable_bytes`` comes from.
        checked: whether the estimate was compared (a known figure and the check enabled).
    """

    estimate_bytes: float
    usable_bytes: float | None
    source: str
    checked: bool

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Traced:
    """What a traced trainer tells the check.

    Attributes:
        devices: the devices the layout uses (all its stages).
        compute_dtype: the resolved compute dtype (``float32`` or ``bfloat16``).
        served: op -> provider that served it in the trace (``Ops.served``).
    """

    devices: int
    compute_dtype: str
    served: dict[str, str]


@dataclass(frozen=True)
class _Estimator:
    """The planner's estimate for the run, with batch size and remat as the free variables."""

    model: ModelConfig
    parallel: ParallelOptions
    seq_len: int
    devices: int
    device_kind: str
    precision: Precision
    usable: float | None

    def bytes(self, batch_size: int, remat: str) -> float:
        return estimate_bytes(
            self.model,
            self.parallel,
            self.seq_len,
            batch_size,
            remat,
            self.devices,
            self.device_kind,
            self.precision,
            self.usable,
        )

    def batch_unit(self, remat: str) -> int:
        layout = Layout.from_parallel(self.parallel, self.devices, remat)
        return layout.replicas * layout.microbatches

    def largest_batch(self, usable: float, batch_size: int, remat: str) -> int | None:
        """The largest batch size below ``batch_size`` that fits (estimate <= usable), or None."""
        unit = self.batch_unit(remat)
        low, high = 0, batch_size // unit  # fits at low (0: none), not at high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (
                (middle, high) if self.bytes(middle * unit, remat) <= usable else (low, middle)
            )
        return low * unit or None

    def fitting_remat(self, usable: float, batch_size: int) -> list[str]:
        return [name for name in REMAT_POLICIES if self.bytes(batch_size, name) <= usable]


def check_memory(
    model: ModelConfig,
    compute: ComputeOptions,
    parallel: ParallelOptions,
    data: DataOptions,
    traced: Traced,
    devices: Sequence[Any],
    usable_override: float = 0.0,
) -> MemoryCheck:
    """Compare the planner's estimate of the run (``model`` in ``compute``'s dtypes and remat,
    laid out by ``parallel``, batches of ``data``'s ``--batch-size`` x ``--seq-len``) with the
    usable memory of ``devices`` (the run's devices in this process).

    Args:
        traced: what the traced trainer tells: its devices, compute dtype and the operators'
            providers.
        usable_override: ``--debug-usable-memory`` (0: the devices' own figure).

    Raises:
        TitanError: the estimate is above the usable memory and the check is on (one line: the
            estimate, the usable memory, what would fit, and ``--no-memory-check``).
    """
    platform = devices[0].platform
    precision = run_precision(compute.param_dtype, traced.compute_dtype, platform, traced.served)
    kind = devices[0].device_kind
    usable, source = _usable(usable_override, devices)
    estimator = _Estimator(model, parallel, data.seq_len, traced.devices, kind, precision, usable)
    batch, remat = data.batch_size, compute.remat
    estimate = estimator.bytes(batch, remat)
    check = MemoryCheck(estimate, usable, source, compute.memory_check and usable is not None)
    if check.checked and usable is not None and estimate > usable:  # checked: usable is known
        raise TitanError(
            f"memory check: --batch-size {batch} with --remat {remat} needs an estimated "
            f"{estimate / GB:,.2f} GB per device (titan.planning.memory), above the "
            f"{usable / GB:,.2f} GB usable ({source}); "
            f"{_what_fits(estimator, usable, batch, remat)}; --no-memory-check runs anyway"
        )
    return check


@dataclass(frozen=True)
class RematChoice:
    """What ``--remat auto`` resolved to (:func:`resolve_remat`), and what compiling it showed.

    Attributes:
        remat: the policy the run trains with.
        estimate_bytes: its estimated peak per device (None: not estimated, the policy given or
            the only candidate).
        usable_bytes: the usable memory per device, or None when unknown.
        fallbacks: the later candidates with their estimates (bytes), tried in order when the
            compiled program of ``remat`` is over ``usable_bytes``.
        passed_over: the candidates whose compiled program was over, with its bytes.
        compiled_bytes: the compiled program's bytes per device, once compiled and known.
    """

    remat: Remat
    estimate_bytes: float | None = None
    usable_bytes: float | None = None
    fallbacks: tuple[tuple[Remat, float], ...] = ()
    passed_over: tuple[tuple[Remat, int], ...] = ()
    compiled_bytes: int | None = None

    def over(self, program_bytes: int | None) -> bool:
        """Whether a compiled program of ``program_bytes`` per device is over the usable memory
        with a later candidate left to try (unknown figures are never over)."""
        if not self.fallbacks or program_bytes is None or self.usable_bytes is None:
            return False
        return program_bytes > self.usable_bytes

    def compiled(self, program_bytes: int | None) -> RematChoice:
        """This choice once its program compiled to ``program_bytes`` per device: kept as it
        is when it fits, else the next candidate's."""
        if not self.over(program_bytes):
            return dataclasses.replace(self, compiled_bytes=program_bytes)
        assert program_bytes is not None  # over() knows it
        (remat, estimate), *rest = self.fallbacks
        over = (*self.passed_over, (self.remat, program_bytes))
        return RematChoice(remat, estimate, self.usable_bytes, tuple(rest), over)

    def refused(self, required_bytes: int | None) -> RematChoice | None:
        """The next candidate once XLA refused to compile this choice's program
        (:class:`ProgramOverMemory`, needing ``required_bytes`` per device where XLA says), or
        None when no candidate is left."""
        if not self.fallbacks:
            return None
        (remat, estimate), *rest = self.fallbacks
        over = (*self.passed_over, (self.remat, required_bytes or 0))
        return RematChoice(remat, estimate, self.usable_bytes, tuple(rest), over)

    def line(self) -> str | None:
        """The line ``titan train`` prints for an ``auto`` choice, else None."""
        if self.estimate_bytes is None:
            return None
        figures = [f"an estimated {self.estimate_bytes / GB:,.2f} GB per device"]
        if self.compiled_bytes is not None:
            figures.append(f"compiled {self.compiled_bytes / GB:,.2f} GB")
        usable = "usable memory unknown"
        if self.usable_bytes is not None:
            usable = f"{self.usable_bytes / GB:,.2f} GB usable"
        line = f"--remat auto: {self.remat} ({', '.join([*figures, usable])})"
        for remat, program in self.passed_over:
            over = f"compiled to {program / GB:,.2f} GB, over" if program else "refused by XLA"
            line += f"; {remat} {over}"
        return line


class ProgramOverMemory(TitanError):
    """XLA refused to compile the train step: its program needs more device memory than there
    is (XLA:TPU fits a program by rematerializing, and refuses one it cannot bring under).

    Args:
        said: XLA's own line (from ``RESOURCE_EXHAUSTED``).
        required_bytes: the bytes per device XLA says the program needs, or None where its
            message gives no figure.
        tried: the ``--remat`` policies ``auto`` tried, each refused (empty: the policy given).

    The message is one line: what XLA said and what may fit instead (a smaller batch, more
    devices, and a policy that saves less when ``auto`` did not try them all).
    """

    def __init__(self, said: str, required_bytes: int | None, tried: Sequence[str] = ()) -> None:
        if tried:
            advice = (
                f"--remat auto tried {', '.join(tried)} and none fit; a smaller --batch-size or "
                "more devices (--fsdp) may fit"
            )
        else:
            advice = (
                "a smaller --batch-size, a --remat that saves less (dots, full) or more "
                "devices (--fsdp) may fit"
            )
        super().__init__(
            f"the train step does not fit the device memory: XLA refused its program ({said}); "
            + advice
        )
        self.said = said
        self.required_bytes = required_bytes
        self.tried = tuple(tried)


# XLA:TPU's refusal, e.g. "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory
# required for HLO temporaries (19.55G) exceeds available HBM (15.75G)." Its G is GiB: the
# available 15.75G of a TPU v5e is its bytes_limit, 16,909,336,064 bytes.
_REQUIRED = re.compile(r"required for [\w ]+\(([\d.]+)G\)")


def program_over_memory(err: BaseException) -> ProgramOverMemory | None:
    """``err`` as a :class:`ProgramOverMemory` when it is XLA's refusal to compile a program
    over the device memory (a ``RESOURCE_EXHAUSTED`` error about memory), else None. The
    message is one line: what XLA said and what may fit instead."""
    text = str(err)
    if "RESOURCE_EXHAUSTED" not in text or "memory" not in text.lower():
        return None
    said = text[text.index("RESOURCE_EXHAUSTED") :].splitlines()[0].strip()
    found = _REQUIRED.search(said)
    required = int(float(found.group(1)) * 2**30) if found else None
    return ProgramOverMemory(said, required)


def resolve_remat(
    model: ModelConfig,
    options: TrainerOptions,
    layout_devices: int,
    compute_dtype: str,
    devices: Sequence[Any],
    usable_override: float = 0.0,
    served: Mapping[str, str] | None = None,
) -> RematChoice:
    """The ``--remat`` policy of a run of ``model`` built from ``options``: as given, or for
    ``auto`` the first of :func:`titan.remat.auto_candidates` (for the devices' platform) whose
    estimated peak per device fits the usable memory (the last candidate when none fits, and
    the first when the usable memory is unknown; the memory check then speaks for it), with the
    later candidates as its fallbacks (module docstring).

    Args:
        layout_devices: the devices present (``--dp 0`` takes those the other axes leave).
        compute_dtype: the resolved compute dtype (``float32`` or ``bfloat16``).
        devices: the run's devices in this process.
        usable_override: ``--debug-usable-memory`` (0: the devices' own figure).
        served: op -> provider that served in a trace of the model; None before any trace.

    The estimate (:func:`estimate_bytes`) prices the providers of :func:`run_precision`: before
    the trace, the kernels the registry serves unasked (:func:`auto_kernels`), as ``titan plan``
    does; after it, those that served, as the memory check does.
    """
    compute = options.compute
    candidates = auto_candidates(devices[0].platform)
    if compute.remat != AUTO or len(candidates) == 1:  # nothing to choose
        return RematChoice(cast(Remat, candidates[0]) if compute.remat == AUTO else compute.remat)
    platform = devices[0].platform
    precision = run_precision(compute.param_dtype, compute_dtype, platform, served or {})
    kind = devices[0].device_kind
    usable, _ = _usable(usable_override, devices)
    estimator = _Estimator(
        model, options.parallel, options.seq_len, layout_devices, kind, precision, usable
    )
    batch = options.batch_size
    estimates = [(cast(Remat, n), estimator.bytes(batch, n)) for n in candidates]
    if usable is None:
        return RematChoice(*estimates[0], usable)
    first = next((i for i, (_, e) in enumerate(estimates) if e <= usable), len(estimates) - 1)
    return RematChoice(*estimates[first], usable, tuple(estimates[first + 1 :]))


def _usable(override: float, devices: Sequence[Any]) -> tuple[float | None, str]:
    if override:
        return override, "--debug-usable-memory"
    limit = usable_bytes(devices)
    if limit is not None:
        return float(limit), "bytes_limit of jax.Device.memory_stats()"
    host = host_memory_bytes()
    if host is not None and all(getattr(d, "platform", "") == "cpu" for d in devices):
        shared = f"{len(devices)} CPU device" + ("s" if len(devices) > 1 else "")
        return host / len(devices), f"the host's memory shared by {shared}"
    return None, "unknown: the backend reports no bytes_limit"


def _what_fits(estimator: _Estimator, usable: float, batch_size: int, remat: str) -> str:
    options = []
    batch = estimator.largest_batch(usable, batch_size, remat)
    if batch is not None:
        options.append(f"--batch-size {batch}")
    options += [f"--remat {name}" for name in estimator.fitting_remat(usable, batch_size)]
    if not options:
        return "no smaller batch or remat policy fits this layout (more devices or FSDP would)"
    return "would fit: " + " or ".join(options)
