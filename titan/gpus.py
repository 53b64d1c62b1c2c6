"""Accelerator catalog: peak compute, memory, power and interconnect of each GPU and TPU, with
sources.

Conventions, so that figures from different vendors compare:

- Compute is *dense* peak FLOP/s (a multiply-add counts 2). NVIDIA's headline Tensor Core
  figures for Hopper and Blackwell are for 2:4 structured sparsity (footnoted "with sparsity" in
  the datasheets): the dense figure is half of it. AMD quotes dense figures, with sparse ones
  separately.
- Link bandwidths are bytes/s *per GPU in one direction*. NVIDIA's NVLink figures (600 GB/s
  A100, 900 GB/s H100/H200, 1.8 TB/s B200) count both directions; AMD's Infinity Fabric
  aggregate (896 GB/s MI300X) too, spread over 7 links, one per peer.
- Scale-out bandwidth is the NIC bandwidth per GPU of the vendor's reference 8-GPU server
  (one NIC per GPU), in bytes/s one direction.
- ``hbm_bytes`` is the usable capacity as sold (decimal GB; the TPUs' in GiB, see the TPU rows).
- A TPU's scale-up network is its slice's inter-chip interconnect (ICI), a 2D or 3D torus
  (``torus_dims``); ``scale_up_bytes_per_s`` is then the ICI bandwidth of one chip in one
  direction over all its ports (2 per torus dimension), and the scale-up domain
  (``gpus_per_node``) is the largest slice of one torus.

The CPU entry is measured, not from a datasheet: it describes the 2-core development machines
this project runs its CPU tests on, and is mostly useful to check the model against runs there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from titan.errors import TitanError

GB = 1e9
TB = 1e12
TFLOPS = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model.

    Attributes:
        name: catalog key (lower case).
        label: display name.
        aliases: other accepted names (``--gpu``), lower case.
        bf16_flops: dense BF16 matmul peak, FLOP/s (the compute dtype's peak for the planner;
            for the CPU entry, the measured float32 matmul rate, since Titan computes in
            float32 on CPU).
        fp8_flops: dense FP8 matmul peak, FLOP/s, or None when the chip has no FP8.
        hbm_bytes: device memory, bytes.
        hbm_bytes_per_s: device memory bandwidth, bytes/s.
        tdp_w: board power limit (TDP/TBP), watts, or None where the vendor publishes none
            (TPU v5e, v5p, v6e).
        scale_up_bytes_per_s: GPU-to-GPU bandwidth inside a node, per GPU, one direction.
        scale_up_peer_bytes_per_s: bandwidth to one peer when the node is a point-to-point
            mesh (AMD Infinity Fabric: one link per peer); None behind a switch (NVSwitch:
            any peer gets the full ``scale_up_bytes_per_s``).
        scale_out_bytes_per_s: typical network bandwidth per GPU between nodes, one direction.
        gpus_per_node: devices of one scale-up domain: the GPUs of the reference server, the
            chips of a TPU's largest single slice (one ICI torus).
        chips_per_host: devices one host (one process) drives.
        torus_dims: dimensions of the ICI torus (2 or 3) for a TPU; 0 for a switched or
            point-to-point network.
        compute_dtype: dtype Titan computes in on this device (``--compute-dtype auto``).
        accelerator: the software stack it runs (``cuda``, ``rocm``, ``tpu`` or ``cpu``): what the
            operator registry chooses providers by
            (:func:`titan.ops.providers.platform.accelerator`).
        source: where each figure comes from.
        usable_bytes: device memory a run may use, bytes: the allocator pool JAX gives XLA
            (``bytes_limit`` of ``jax.Device.memory_stats()``) where measured
            (:data:`MEASURED_POOL_BYTES`), else :data:`USABLE_MEMORY_FRACTION` of
            ``hbm_bytes``. The planner, the trainer's memory check and ``run_start`` agree on
            it where the run reports no pool of its own.
        usable_source: where ``usable_bytes`` comes from.
    """

    name: str
    label: str
    aliases: tuple[str, ...]
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes: float
    hbm_bytes_per_s: float
    tdp_w: float | None
    scale_up_bytes_per_s: float
    scale_up_peer_bytes_per_s: float | None
    scale_out_bytes_per_s: float
    gpus_per_node: int
    chips_per_host: int
    torus_dims: int
    compute_dtype: str
    accelerator: str
    source: str
    usable_bytes: float
    usable_source: str

    @property
    def unit(self) -> str:
        """What one of them is called in a plan's words: ``chip`` for a TPU (Cloud TPU's
        "chip-hours"), else ``GPU``."""
        return "chip" if self.accelerator == "tpu" else "GPU"

    @property
    def count_flag(self) -> str:
        """The spelling of ``titan plan``'s count option its messages use: ``--accelerators``
        for a TPU, ``--gpus`` (its alias) for a GPU."""
        return "--accelerators" if self.accelerator == "tpu" else "--gpus"


