"""Collective communication times: the alpha-beta model of ring algorithms.

A message of ``n`` bytes between two GPUs takes alpha + n / beta (Hockney 1994, "The
communication challenge for MPP"): alpha the per-message latency (seconds), beta the link
bandwidth (bytes/s, one direction). A ring collective over ``p`` GPUs runs ``steps`` such
messages back to back, each carrying a 1/p share of the data, so its time is
steps x alpha + busbw_factor x bytes / beta, with the bus-bandwidth factors of nccl-tests
(NVIDIA nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth"):

- all-reduce: 2 (p - 1) steps, factor 2 (p - 1) / p of the buffer size;
- all-gather and reduce-scatter: p - 1 steps, factor (p - 1) / p of the *total* (gathered)
  size, i.e. of p x the per-GPU shard;
- point-to-point: 1 step, factor 1.

``bytes`` follows nccl-tests: the per-GPU buffer for all-reduce, the full gathered buffer for
all-gather and reduce-scatter.

Which link a group uses: a group of ``p`` GPUs spaced ``stride`` apart in device order (the
inner mesh axes are contiguous) stays inside one node when p x stride <= GPUs per node, and then
runs at the scale-up bandwidth (on a point-to-point mesh, at most (p - 1) peer links of a
GPU); otherwise the ring crosses the network and runs at the per-GPU scale-out bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan.gpus import GpuSpec

# Per-message latencies. Assumed, not measured here: small-message NCCL latency is a few
# microseconds per ring step over NVLink and somewhat more over InfiniBand; they matter only for
# small messages. Calibrate with nccl-tests on the target system.
INTRA_NODE_LATENCY_S = 2e-6
INTER_NODE_LATENCY_S = 5e-6
# Fraction of the datasheet link bandwidth that collectives reach. Assumed: nccl-tests bus
# bandwidths on NVLink and InfiniBand systems stay below the link peak (protocol overhead,
# chunking); to be replaced by a measured value once multi-GPU runs are in the database.
LINK_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Link:
    """What one GPU of a ring can send: ``bytes_per_s`` (one direction, achievable) after a
    ``latency_s`` per message."""

    bytes_per_s: float
    latency_s: float


def group_link(gpu: GpuSpec, size: int, stride: int, gpus_per_node: int) -> Link:
    """The link a ring of ``size`` GPUs, ``stride`` apart in device order, runs over."""
    if size * stride <= gpus_per_node:
        bandwidth = gpu.scale_up_bytes_per_s
        if gpu.scale_up_peer_bytes_per_s is not None:
            bandwidth = min(bandwidth, (size - 1) * gpu.scale_up_peer_bytes_per_s)
        return Link(bandwidth * LINK_EFFICIENCY, INTRA_NODE_LATENCY_S)
    return Link(gpu.scale_out_bytes_per_s * LINK_EFFICIENCY, INTER_NODE_LATENCY_S)


def all_reduce_s(nbytes: float, size: int, link: Link) -> float:
    """Seconds to all-reduce a buffer of ``nbytes`` per GPU over ``size`` GPUs (ring)."""
    if size <= 1:
        return 0.0
    return 2 * (size - 1) * link.latency_s + 2 * (size - 1) / size * nbytes / link.bytes_per_s


def all_gather_s(nbytes: float, size: int, link: Link) -> float:
    """Seconds to all-gather into a buffer of ``nbytes`` (the whole result) over ``size`` GPUs.
    Reduce-scatter of an ``nbytes`` input takes the same time (:func:`reduce_scatter_s`)."""
    if size <= 1:
        return 0.0
    return (size - 1) * link.latency_s + (size - 1) / size * nbytes / link.bytes_per_s


reduce_scatter_s = all_gather_s


def p2p_s(nbytes: float, link: Link) -> float:
    """Seconds to send ``nbytes`` to one peer."""
    return link.latency_s + nbytes / link.bytes_per_s
