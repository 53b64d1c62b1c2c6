"""Pinned host memory for the copies of checkpoint saves, reserved while the run sets up.

On GPUs orbax copies every array of a save into pinned host memory (its
``enable_pinned_host_transfer`` default: ``jax.default_backend() == "gpu"``,
``orbax.checkpoint`` ``BasePyTreeCheckpointHandler``). XLA takes that memory from a pool that
it grows on demand and keeps for the process. Growing the pool pins pages at about 2 GB/s, and
while it grows the GPU's other work waits on the driver. Measured on one H200 (``jax`` 0.11.2):
14.8 GB took 7.4 s, during which a training loop on another thread lost 6.9 s. So the first save
of an 18 GB ``llama3-1b`` state held the loop back by 9 to 13 s, and every later save by under
0.1 s.

:func:`reserve_host` grows the pool to the bytes that a save copies once the step is compiled,
before the first step: the loop's steps then run at their speed while the first save is written,
and the reservation is timed on its own (a ``pinned_host`` event, checkpoint badput in ETTR).
Growing it on a thread beside the compilation saves nothing: loading the compiled program and
autotuning wait on the driver too (measured: a 1.3 s load from the compilation cache took 15 s
beside a reservation). The reservation copies zeros from host memory and never reads a device
array.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from titan.telemetry.events import PinnedHost
from titan.trainer.stage_store import owner

PINNED_HOST = "pinned_host"  # the memory kind orbax copies a save into on GPUs


@dataclass(frozen=True)
class Shard:
    """One shard that a save copies to pinned host memory on this process.

    Attributes:
        device: the device that holds it.
        shape: its shape (elements per dimension).
        dtype: its dtype.
    """

    device: Any
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def orbax_pins_host() -> bool:
    """Whether orbax copies a save through pinned host memory here: its default,
    ``jax.default_backend() == "gpu"`` (module docstring)."""
    return jax.default_backend() == "gpu"


def copied_shards(items: dict[str, Any]) -> list[Shard]:
    """The shards of ``items`` (checkpoint items: trees of ``jax.Array`` or of
    ``jax.ShapeDtypeStruct`` carrying their shardings) that orbax copies to host memory on this
    process.

    Orbax copies replica 0 of each shard: the first device that holds that index, in the order
    of ``Sharding.devices_indices_map`` (JAX numbers replicas in this order). Items held by a
    single process among several (:func:`titan.trainer.stage_store.owner`) are written by the
    stage store, not by orbax, and are left out. So are leaves of extended dtypes (PRNG keys),
    which have no NumPy form.
    """
    shards: list[Shard] = []
    for tree in items.values():
        if owner(tree) is None:
            for leaf in jax.tree.leaves(tree):
                shards += _first_replicas(leaf)
    return shards


def _first_replicas(leaf: Any) -> list[Shard]:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
        return []
    seen: set[tuple[tuple[int, int], ...]] = set()
    shards = []
    for device, index in leaf.sharding.devices_indices_map(leaf.shape).items():
        bounds = tuple(s.indices(n)[:2] for s, n in zip(index, leaf.shape, strict=True))
        if bounds in seen:
            continue
        seen.add(bounds)
        if device.process_index == jax.process_index():
            shape = tuple(stop - start for start, stop in bounds)
            shards.append(Shard(device, shape, np.dtype(leaf.dtype)))
    return shards


def reserve_host(items: dict[str, Any], pinned: bool | None = None) -> PinnedHost | None:
    """Grow XLA's pinned host pool by the bytes that a save of ``items`` copies
    (:func:`copied_shards`; module docstring): place a buffer of zeros of each shard's shape in
    its device's pinned host memory, wait until all are there, and free them, which leaves the
    pool that size. Blocks until done.

    A failure (the pool's limit, ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB``, or the host's memory)
    is returned in the event's ``error``, never raised: the first save then grows the pool
    itself, as without a reservation.

    Args:
        items: checkpoint items (trees of ``jax.Array`` or of ``jax.ShapeDtypeStruct`` with
            shardings).
        pinned: whether saves copy through pinned host memory (default
            :func:`orbax_pins_host`).

    Returns:
        The ``pinned_host`` event (bytes, seconds), or None when nothing was reserved: saves
        copy no shard of this process through pinned memory.
    """
    if not (orbax_pins_host() if pinned is None else pinned):
        return None
    shards = copied_shards(items)
    if not shards:
        return None
    start = time.perf_counter()
    zeros: dict[tuple[tuple[int, ...], np.dtype], np.ndarray] = {}
    error = None
    try:
        held = [
            jax.device_put(
                zeros.setdefault((s.shape, s.dtype), np.zeros(s.shape, s.dtype)),
                SingleDeviceSharding(s.device, memory_kind=PINNED_HOST),
            )
            for s in shards
        ]
        jax.block_until_ready(held)
        del held
    except Exception as err:  # noqa: BLE001 - in the event: a save does without
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
    return PinnedHost(
        bytes=sum(shard.nbytes for shard in shards),
        seconds=time.perf_counter() - start,
        error=error,
    )