# One NIC per GPU in the vendors' reference servers: 400 Gb/s (ConnectX-7 NDR InfiniBand or 400G
# Ethernet) = 50 GB/s one direction; 200 Gb/s (ConnectX-6 HDR, Slingshot-11) = 25 GB/s.
#
# Columns: name, label, dense BF16 TFLOP/s, dense FP8 TFLOP/s (None: no FP8), memory GB, memory
# TB/s, TDP W, scale-up GB/s per GPU one direction, per-peer GB/s on a mesh (None: switched),
# scale-out GB/s per GPU, GPUs per node. Sources, row by row:
# - a100: NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM": BF16 312 TFLOPS (624 with
#   sparsity), no FP8, 80 GB HBM2e at 2,039 GB/s, 400 W, NVLink 600 GB/s (both directions);
#   DGX A100 datasheet: 8x ConnectX-6 200 Gb/s.
# - h100: NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM": BF16 1,979 and FP8 3,958 TFLOPS
#   with sparsity (dense 989.5 and 1,979), 80 GB HBM3 at 3.35 TB/s, up to 700 W, NVLink
#   900 GB/s (both directions); DGX H100 datasheet: 8x ConnectX-7 400 Gb/s.
# - h200: NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM": the H100 SXM Tensor Core figures,
#   141 GB HBM3e at 4.8 TB/s, up to 700 W, NVLink 900 GB/s; DGX H200 datasheet: 8x ConnectX-7.
# - b200: NVIDIA Blackwell datasheet, HGX B200 (1,000 W): per GPU FP8 9 and BF16 4.5 PFLOPS with
#   sparsity (dense 4.5 and 2.25), 180 GB HBM3e at 8 TB/s, NVLink 5 1.8 TB/s (both directions);
#   DGX B200 datasheet: 8x ConnectX-7 400 Gb/s.
# - mi250x: AMD Instinct MI250X datasheet (OAM): BF16 383 TFLOPS dense, no FP8, 128 GB HBM2e at
#   3.2 TB/s, 560 W peak, 8 Infinity Fabric links of 100 GB/s (50 one direction). One package
#   is two GCDs, which JAX (ROCm) shows as two devices: the row is per GCD, the package's
#   figures halved (191.5 TFLOPS, 64 GB at 1.6 TB/s, 280 W, 4 links), so that a device's peak
#   and memory are what one JAX device has. HPE Cray EX235a (Frontier) node: 4 MI250X (8 GCDs),
#   4x Slingshot 200 Gb/s (12.5 GB/s per GCD one direction).
# - mi300x: AMD Instinct MI300X datasheet (OAM): BF16 1,307.4 and FP8 2,614.9 TFLOPS dense,
#   192 GB HBM3 at 5.3 TB/s, 750 W, 7 Infinity Fabric links of 128 GB/s (both directions) =
#   896 GB/s, one per peer in the 8-GPU platform; platform brief: a 400 Gb/s NIC per GPU.
# - mi325x: AMD Instinct MI325X datasheet (OAM): MI300X compute, 256 GB HBM3E at 6 TB/s,
#   1,000 W, MI300X Infinity Fabric.
# - mi355x: AMD Instinct MI355X datasheet (OAM): BF16 2,516.6 and FP8 5,033.2 TFLOPS dense,
#   288 GB HBM3E at 8 TB/s, 1,400 W, 7 Infinity Fabric links of 153.6 GB/s (both directions) =
#   1,075 GB/s; a 400 Gb/s NIC (AMD Pensando Pollara 400) per GPU.
# - cpu: measured on this project's development VM (2 AMD EPYC cores, 23 GB), 2026-11-29, jax
#   0.10.2: jax.jit float32 matmul 2048^3 at 42 to 54 GFLOP/s (43 taken), a jitted reduction
#   over 256 MB at 12 GB/s; "links" between XLA's forced host devices are memory copies at that
#   rate. Power: AMD EPYC 7763 datasheet, 280 W over 64 cores, for 2 cores (8.75 W).
_TABLE = (
    ("a100", "A100 80GB SXM", 312, None, 80, 2.039, 400, 300, None, 25, 8),
    ("h100", "H100 SXM", 989.5, 1979, 80, 3.35, 700, 450, None, 50, 8),
    ("h200", "H200 SXM", 989.5, 1979, 141, 4.8, 700, 450, None, 50, 8),
    ("b200", "B200 (HGX)", 2250, 4500, 180, 8.0, 1000, 900, None, 50, 8),
    ("mi250x", "MI250X (OAM), one GCD", 191.5, None, 64, 1.6, 280, 200, 50, 12.5, 8),
    ("mi300x", "MI300X (OAM)", 1307.4, 2614.9, 192, 5.3, 750, 448, 64, 50, 8),
    ("mi325x", "MI325X (OAM)", 1307.4, 2614.9, 256, 6.0, 1000, 448, 64, 50, 8),
    ("mi355x", "MI355X (OAM)", 2516.6, 5033.2, 288, 8.0, 1400, 537.6, 76.8, 50, 8),
    ("cpu", "CPU (2-core dev VM, measured)", 0.043, None, 23, 0.012, 8.75, 12, None, 12, 8),
)
_ALIASES = {
    "a100": ("a100-80gb", "a100-sxm", "nvidia a100"),
    "h100": ("h100-sxm", "h100-80gb", "nvidia h100"),
    "h200": ("h200-sxm", "h200-141gb", "nvidia h200"),
    "b200": ("hgx-b200", "nvidia b200"),
    "mi250x": ("mi250", "amd instinct mi250x"),
    "mi300x": ("mi300", "amd instinct mi300x"),
    "mi325x": ("mi325", "amd instinct mi325x"),
    "mi355x": ("mi355", "amd instinct mi355x"),
    "cpu": ("host",),
}
_SOURCES = {
    "a100": "NVIDIA A100 datasheet (A100 80GB SXM); DGX A100 datasheet",
    "h100": "NVIDIA H100 datasheet (H100 SXM, sparse figures halved); DGX H100 datasheet",
    "h200": "NVIDIA H200 datasheet (H200 SXM, sparse figures halved); DGX H200 datasheet",
    "b200": "NVIDIA Blackwell datasheet (HGX B200, sparse figures halved); DGX B200 datasheet",
    "mi250x": "AMD Instinct MI250X datasheet; HPE Cray EX235a (Frontier) node",
    "mi300x": "AMD Instinct MI300X datasheet and platform brief",
    "mi325x": "AMD Instinct MI325X datasheet and platform brief",
    "mi355x": "AMD Instinct MI355X datasheet; AMD Instinct MI350 series platform brief",
    "cpu": "measured on the development VM (titan/gpus.py)",
}


