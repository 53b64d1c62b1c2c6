"""Training FLOPs of a run and its MFU: the fields ``model_flops_per_token`` and ``mfu`` of
``step`` events.

FLOPs per token come from :mod:`titan.flops` (6 N + 12 L s d, attention halved for
the ``causal`` convention or counted in ``full``; see there for sources). Hardware FLOPs add the
forward work that ``--remat`` redoes in the backward pass (:func:`layer_recompute_flops`); their
ratio to the peak is the HFU. For ``full`` that counts the whole layer forward, while XLA drops
the recomputed MLP down projection (2 d ffn FLOPs per token and layer), whose output the
backward pass does not need (``tests/unit/test_flops.py`` measures it).

The peak is the catalog's dense figure for the compute dtype (:mod:`titan.gpus`), over
all devices of the run. It is never guessed, so MFU is None with a reason when:

- the devices are not in the catalog, or are of several kinds;
- the compute dtype is not the one the catalog's figure is for (bfloat16 on GPUs and TPUs);
- the devices are CPUs: the catalog's CPU entry is a float32 matmul rate measured on the 2-core
  development VM (43 GFLOP/s), not a peak, and ``titan train`` runs there exceed it (about
  60 GFLOP/s of model FLOPs for ``tiny`` at 16 x 128 tokens), which would read as an MFU above 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from titan.flops import hardware_flops_per_token
from titan.gpus import gpu_for_device_kind

__all__ = ["FlopsMeter", "Peak", "device_peak", "hardware_flops_per_token"]


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of a run's devices.

    Attributes:
        flops: FLOP/s of all the run's devices together; None when unknown.
        kind: what the figure is, e.g. ``datasheet_dense_bfloat16``.
        source: where the figure comes from (the catalog's source).
        reason: why ``flops`` is None.
    """

    flops: float | None
    kind: str = ""
    source: str = ""
    reason: str = ""


def device_peak(device_kinds: list[str], device_count: int, compute_dtype: str) -> Peak:
    """Peak FLOP/s of ``device_count`` devices of ``device_kinds`` computing in
    ``compute_dtype`` (see the module docstring for when it is unknown)."""
    if len(set(device_kinds)) != 1:
        return Peak(None, reason=f"mixed or no device kinds: {sorted(set(device_kinds))}")
    spec = gpu_for_device_kind(device_kinds[0])
    if spec is None:
        reason = f"device kind {device_kinds[0]!r} is not in the accelerator catalog"
        return Peak(None, reason=reason)
    if spec.name == "cpu":
        return Peak(
            None,
            reason=f"the catalog's CPU entry ({spec.bf16_flops / 1e9:.0f} GFLOP/s) is a measured "
            "float32 matmul rate of one VM, not a peak; CPU runs exceed it",
        )
    if compute_dtype != spec.compute_dtype:
        return Peak(
            None,
            reason=f"the catalog's {spec.label} figure is for {spec.compute_dtype}, the run "
            f"computes in {compute_dtype}",
        )
    kind = f"datasheet_dense_{spec.compute_dtype}"
    return Peak(spec.bf16_flops * device_count, kind, spec.source)


class FlopsMeter:
    """Per-step FLOPs fields of one run.

    Args:
        model: training model FLOPs per token, by attention convention (``causal``, ``full``).
        hardware: the same with the recomputation of the remat policy added.
        peak: the devices' peak (:func:`device_peak`).
    """

    def __init__(self, model: dict[str, float], hardware: dict[str, float], peak: Peak) -> None:
        self.peak = peak
        self.model = dict(model)
        self.hardware = dict(hardware)

    def step_fields(self, tokens_per_s: float) -> dict[str, Any]:
        """``model_flops_per_token`` ({causal, full}) and ``mfu`` (None with ``mfu_reason`` when
        the peak is unknown): ``causal``, ``full``, ``hfu_causal``, ``hfu_full`` (fractions),
        ``peak_flops`` (FLOP/s), ``peak_kind`` (:attr:`Peak.kind`), ``peak_source``. JSON-shaped:
        :meth:`titan.telemetry.events.Step.from_fields` reads them into
        :class:`~titan.telemetry.events.FlopsPerToken` and
        :class:`~titan.telemetry.events.Mfu`."""
        fields: dict[str, Any] = {"model_flops_per_token": self.model}
        if self.peak.flops is None:
            return {**fields, "mfu": None, "mfu_reason": self.peak.reason}
        peak = self.peak.flops
        mfu: dict[str, Any] = {c: f * tokens_per_s / peak for c, f in self.model.items()}
        mfu.update({f"hfu_{c}": f * tokens_per_s / peak for c, f in self.hardware.items()})
        mfu.update(peak_flops=peak, peak_kind=self.peak.kind, peak_source=self.peak.source)
        return {**fields, "mfu": mfu}
