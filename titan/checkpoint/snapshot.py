"""A copy of the train state on its own devices, for a checkpoint written in the background.

An asynchronous save must not hold the loop while orbax copies the state to host memory (about
2 GB/s measured for an 18 GB ``llama3-1b`` state on an H200: 5.7 to 15.5 s per save). A copy
on the device runs at HBM speed instead (the H200's device-to-device copy moved about
4.3 TB/s, counting bytes read and written), so the loop waits only for it to be dispatched;
orbax then reads the copy to host memory and writes it from a background thread while the
loop's next steps donate and overwrite the original buffers.

The copy needs room: :func:`snapshot_fits` asks each device's allocator
(``Device.memory_stats()``) whether its limit less its peak so far holds the copy with a margin.
A backend that reports no statistics (XLA:CPU) keeps its arrays in host memory, where orbax's
own copy would go anyway, and gets the copy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import jax

SNAPSHOT_MARGIN = 0.05  # of each device's memory limit, kept free beside the copy


def bytes_per_device(tree: Any) -> dict[Any, int]:
    """Bytes each device holds of ``tree``'s arrays (their addressable shards)."""
    held: dict[Any, int] = defaultdict(int)
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", []):
            held[shard.device] += shard.data.nbytes
    return dict(held)


def snapshot_fits(tree: Any, margin: float = SNAPSHOT_MARGIN) -> bool:
    """Whether a second copy of ``tree`` fits beside the peak use of every device holding it:
    ``peak_bytes_in_use + copy <= (1 - margin) x bytes_limit`` (the allocator's own figures;
    the peak covers the step's temporaries, which run again while the copy lives). True on a
    device without memory statistics (module docstring)."""
    for device, needed in bytes_per_device(tree).items():
        stats = device.memory_stats()
        if not stats or "bytes_limit" not in stats:
            continue
        used = stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0))
        if used + needed > (1 - margin) * stats["bytes_limit"]:
            return False
    return True


def device_snapshot(tree: Any) -> Any:
    """A copy of every array of ``tree`` in new buffers on the same devices with the same
    shardings (``jax.device_put(..., may_alias=False)``); dispatched asynchronously, so the
    call returns before the copy is done. Donating the originals afterwards is safe: the
    runtime lets the donation wait for the copy's reads."""
    return jax.device_put(tree, may_alias=False)