# TPUs. Columns: name, label, dense BF16 TFLOP/s, HBM GiB, HBM GB/s, ICI Gb/s per chip one
# direction (all ports), torus dimensions, chips of the largest single slice, chips per host,
# data-center network (DCN) Gb/s per chip, power W (None: not published). Google's pages give
# capacities now in GB, now in GiB; the v5e's measured pool (16.91e9 bytes, above 16e9) shows
# they are GiB. ICI figures are per chip and one direction: v5e's page gives 1,600 Gbps
# ("Interchip Interconnect BW") and, in its newer table, 400 GBps bidirectional, the same
# figure; per port, that is the total over 2 x torus_dims ports. Sources, row by row:
# - v4: cloud.google.com/tpu/docs/v4: 275 TFLOPs (bf16), HBM2 32 GiB at 1,200 GBps, measured
#   max power 192 W, 4,096-chip pod as a 3D torus (AxBxC slices), 4 chips per host (v4-8);
#   ICI 2,400 Gbps per chip: 6 links of 400 Gb/s each way (Jouppi et al. 2023, "TPU v4: An
#   Optically Reconfigurable Supercomputer", ISCA). DCN per chip not published: v5p's taken.
# - v5e: cloud.google.com/tpu/docs/v5e: 197 TFLOPs (bf16), HBM2 16 GB at 819 GBps, ICI
#   1,600 Gbps, 4 ICI ports, 2D torus, 256-chip pod, 8 chips per host, 2 x 100 Gbps NICs per
#   host (25 Gb/s per chip).
# - v5p: cloud.google.com/tpu/docs/v5p: 459 TFLOPs (bf16), HBM2e 95 GB at 2,765 GBps, ICI
#   4,800 Gbps (1,200 GBps bidirectional), 3D torus, largest single slice 6,144 chips
#   (16x16x24), 4 chips per host (2x2x1), DCN 50 Gbps per chip.
# - v6e: cloud.google.com/tpu/docs/v6e: 918 TFLOPs (bf16), 32 GB at 1,638 GBps, ICI 800 GBps
#   bidirectional (3,200 Gbps one way), 4 ports, 2D torus, 256-chip pod, 8 chips per host.
#   DCN per chip not published: v5e's taken.
_TPU_TABLE = (
    ("v4", "TPU v4", 275, 32, 1200, 2400, 3, 4096, 4, 50, 192),
    ("v5e", "TPU v5e", 197, 16, 819, 1600, 2, 256, 8, 25, None),
    ("v5p", "TPU v5p", 459, 95, 2765, 4800, 3, 6144, 4, 50, None),
    ("v6e", "TPU v6e (Trillium)", 918, 32, 1638, 3200, 2, 256, 8, 25, None),
)
_TPU_ALIASES = {
    "v4": ("tpu-v4", "tpu v4"),
    "v5e": ("tpu-v5e", "v5litepod", "tpu v5 lite", "tpu v5e"),
    "v5p": ("tpu-v5p", "tpu v5p", "tpu v5"),
    "v6e": ("tpu-v6e", "trillium", "tpu v6 lite", "tpu v6e"),
}
_TPU_SOURCE = "Google Cloud TPU documentation, cloud.google.com/tpu/docs/{}"
GIB = 2**30


