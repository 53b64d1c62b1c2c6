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

A TPU slice is a k-dimensional torus of chips (:func:`torus_shape`), its inter-chip
interconnect (ICI) 2 links per chip and dimension, one each way round. A group's collectives
(:func:`torus_link`) follow the scaling book ("How to Scale Your Model", Austin et al. 2025,
https://jax-ml.github.io/scaling-book/, part 3 "Sharded Matrices", the cost of AllGather,
ReduceScatter and AllReduce on a TPU torus): along one torus axis, a bidirectional ring
all-gathers V bytes in V / W_ici seconds, W_ici the two links' bandwidth, whatever the number of
chips; over several axes the axes' links work at once, so that the time falls with the number
of axes (V / (n_axes W_ici) for axes alike). Here that is the data split in as many parts as
axes, each gathered axis by axis in its own rotation of the axes' order, the time that of the
busiest axis. A reduce-scatter is the mirror image and an all-reduce is both. A group's chips
that cover only part of an axis form a line, not a ring: an all-gather over e chips moves
(e - 1) / 2e of V each way over every link of a ring, but floor(e / 2) / e of V over the middle
link of a line, e / (e - 1) times as long for even e (twice for 2 chips, about the same for
many), in twice the hops; chips of the group ``g`` apart along an axis share its links with
``g - 1`` other groups.
"""

from __future__ import annotations

import math
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
    ``latency_s`` per message; ``hops``: the messages of one pass of the collective (None: the
    ring's ``size - 1``); ``torus``: the ICI torus the group's collectives use (its sides), or
    None off a torus."""

    bytes_per_s: float
    latency_s: float
    hops: int | None = None
    torus: tuple[int, ...] | None = None


def group_link(gpu: GpuSpec, size: int, stride: int, gpus_per_node: int, devices: int = 0) -> Link:
    """The link a ring of ``size`` GPUs, ``stride`` apart in device order, runs over; for a TPU
    (``gpu.torus_dims``), the ICI torus of a slice of ``devices`` chips (:func:`torus_link`)
    while the group stays within one slice (``gpus_per_node`` chips at most)."""
    if gpu.torus_dims and size * stride <= gpus_per_node:
        return torus_link(gpu, size, stride, max(devices, size * stride))
    if size * stride <= gpus_per_node:
        bandwidth = gpu.scale_up_bytes_per_s
        if gpu.scale_up_peer_bytes_per_s is not None:
            bandwidth = min(bandwidth, (size - 1) * gpu.scale_up_peer_bytes_per_s)
        return Link(bandwidth * LINK_EFFICIENCY, INTRA_NODE_LATENCY_S)
    return Link(gpu.scale_out_bytes_per_s * LINK_EFFICIENCY, INTER_NODE_LATENCY_S)


