"""Pinned host memory for the copies of checkpoint saves, reserved before the first save.

On GPUs orbax copies every array of a save into pinned host memory (its
``enable_pinned_host_transfer`` default: ``jax.default_backend() == "gpu"``,
``orbax.checkpoint`` ``BasePyTreeCheckpointHandler``). XLA takes that memory from a pool that
it grows on demand and keeps for the process; while the pool grows, the GPU's other work waits
on the driver. Measured on one H200 (``bench/results/checkpoint-nvidia-h200.json``): growing it
by 18.0 GB for ``llama3-1b``'s state took 15.1 s (about 1.2 GB/s), and where the first save grew
it instead, that save held back the steps it overlapped by 13.2 s in all (later saves: under
0.2 s).

:func:`reserve_host` grows the pool to the bytes that a save copies, after the run's first
step and before its first save (:class:`titan.trainer.loop_hooks.pin_host_hook.PinHostHook`):
the loop's steps then run at their speed while the first save is written, and the reservation
is timed on its own (a ``pinned_host`` event, checkpoint badput in ETTR). Growing it on a
thread beside the set-up or the steps would not hide it: loading the compiled program, the state's
initialization and the steps wait on the driver too. The reservation copies zeros from host
memory and never reads a device array. It pays only where a save would otherwise overlap steps
(:func:`reservation_pays`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from titan.checkpoint.stage_store import owner
from titan.config import CheckpointOptions
from titan.errors import error_line
from titan.telemetry.events import PinnedHost

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
        return math.prod(self.shape) * self.dtype.itemsize


def orbax_pins_host() -> bool:
    """Whether orbax copies a save through pinned host memory here: its default,
    ``jax.default_backend() == "gpu"`` (module docstring)."""
    return jax.default_backend() == "gpu"


def orbax_replica_parallel() -> bool:
    """Whether orbax splits a replicated shard among its replicas, each copying a slice: its
    ``ArrayHandler`` default, unless ``JAX_PLATFORMS`` names ``gpu`` or ``cuda``
    (``orbax.checkpoint`` ``jax_array_handlers._get_default_use_replica_parallel``)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    return "gpu" not in platforms and "cuda" not in platforms


def copied_shards(items: dict[str, Any], replica_parallel: bool | None = None) -> list[Shard]:
    """What orbax copies to host memory on this process to save ``items`` (checkpoint items:
    trees of ``jax.Array``, or of ``jax.ShapeDtypeStruct`` carrying their shardings), one
    :class:`Shard` per copy.

    Orbax's rule (``orbax.checkpoint`` ``replica_slices.get_replica_slices``, with the
    defaults Titan leaves it): an index held by R devices (its replicas, numbered in the order
    of ``Sharding.devices_indices_map``, as JAX numbers them) is copied by replica 0 whole; or,
    when ``replica_parallel`` (default :func:`orbax_replica_parallel`), R > 1, the shard is not
    empty and one of its dimensions divides by R, by every replica, each a 1/R slice along the
    first such dimension.

    Items held by a single process among several (:func:`titan.checkpoint.stage_store.owner`)
    are written by the stage store, not by orbax, and are left out. So are leaves of extended
    dtypes (PRNG keys; orbax copies their few bytes of key data).
    """
    split = orbax_replica_parallel() if replica_parallel is None else replica_parallel
    shards: list[Shard] = []
    for tree in items.values():
        if owner(tree) is None:
            for leaf in jax.tree.leaves(tree):
                if not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
                    shards += _copies(leaf, split)
    return shards


def _copies(leaf: Any, split: bool) -> list[Shard]:
    """:func:`copied_shards` of one array."""
    replicas: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    for device, index in leaf.sharding.devices_indices_map(leaf.shape).items():
        bounds = tuple(s.indices(n)[:2] for s, n in zip(index, leaf.shape, strict=True))
        replicas.setdefault(bounds, []).append(device)
    dtype = np.dtype(leaf.dtype)
    copies = []
    for bounds, devices in replicas.items():
        shape = [stop - start for start, stop in bounds]
        count = len(devices)
        axis = next((a for a, n in enumerate(shape) if n % count == 0), None)
        if split and count > 1 and math.prod(shape) > 0 and axis is not None:
            shape[axis] //= count
        else:
            devices = devices[:1]
        local = [d for d in devices if d.process_index == jax.process_index()]
        copies += [Shard(device, tuple(shape), dtype) for device in local]
    return copies


def reserve_host(
    items: dict[str, Any], pinned: bool | None = None, stopped: Callable[[], bool] = lambda: False
) -> PinnedHost | None:
    """Grow XLA's pinned host pool by the bytes that a save of ``items`` copies
    (:func:`copied_shards`; module docstring): place a buffer of zeros of each shard's shape in
    its device's pinned host memory, one shard after another (each placed while the one before
    is copied), and free them all, which leaves the pool that size. Blocks until done, or until
    ``stopped()`` is true between two shards (a stop signal: the run's last save is waited for
    anyway, and grows the pool itself).

    A failure (the pool's limit, ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB``, or the host's memory)
    is returned in the event's ``error``, never raised: the first save then grows the pool
    itself, as without a reservation.

    Args:
        items: checkpoint items (trees of ``jax.Array`` or of ``jax.ShapeDtypeStruct`` with
            shardings).
        pinned: whether saves copy through pinned host memory (default
            :func:`orbax_pins_host`).
        stopped: whether to stop reserving (asked before each shard).

    Returns:
        The ``pinned_host`` event (bytes, seconds; ``stopped`` when ``stopped()`` ended it),
        or None when nothing was reserved: saves copy no shard of this process through pinned
        memory.
    """
    if not (orbax_pins_host() if pinned is None else pinned):
        return None
    shards = copied_shards(items)
    if not shards:
        return None
    start = time.perf_counter()
    error, cut_short = None, False
    held: list[jax.Array] = []
    try:
        zeros = {(s.shape, s.dtype): np.zeros(s.shape, s.dtype) for s in shards}  # one a shape
        for shard in shards:
            if stopped():
                cut_short = True
                break
            memory = SingleDeviceSharding(shard.device, memory_kind=PINNED_HOST)
            held.append(jax.device_put(zeros[shard.shape, shard.dtype], memory))
            if len(held) > 1:  # one copy in flight while the next is placed
                held[-2].block_until_ready()
        jax.block_until_ready(held)
    except Exception as err:  # noqa: BLE001 - in the event: a save does without
        error = error_line(err)
    finally:
        held.clear()
    return PinnedHost(
        bytes=sum(shard.nbytes for shard in shards),
        seconds=time.perf_counter() - start,
        error=error,
        stopped=cut_short or None,
    )


def reservation_pays(options: CheckpointOptions, start: int, steps: int) -> bool:
    """Whether to reserve before the first save: ``--checkpoint-pin-host``, where saves copy
    through pinned host memory (:func:`orbax_pins_host`: not on CPU) and a reservation can
    spare the steps anything: saves are asynchronous (``--checkpoint-async``; a synchronous
    save holds the loop for all of its work anyway) and one comes before the run's last
    (``--checkpoint-every-s``, or a multiple of ``--checkpoint-every`` after ``start`` and
    before ``steps``; the last save is waited for, and grows the pool in that wait as well as
    before it)."""
    every = options.checkpoint_every
    overlapped = options.checkpoint_every_s > 0 or (start // every + 1) * every < steps
    asked = options.checkpoint_pin_host and options.checkpoint_async
    return asked and overlapped and orbax_pins_host()