# Share of device memory a run may use where no pool was measured: JAX's GPU allocator
# preallocates 75% of device memory and XLA's buffers live in that pool (JAX documentation, "GPU
# memory allocation", XLA_PYTHON_CLIENT_MEM_FRACTION, default .75).
USABLE_MEMORY_FRACTION = 0.75
# The pool measured on the device: the bytes_limit every H200 of bench/results/planner_draws.json
# reported (75% of the 150.76e9 bytes the driver reports, less 0.5 GB), above 75% of the
# datasheet's 141 GB. The compiled programs' peak (XLA's buffer assignment) matched the
# runtime's peak_bytes_in_use within 0.01% there: no workspace outside it.
# The v5e's: bytes_limit of the one chip of a v5e VM (jax 0.10.2), 16.91e9 bytes of its 16 GiB.
MEASURED_POOL_BYTES = {"h200": 112_583_507_968, "v5e": 16_910_000_000}
# A TPU's runtime hands XLA nearly all of HBM (no preallocated share, unlike JAX's GPU pool): the
# share the v5e's measured pool holds of its HBM, taken for the TPUs not measured.
TPU_USABLE_FRACTION = MEASURED_POOL_BYTES["v5e"] / (16 * GIB)


def _usable(name: str, hbm_bytes: float, tpu: bool = False) -> tuple[float, str]:
    """The usable memory of a catalog entry, bytes, and its source."""
    if name in MEASURED_POOL_BYTES:
        return float(MEASURED_POOL_BYTES[name]), f"measured pool (bytes_limit of one {name})"
    if tpu:
        share = f"{TPU_USABLE_FRACTION:.1%}"
        return hbm_bytes * TPU_USABLE_FRACTION, f"{share} of HBM (the v5e's measured pool share)"
    share = f"{USABLE_MEMORY_FRACTION:.0%}"
    return hbm_bytes * USABLE_MEMORY_FRACTION, f"{share} of the datasheet's memory (JAX's pool)"


