"""Whether a layout fits the devices a run sees: the rules that need only the device count.

- the mesh shape of dp x fsdp x tp (x pp stages), with ``--dp 0`` filled from the devices left
  (:func:`resolve_mesh_shape`);
- a batch, and each of its ``--microbatches``, split over the ``data`` x ``fsdp`` replicas
  (:func:`check_batch_splits`, :func:`microbatch_rows`);
- both at once for a config (:func:`check_layout`).

Plain Python, no JAX: ``titan train`` applies these rules to ``jax.devices()``
(:func:`titan.layouts.builders.check_layout_fits`, :func:`titan.parallel.mesh.build_stage_meshes`)
and the console to the device count that a child process reports in the run's environment, so
both refuse a layout with the same one-line :class:`~titan.errors.TitanError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from titan.errors import TitanError


class BatchSplitError(TitanError):
    """A batch (or its microbatches) whose rows do not split over dp x fsdp; the message names
    the ``--batch-size`` that would."""


class LayoutSizes(Protocol):
    """What the rules read of a layout: :class:`titan.config.ParallelOptions` (``--layout``,
    ``--dp``, ``--fsdp``, ``--tp``, ``--pp``, ``--microbatches``)."""

    @property
    def layout(self) -> str: ...
    @property
    def dp(self) -> int: ...
    @property
    def fsdp(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def microbatches(self) -> int: ...


def resolve_mesh_shape(
    dp: int, fsdp: int, tp: int, pp: int, device_count: int, backend: str
) -> dict[str, int]:
    """Mesh axis sizes (devices per axis) of one stage, with ``dp == 0`` filled from the devices
    left by fsdp x tp x pp.

    Args:
        dp, fsdp, tp: ``--dp``, ``--fsdp``, ``--tp`` (``dp`` 0: all the devices left).
        pp: pipeline stages (1 for SPMD).
        device_count: devices present (``len(jax.devices())``).
        backend: their platform as ``jax.default_backend()`` names it (``cpu``, ``gpu``), for
            the message.

    Returns:
        ``{"data": dp, "fsdp": fsdp, "tensor": tp}``.

    Raises:
        TitanError: the layout asks for more devices than are present
            (``--dp 2 x --fsdp 1 x --tp 1 = 2 devices asked, 1 present (cpu)``).
    """
    per_dp = pp * fsdp * tp
    dp = dp or device_count // per_dp
    asked = max(dp, 1) * per_dp
    if dp == 0 or asked > device_count:
        stages = f" x --pp {pp}" if pp > 1 else ""
        raise TitanError(
            f"--dp {max(dp, 1)} x --fsdp {fsdp} x --tp {tp}{stages} = {asked} devices "
            f"asked, {device_count} present ({backend})"
        )
    return {"data": dp, "fsdp": fsdp, "tensor": tp}


def check_batch_splits(batch_size: int, mesh_shape: Mapping[str, int]) -> None:
    """Refuse a batch of ``batch_size`` rows that does not split over ``data`` x ``fsdp``.

    Raises:
        BatchSplitError: ``batch_size`` is not a multiple of dp x fsdp (the message names the
            ``--batch-size`` that would split).
    """
    parts = mesh_shape["data"] * mesh_shape["fsdp"]
    if batch_size % parts:
        raise BatchSplitError(
            f"--batch-size {batch_size} is not a multiple of dp x fsdp = "
            f"{mesh_shape['data']} x {mesh_shape['fsdp']} (mesh axes 'data' x 'fsdp'): "
            f"{_batch_that_splits(batch_size, parts)}"
        )


def microbatch_rows(batch_size: int, microbatches: int, mesh_shape: Mapping[str, int]) -> int:
    """Rows per microbatch, B / M, when they split over ``data`` x ``fsdp``.

    Raises:
        BatchSplitError: B / M is not a whole number of rows, or not a multiple of dp x fsdp
            (the message names the ``--batch-size`` that would split).
    """
    parts = mesh_shape["data"] * mesh_shape["fsdp"]
    if microbatches == 1:
        check_batch_splits(batch_size, mesh_shape)
    elif batch_size % (microbatches * parts):
        raise BatchSplitError(
            f"--batch-size {batch_size} / --microbatches {microbatches} = "
            f"{batch_size / microbatches:g} rows per microbatch, not a multiple of "
            f"dp x fsdp = {mesh_shape['data']} x {mesh_shape['fsdp']} (mesh axes 'data' x "
            f"'fsdp'): {_batch_that_splits(batch_size, microbatches * parts)}"
        )
    return batch_size // microbatches


def check_layout(par: LayoutSizes, batch_size: int, device_count: int, backend: str) -> str | None:
    """Refuse a layout ``par`` that ``device_count`` devices cannot hold, or a batch of
    ``batch_size`` rows whose microbatches do not split over its replicas.

    Args:
        par: the layout's sizes (``cfg.parallel``).
        batch_size: rows per step (``--batch-size``).
        device_count: devices the run sees (``len(jax.devices())``).
        backend: their platform (``jax.default_backend()``), for the message.

    Returns:
        A note when the layout leaves devices idle (``the layout uses 2 of the 8 devices
        (--dp 1 x --fsdp 1 x --tp 1 x --pp 2)``), else None.

    Raises:
        TitanError: the layout asks for more devices than are present.
        BatchSplitError: the rows per microbatch are not a multiple of dp x fsdp (one line,
            naming the flag).
    """
    pp = par.pp if par.layout == "mpmd" else 1
    shape = resolve_mesh_shape(par.dp, par.fsdp, par.tp, pp, device_count, backend)
    microbatch_rows(batch_size, par.microbatches, shape)
    used = shape["data"] * shape["fsdp"] * shape["tensor"] * pp
    if used == device_count:
        return None
    sizes = f"--dp {shape['data']} x --fsdp {shape['fsdp']} x --tp {shape['tensor']}"
    return f"the layout uses {used} of the {device_count} devices ({sizes} x --pp {pp})"


def _batch_that_splits(batch_size: int, multiple: int) -> str:
    """``--batch-size N would split``: the next multiple of ``multiple`` from ``batch_size``."""
    return f"--batch-size {-(-batch_size // multiple) * multiple} would split"