def torus_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The sides of a slice of ``chips`` chips on a ``dims``-D torus, smallest first: the prime
    factors of ``chips``, largest first, each multiplying the smallest side so far, as Cloud
    TPU's slice shapes grow (v5p: 2x2x1, 2x2x2, 2x4x4, 4x4x4, 4x4x8, 4x8x8; v5e: 4x8, 8x16,
    16x16; cloud.google.com/tpu/docs/v5p and /v5e)."""
    factors, rest, p = [], chips, 2
    while rest > 1:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    sides = [1] * dims
    for factor in sorted(factors, reverse=True):
        sides[sides.index(min(sides))] *= factor
    return tuple(sorted(sides))


def slice_error(gpu: GpuSpec, chips: int) -> str | None:
    """Why ``chips`` chips are no slice of ``gpu``'s ICI torus, or None when they are one.

    Cloud TPU's slice sizes: on a 2D torus (v5e, v6e) 1, 4, 8, 16, 32, 64, 128 or 256 chips
    (v5litepod-1 to -256: cloud.google.com/tpu/docs/v5e, /v6e); on a 3D torus (v4, v5p) 4, 8,
    16 or 32 chips (2x2x1 to 2x4x4) or a multiple of 64 (AxBxC, each side a multiple of 4:
    cloud.google.com/tpu/docs/v5p, /v4); at most the catalog's largest slice
    (``gpu.gpus_per_node`` chips).
    """
    pod = gpu.gpus_per_node
    if chips > pod:
        return f"is more chips than the largest {gpu.label} slice ({pod})"
    if gpu.torus_dims == 2:
        if chips == 2 or chips & (chips - 1):
            return f"is no {gpu.label} slice: those have 1, 4, 8, 16, ... {pod} chips"
    elif gpu.torus_dims == 3 and chips not in (4, 8, 16, 32) and chips % 64:
        return f"is no {gpu.label} slice: those have 4, 8, 16, 32 or a multiple of 64 chips"
    return None


def torus_link(gpu: GpuSpec, size: int, stride: int, chips: int) -> Link:
    """The equivalent ring link of a group of ``size`` chips, ``stride`` apart in device order
    (the first torus axis fastest), in a slice of ``chips`` chips on ``gpu``'s ICI torus
    (module docstring: axis by axis, smallest extent first).

    For an all-gather of V bytes over axes of extents e_1..e_k (p = their product) and
    bandwidths B_i (2 links one way, divided among the groups interleaved on the axis): each of
    k parts of V / k bytes is gathered axis by axis in one rotation of the axes' order, an axis
    moving (e_i - 1) / e_i of the part's bytes gathered so far (the part x the extents up to
    and including its own / p; along a line, 2 floor(e_i / 2) / e_i of them, module
    docstring); the time is the busiest axis's load / B_i. The link returned
    has the bandwidth that gives this time in the ring formula ((p - 1) / p x V / bandwidth),
    and the hops of the axes (e - 1 along a line, e // 2 round a whole ring).
    """
    sides = torus_shape(chips, gpu.torus_dims)
    link_bytes_per_s = gpu.scale_up_bytes_per_s / (2 * gpu.torus_dims)  # one port, one way
    members = [i * stride for i in range(size)]
    axes = []  # (extent, interleaved groups, whole ring)
    block = 1
    for side in sides:
        coords = sorted({member // block % side for member in members})
        if len(coords) > 1:
            gap = coords[1] - coords[0]
            axes.append((len(coords), gap, len(coords) * gap == side and side > 2))
        block *= side
    load = [0.0] * len(axes)  # bytes per byte of V each axis carries
    for start in range(len(axes)):
        gathered = 1
        for i in [*range(start, len(axes)), *range(start)]:
            extent, _, ring = axes[i]
            gathered *= extent
            moved = (extent - 1) / extent if ring else 2 * (extent // 2) / extent
            load[i] += moved * gathered / size / len(axes)
    busiest = zip(load, axes, strict=True)
    seconds_per_byte = max(
        (share / (2 * link_bytes_per_s / gap) for share, (_, gap, _) in busiest), default=0.0
    )
    hops = sum((extent // 2 if ring else extent - 1) * gap for extent, gap, ring in axes)
    bandwidth = (size - 1) / size / seconds_per_byte if seconds_per_byte else math.inf
    return Link(bandwidth * LINK_EFFICIENCY, INTRA_NODE_LATENCY_S, hops, sides)


def interconnect(gpu: GpuSpec, devices: int, gpus_per_node: int) -> str | None:
    """The network a TPU plan's collectives run over, in words (None off a torus): the slice's
    ICI torus and its shape, or, beyond one slice, tori of ``gpus_per_node`` chips joined by
    the data-center network."""
    if not gpu.torus_dims:
        return None
    dims = gpu.torus_dims
    if devices <= gpus_per_node:
        sides = "x".join(map(str, torus_shape(devices, dims)))
        return f"collectives over the ICI {dims}D torus {sides}, as rings per torus axis"
    sides = "x".join(map(str, torus_shape(gpus_per_node, dims)))
    return (
        f"collectives over ICI {dims}D tori {sides} within slices of {gpus_per_node} chips, "
        "over the data-center network between them"
    )


def all_reduce_s(nbytes: float, size: int, link: Link) -> float:
    """Seconds to all-reduce a buffer of ``nbytes`` per GPU over ``size`` GPUs (ring)."""
    if size <= 1:
        return 0.0
    hops = size - 1 if link.hops is None else link.hops
    return 2 * hops * link.latency_s + 2 * (size - 1) / size * nbytes / link.bytes_per_s


def all_gather_s(nbytes: float, size: int, link: Link) -> float:
    """Seconds to all-gather into a buffer of ``nbytes`` (the whole result) over ``size`` GPUs.
    Reduce-scatter of an ``nbytes`` input takes the same time (:func:`reduce_scatter_s`)."""
    if size <= 1:
        return 0.0
    hops = size - 1 if link.hops is None else link.hops
    return hops * link.latency_s + (size - 1) / size * nbytes / link.bytes_per_s


reduce_scatter_s = all_gather_s


def p2p_s(nbytes: float, link: Link) -> float:
    """Seconds to send ``nbytes`` to one peer."""
    return link.latency_s + nbytes / link.bytes_per_s