# The AMD Instinct rows, which run ROCm; the other GPUs run CUDA.
_ROCM = frozenset({"mi250x", "mi300x", "mi325x", "mi355x"})


def _spec(row: tuple) -> GpuSpec:
    name, label, bf16, fp8, memory, bandwidth, tdp, up, peer, out, per_node = row
    usable_bytes, usable_source = _usable(name, memory * GB)
    return GpuSpec(
        name=name,
        label=label,
        aliases=_ALIASES[name],
        bf16_flops=bf16 * TFLOPS,
        fp8_flops=None if fp8 is None else fp8 * TFLOPS,
        hbm_bytes=memory * GB,
        hbm_bytes_per_s=bandwidth * TB,
        tdp_w=tdp,
        scale_up_bytes_per_s=up * GB,
        scale_up_peer_bytes_per_s=None if peer is None else peer * GB,
        scale_out_bytes_per_s=out * GB,
        gpus_per_node=per_node,
        chips_per_host=per_node,
        torus_dims=0,
        compute_dtype="float32" if name == "cpu" else "bfloat16",
        accelerator="cpu" if name == "cpu" else "rocm" if name in _ROCM else "cuda",
        source=_SOURCES[name],
        usable_bytes=usable_bytes,
        usable_source=usable_source,
    )


def _tpu_spec(row: tuple) -> GpuSpec:
    name, label, bf16, hbm_gib, hbm_gbps, ici_gbit, dims, slice_chips, per_host, dcn_gbit, w = row
    usable_bytes, usable_source = _usable(name, hbm_gib * GIB, tpu=True)
    return GpuSpec(
        name=name,
        label=label,
        aliases=_TPU_ALIASES[name],
        bf16_flops=bf16 * TFLOPS,
        fp8_flops=None,
        hbm_bytes=hbm_gib * GIB,
        hbm_bytes_per_s=hbm_gbps * GB,
        tdp_w=w,
        scale_up_bytes_per_s=ici_gbit * GB / 8,
        scale_up_peer_bytes_per_s=None,
        scale_out_bytes_per_s=dcn_gbit * GB / 8,
        gpus_per_node=slice_chips,
        chips_per_host=per_host,
        torus_dims=dims,
        compute_dtype="bfloat16",
        accelerator="tpu",
        source=_TPU_SOURCE.format(name),
        usable_bytes=usable_bytes,
        usable_source=usable_source,
    )


CATALOG: dict[str, GpuSpec] = {row[0]: _spec(row) for row in _TABLE} | {
    row[0]: _tpu_spec(row) for row in _TPU_TABLE
}


def _index() -> dict[str, GpuSpec]:
    names = {}
    for spec in CATALOG.values():
        for key in (spec.name, *spec.aliases):
            names[key] = spec
    return names


_BY_NAME = _index()


def on_one_host(spec: GpuSpec, devices: int) -> GpuSpec:
    """``spec`` as one of ``devices`` devices of one host: the CPU entry's forced host devices
    (``--xla_force_host_platform_device_count``) share the one host's compute, memory, memory
    bandwidth and power, each getting 1/``devices`` of them; an accelerator is its own device
    and is returned unchanged."""
    if spec.name != "cpu" or devices <= 1:
        return spec
    return replace(
        spec,
        label=f"{spec.label}, 1/{devices} each",
        bf16_flops=spec.bf16_flops / devices,
        hbm_bytes=spec.hbm_bytes / devices,
        hbm_bytes_per_s=spec.hbm_bytes_per_s / devices,
        usable_bytes=spec.usable_bytes / devices,
        tdp_w=None if spec.tdp_w is None else spec.tdp_w / devices,
    )


