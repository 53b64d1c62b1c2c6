"""Where the time of profiled steps went: XLA operations of a ``--profile-steps`` trace, by kind.

Reads the Chrome-trace file the JAX profiler writes next to its ``.xplane.pb``
(``<host>.trace.json.gz``: ``traceEvents`` with complete events, ``"ph": "X"``, durations in
microseconds). An XLA operation's execution carries ``args.hlo_op`` (and ``args.hlo_module``):
on GPUs one event per kernel on a ``/device:GPU:N`` process, on the CPU one per operation on the
``/host:CPU`` threads. Only those events are counted: the device processes' when the trace has
any, else the host's (a CPU run). Control-flow operations (``while``, ``conditional``,
``call``) enclose the operations inside them and are left out.

Kinds, from the operation and kernel names (lower case, first match wins): ``attention`` (cuDNN
SDPA/FMHA, flash kernels), ``matmul`` (cuBLAS/cuBLASLt kernels ``gemm``, ``nvjet``, ``xmma``,
``cutlass``; XLA ``dot`` and ``gemm`` operations), ``collective`` (all-reduce, all-gather,
reduce-scatter, all-to-all, collective-permute, send/recv, NCCL/RCCL kernels), ``copy``
(copies, transposes, memcpy/memset) and ``fusion and other`` (XLA's elementwise and reduction
fusions: norms, RoPE, SwiGLU's activation, softmax and loss, the optimizer update).

Times are sums of event durations: kernels that overlap on different streams (or CPU threads)
count twice, so the total can exceed the wall time of the steps.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan.errors import TitanError

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"sdpa|fmha|flash|attention")),
    ("matmul", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|\bdot\b|dot\.|dot_|matmul")),
    (
        "collective",
        re.compile(
            r"all-reduce|all-gather|reduce-scatter|all-to-all|collective|nccl|rccl|send|recv"
        ),
    ),
    ("copy", re.compile(r"copy|transpose|memcpy|memset")),
)
OTHER = "fusion and other"
# Control flow whose events enclose those of the operations inside it (XLA:CPU): not counted.
CONTAINERS = re.compile(r"^(while|conditional|call)\b")
TOP_OPERATIONS = 10


@dataclass
class TraceSummary:
    """Operation time of one trace file.

    Attributes:
        source: ``device`` (GPU kernels) or ``host`` (CPU operations).
        total_us: summed duration of the counted events, microseconds.
        by_kind: kind -> summed duration, microseconds (every kind of :data:`KINDS` and
            :data:`OTHER`, zero when absent).
        top: the :data:`TOP_OPERATIONS` longest operations, (name, kind, microseconds, count):
            the kernel name on a device (XLA's CUDA graphs name the HLO op of every kernel
            they launch ``command_buffer_N``), the HLO op on the host.
    """

    source: str
    total_us: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)
    top: list[tuple[str, str, float, int]] = field(default_factory=list)


def kind_of(hlo_op: str, name: str) -> str:
    """The kind (module docstring) of an operation from its HLO op and kernel names."""
    text = f"{hlo_op} {name}".lower()
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return OTHER


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        with gzip.open(path, "rt") as handle:
            return json.load(handle)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TitanError(f"{path}: not a readable trace ({type(err).__name__})") from None


def summarize_trace(path: Path) -> TraceSummary:
    """Operation time by kind in the trace file ``path`` (``.trace.json.gz``).

    Raises:
        TitanError: the file is not a gzipped Chrome trace.
    """
    events = _events(path)
    names = {
        e.get("pid"): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    devices = {pid for pid, name in names.items() if name.startswith("/device:")}
    counted = devices or set(names)
    summary = TraceSummary("device" if devices else "host")
    summary.by_kind = {kind: 0.0 for kind, _ in KINDS} | {OTHER: 0.0}
    per_op: dict[str, list] = defaultdict(lambda: ["", 0.0, 0])
    for e in events:
        hlo_op = (e.get("args") or {}).get("hlo_op")
        if e.get("ph") != "X" or hlo_op is None or e.get("pid") not in counted:
            continue
        if CONTAINERS.match(hlo_op):
            continue
        duration = float(e.get("dur", 0.0))
        kind = kind_of(hlo_op, str(e.get("name", "")))
        summary.by_kind[kind] += duration
        summary.total_us += duration
        entry = per_op[str(e.get("name", "")) if devices else hlo_op]
        entry[0], entry[1], entry[2] = kind, entry[1] + duration, entry[2] + 1
    ranked = sorted(per_op.items(), key=lambda item: -item[1][1])[:TOP_OPERATIONS]
    summary.top = [(op, kind, us, count) for op, (kind, us, count) in ranked]
    return summary
