"""Verdicts of ``titan plan``: by how much a layout misses the memory, what would make it fit,
and how many GPUs a model needs when no layout of the GPUs given fits.

A layout fits when its estimated peak with the margin (``titan.planning.memory.FIT_MARGIN``)
is within the usable memory. What would make a layout that does not fit fit is searched with
the same estimator, changing one thing at a time: the ``--remat`` policy, more
``--microbatches`` (smaller microbatches), a larger ``--fsdp`` in place of data parallelism;
then, as ``--search`` finds them, the fastest layout of the same GPUs that fits (with how many
fit), or, when none does, more GPUs (the smallest power-of-two multiple of ``--gpus`` whose
``--search`` finds a layout that fits, up to :func:`titan.planning.budget.max_layout_gpus`,
past which no layout of the model and batch exists).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from titan.errors import TitanError
from titan.planning.budget import (
    Plan,
    PlanRequest,
    check_request,
    divisors,
    max_layout_gpus,
    plan,
    search,
)
from titan.planning.memory import Layout
from titan.remat import REMAT_POLICIES

GB = 1e9


@dataclass(frozen=True)
class Verdict:
    """A plan's memory verdict.

    Attributes:
        fits: the estimate with its margin is within the usable memory.
        over_bytes: bytes per device above the usable memory (margin included; <= 0 fits).
        remedies: ``titan plan`` flags (or a GPU count) that make the layout fit, each with
            its estimate, as one line each (module docstring); empty when it fits.
    """

    fits: bool
    over_bytes: float
    remedies: tuple[str, ...]

    def summary(self, p: Plan) -> str:
        """One line: fits, or by how much it does not."""
        m = p.memory
        if self.fits:
            return (
                f"fits: {m.total / GB:,.2f} GB estimated, {m.fit_bytes / GB:,.2f} GB with the "
                f"margin, of {m.capacity / GB:,.2f} GB usable"
            )
        return (
            f"does not fit: {m.total / GB:,.2f} GB estimated, {m.fit_bytes / GB:,.2f} GB with "
            f"the margin, {self.over_bytes / GB:,.2f} GB over the {m.capacity / GB:,.2f} GB "
            "usable"
        )


def verdict(p: Plan) -> Verdict:
    """The verdict of plan ``p``, with what would make it fit when it does not."""
    over = p.memory.fit_bytes - p.memory.capacity
    if p.memory.fits:
        return Verdict(True, over, ())
    return Verdict(False, over, tuple(_remedies(p)))


def _fitting(request: PlanRequest, layout: Layout) -> Plan | None:
    try:
        candidate = plan(request, layout)
    except TitanError:
        return None
    return candidate if candidate.memory.fits else None


def _describe(flags: str, p: Plan) -> str:
    return f"{flags}: {p.memory.total / GB:,.2f} GB estimated"


def _remedies(p: Plan) -> Iterator[str]:
    request, layout = p.request, p.layout
    for remat in REMAT_POLICIES:
        if remat != layout.remat and (fit := _fitting(request, _with(layout, remat=remat))):
            yield _describe(f"--remat {remat}", fit)
    rows = request.batch_sequences // layout.replicas
    for m in (k for k in divisors(rows) if k > layout.microbatches):
        if fit := _fitting(request, _with(layout, microbatches=m)):
            yield _describe(f"--microbatches {m}", fit)
            break
    data = layout.dp * layout.fsdp
    for fsdp in (k for k in divisors(data) if k > layout.fsdp):
        if fit := _fitting(request, _with(layout, fsdp=fsdp, dp=data // fsdp)):
            yield _describe(f"--fsdp {fsdp} --dp {data // fsdp}", fit)
            break
    yield from _other_layouts(request)


def _other_layouts(request: PlanRequest) -> Iterator[str]:
    """The fastest layout of ``request.gpus`` that fits (``--search``'s first), with how many
    fit; when none does, the GPUs :func:`gpus_needed` and the fastest layout there."""
    fitting = search(request)
    if fitting:
        best = fitting[0]
        yield _describe(best.layout.flags(), best) + (
            f" (the fastest of the {len(fitting)} layouts of {request.gpus} "
            f"{request.gpu.unit}s that fit; "
            "--search without layout options ranks them)"
        )
        return
    needed = gpus_needed(request)
    if needed is not None:
        best = search(dataclasses.replace(request, gpus=needed))[0]
        yield _describe(f"{request.gpu.count_flag} {needed} {best.layout.flags()}", best)


def _with(layout: Layout, **changes: Any) -> Layout:
    return dataclasses.replace(layout, **changes)


def gpus_needed(request: PlanRequest) -> int | None:
    """The smallest power-of-two multiple of ``request.gpus`` (above it) that
    :func:`titan.planning.budget.check_request` takes and at which ``--search`` finds a layout
    that fits, or None up to :func:`max_layout_gpus` (no layout spans more)."""
    factor = 2
    while request.gpus * factor <= max_layout_gpus(request.model, request.batch_sequences):
        gpus = request.gpus * factor
        try:  # a count the request refuses: one that fills no whole node, or no TPU slice
            check_request(dataclasses.replace(request, gpus=gpus))
        except TitanError:
            factor *= 2
            continue
        if search(dataclasses.replace(request, gpus=gpus)):
            return gpus
        factor *= 2
    return None