def gpu_named(name: str) -> GpuSpec | None:
    """The catalog entry for ``name`` (case-insensitive; aliases such as ``h100-sxm``), or
    None."""
    return _BY_NAME.get(name.strip().lower())


def find_gpu(name: str) -> GpuSpec:
    """The catalog entry for ``name`` (:func:`gpu_named`) given as ``--accelerator`` (or its
    alias ``--gpu``).

    Raises:
        TitanError: unknown name; the message lists the catalog.
    """
    spec = gpu_named(name)
    if spec is None:
        known = ", ".join(CATALOG)
        raise TitanError(f"--accelerator {name!r} is not in the catalog; known: {known}")
    return spec


# What may follow the model's word in a ``device_kind`` of that very product (CUDA's device name,
# ROCm's marketing name): "NVIDIA H100 80GB HBM3" is an H100 SXM, while "NVIDIA H100 PCIe",
# "NVIDIA H100 NVL", "NVIDIA A100-SXM4-40GB" and "NVIDIA H200 NVL" are other products, with
# other peaks or memory, that the catalog does not list. Words are split at spaces, '-' and '/'.
_KIND_QUALIFIERS: dict[str, frozenset[str]] = {
    "a100": frozenset({"sxm", "sxm4", "80gb"}),
    "h100": frozenset({"sxm", "sxm5", "80gb", "hbm3"}),
    "h200": frozenset({"sxm", "141gb"}),
    "b200": frozenset({"sxm", "180gb"}),
    "mi250x": frozenset({"mi250", "oam"}),
    "mi300x": frozenset({"oam"}),
    "mi325x": frozenset({"oam"}),
    "mi355x": frozenset({"oam"}),
    "cpu": frozenset(),
    **{row[0]: frozenset() for row in _TPU_TABLE},
}
# The ``device_kind`` of each TPU, as JAX reports it (the TPU runtime's names), matched whole:
# "TPU v5 lite" is a v5e, "TPU v5" a v5p, "TPU v6 lite" a v6e; "TPU v4 lite" (v4i, an
# inference part) and "TPU v5p" spelt otherwise are other products the catalog does not list.
TPU_DEVICE_KINDS = {
    "tpu v4": "v4",
    "tpu v5 lite": "v5e",
    "tpu v5e": "v5e",
    "tpu v5": "v5p",
    "tpu v5p": "v5p",
    "tpu v6 lite": "v6e",
    "tpu v6e": "v6e",
}
_VENDOR_WORDS = frozenset({"nvidia", "amd", "instinct", "tesla"})


def gpu_for_device_kind(device_kind: str) -> GpuSpec | None:
    """The catalog entry of a JAX ``device_kind`` string (``NVIDIA H200``, ``NVIDIA H100 80GB
    HBM3``, ``TPU v5 lite``, ``cpu``), or None for a device the catalog does not list: a TPU by
    its whole name (:data:`TPU_DEVICE_KINDS`); a GPU by its model's word first (vendor words left
    out), then only words that name that same product (:data:`_KIND_QUALIFIERS`), so that an
    H100 PCIe or an A100 40GB is not taken for the SXM part the catalog lists."""
    words = device_kind.lower().replace("-", " ").replace("/", " ").split()
    if " ".join(words) in TPU_DEVICE_KINDS:
        return CATALOG[TPU_DEVICE_KINDS[" ".join(words)]]
    words = [w for w in words if w not in _VENDOR_WORDS]
    spec = CATALOG.get(words[0]) if words else None
    if spec is None or not set(words[1:]) <= _KIND_QUALIFIERS[spec.name]:
        return None
    return spec
