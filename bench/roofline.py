"""Roofline of one profiled train step: each kernel's time against its floor.

Reads a ``--profile-steps`` trace (``<host>.trace.json.gz``, :mod:`titan.telemetry.
profile`) and the optimized HLO text of the step (``XLA_FLAGS=--xla_dump_to=DIR
--xla_dump_hlo_as_text``: ``*jit__step*after_optimizations.txt``) of the same run, and groups the
GPU kernels of the traced steps into rows:

- each XLA fusion (a kernel named after its HLO instruction; XLA compiles identical fusions to
  one kernel, so a row counts that fusion's work once per call): bytes = its operands and
  results (each read or written once, the lower bound), FLOPs = 2 x output x contracted size of
  each ``dot`` inside it;
- ``cuBLAS matmuls`` (every ``__cublas$gemm``/``__cublas$lt$matmul`` custom call; kernels
  ``nvjet``, ``cutlass``, ``gemm``, ``xmma``): FLOPs the same formula over the custom calls,
  each counted as often as it runs (the product of the trip counts of the ``while`` loops around
  it: a rolled layer loop's body runs once per layer);
- ``cuDNN attention`` (``sdpa``/``fmha`` and ``cudnn::fusion`` kernels): FLOPs 4 B S^2 H hd per
  forward call, halved for the causal mask, and 2.5 times that per backward call (flash
  attention's backward does five matrix products to the forward's two; Dao 2023), over the
  ``__cudnn$fmha*`` custom calls' shapes, each counted as often as it runs;
- ``Pallas kernels`` (``pallas_call`` custom calls, kernels named by Titan's providers): bytes of
  their operands and results.

Floor = max(FLOPs / matmul peak, bytes / HBM bandwidth), with the peak and bandwidth given
(default: the H200's datasheet figures, 989.5e12 FLOP/s dense bf16 and 4.8e12 B/s); gap = time -
floor. Times are per step (the trace's sum over ``--steps`` traced steps, divided). Prints a
Markdown table of the ``--rows`` largest gaps and writes the whole to ``--out`` (JSON).

    python bench/roofline.py --trace trace.json.gz --hlo step_hlo.txt.gz --steps 2 --out r.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}
DTYPE_BYTES |= {"f64": 8, "s64": 8, "u64": 8, "s16": 2, "u16": 2, "f8e4m3fn": 1, "f8e5m2": 1}
SHAPE = re.compile(
    r"\b(bf16|f16|f32|f64|s8|u8|s16|u16|s32|u32|s64|u64|pred|f8e4m3fn|f8e5m2)\[([\d,]*)\]"
)
LINE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*?)\)(.*)$")
COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
MATMUL_KERNEL = re.compile(r"nvjet|cutlass|gemm|xmma|cublas")
ATTENTION_KERNEL = re.compile(r"sdpa|fmha|cudnn")
CALLED_GROUPS = re.compile(r"(?:branch_computations|called_computations)=\{([^}]*)\}")


def _shapes(text: str) -> list[tuple[str, list[int]]]:
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in SHAPE.findall(text)]


def _bytes(shapes: list[tuple[str, list[int]]]) -> int:
    return sum(DTYPE_BYTES[t] * math.prod(dims) for t, dims in shapes)


class Hlo:
    """The instructions of an HLO module's text: name -> (result shapes, op, operand names,
    attributes, computation)."""

    def __init__(self, text: str) -> None:
        self.ops: dict[str, tuple[list, str, list[str], str, str]] = {}
        self.computations: dict[str, list[str]] = defaultdict(list)
        computation = ""
        for line in text.splitlines():
            if (header := COMPUTATION.match(line)) and "{" in line and " = " not in line:
                computation = header.group(1)
                continue
            if not (m := LINE.match(line)):
                continue
            name, result, op, operands, rest = m.groups()
            names = re.findall(r"%([\w.\-]+)", operands)
            self.ops[name] = (_shapes(result), op, names, rest, computation)
            self.computations[computation].append(name)
        self._callers = self._called_computations()

    def _called_computations(self) -> dict[str, tuple[str, int]]:
        """computation -> (the instruction that calls it, runs per call of that instruction): a
        ``while`` body runs its ``known_trip_count`` times, every other called computation
        (fusions, ``cond`` branches, reducers) once."""
        callers: dict[str, tuple[str, int]] = {}
        for name, (_, op, _, rest, _) in self.ops.items():
            trips = re.search(r'known_trip_count"?:\{"n":"(\d+)"', rest)
            for key, called in re.findall(r"(\w+)=%([\w.\-]+)", rest):
                runs = int(trips.group(1)) if op == "while" and key == "body" and trips else 1
                callers.setdefault(called, (name, runs))
            for group in CALLED_GROUPS.findall(rest):
                for called in re.findall(r"%([\w.\-]+)", group):
                    callers.setdefault(called, (name, 1))
        return callers

    def executions(self, name: str) -> int:
        """How many times instruction ``name`` runs per execution of the module: the product of
        the trip counts of the ``while`` loops around it (a rolled layer loop runs its body once
        per layer)."""
        runs, computation, seen = 1, self.ops[name][4], set()
        while computation in self._callers and computation not in seen:
            seen.add(computation)
            caller, times = self._callers[computation]
            runs *= times
            computation = self.ops[caller][4]
        return runs

    def io_bytes(self, name: str) -> int:
        """Bytes of ``name``'s results and operands (an operand's first result for a tuple)."""
        shapes, _, operands, _, _ = self.ops[name]
        total = _bytes(shapes)
        for operand in operands:
            operand_name = operand.split("#")[0]
            if operand_name in self.ops:
                total += _bytes(self.ops[operand_name][0][:1])
        return total

    def dot_flops(self, name: str) -> float:
        """2 x output x contracted size of a ``dot`` or a cuBLAS custom call ``name``."""
        shapes, op, operands, rest, _ = self.ops[name]
        if not operands or operands[0] not in self.ops:
            return 0.0
        lhs = self.ops[operands[0]][0][0][1]
        found = re.search(r"lhs_contracting_dim(?:ension)?s\"?[=:]\s*[\[{]([^\]}]*)", rest)
        if not found:
            return 0.0
        contracted = [int(d.strip().strip('"')) for d in found.group(1).split(",") if d.strip()]
        return 2.0 * math.prod(shapes[0][1]) * math.prod(lhs[d] for d in contracted)

    def fusion_flops(self, name: str) -> float:
        """FLOPs of the dots inside fusion ``name``'s computation."""
        found = re.search(r"calls=%([\w.\-]+)", self.ops[name][3])
        inner = self.computations.get(found.group(1), []) if found else []
        return sum(self.dot_flops(i) for i in inner if self.ops[i][1] == "dot")

    def custom_calls(self, target: re.Pattern[str]) -> list[str]:
        return [n for n, v in self.ops.items() if v[1] == "custom-call" and target.search(v[3])]


def _attention_flops(hlo: Hlo, causal: bool) -> float:
    """FLOPs of the cuDNN attention calls (module docstring), from q (B, S, H, hd) of each call
    (:func:`_query_shape`). The branches of a ``cond`` are alternatives (the packed and the dense
    document mask): the largest branch counts, once."""
    outside = 0.0
    branches: dict[str, float] = defaultdict(float)
    for name in hlo.custom_calls(re.compile(r"__cudnn\$fmha")):
        _, _, operands, rest, _ = hlo.ops[name]
        q = _query_shape(hlo, operands, rest)
        b, s, h, hd = q if q[1] >= q[2] else (q[0], q[2], q[1], q[3])
        forward = 4.0 * b * s * s * h * hd * (0.5 if causal else 1.0)
        flops = forward * (2.5 if "Backward" in rest else 1.0) * hlo.executions(name)
        branch = re.search(r"cond/branch_(\d+)_fun", rest)
        if branch:
            branches[branch.group(1)] += flops
        else:
            outside += flops
    return outside + max(branches.values(), default=0.0)


def _query_shape(hlo: Hlo, operands: list[str], rest: str) -> list[int]:
    """The shape of an attention call's query: its first layout constraint's, else its first
    operand's (an operand may be a tuple: a cond branch's parameter)."""
    found = re.search(r"operand_layout_constraints=\{\w+\[([\d,]+)\]", rest)
    if found:
        return [int(d) for d in found.group(1).split(",")]
    return hlo.ops[operands[0]][0][0][1]


def rows(trace: dict, hlo: Hlo, steps: int, causal: bool) -> list[dict[str, Any]]:
    """Per-step time, FLOPs and bytes of each row (module docstring)."""
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    device_pids = {
        e["pid"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and "/device:GPU" in str(e.get("args", {}).get("name", ""))
    }
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e["pid"] not in device_pids or e["name"].startswith("Memcpy"):
            continue
        name = e["name"]
        hlo_name = next((n for n in (name, name.replace("_", ".")) if n in hlo.ops), None)
        if hlo_name is None:  # XLA names kernel <fusion>_<n> for instruction <fusion>.<n>
            cut = name.rsplit("_", 1)
            hlo_name = (
                f"{cut[0]}.{cut[1]}" if len(cut) == 2 and f"{cut[0]}.{cut[1]}" in hlo.ops else None
            )
        if hlo_name is not None:
            key = hlo_name
        elif ATTENTION_KERNEL.search(name):
            key = "cuDNN attention"
        elif MATMUL_KERNEL.search(name):
            key = "cuBLAS matmuls"
        elif name.startswith(("Memset", "memcpy")):
            key = "memsets and copies"
        else:
            key = "Pallas kernels" if name.startswith("titan_") else f"other: {name[:40]}"
        times[key] += e["dur"] * 1e-6 / steps
        calls[key] += 1
    cublas = hlo.custom_calls(re.compile(r"__cublas\$"))
    pallas = hlo.custom_calls(re.compile(r"xla\.gpu\.triton"))
    out = []
    for key, seconds in times.items():
        if key == "cuBLAS matmuls":
            flops = sum(hlo.executions(n) * hlo.dot_flops(n) for n in cublas)
            nbytes = sum(hlo.executions(n) * hlo.io_bytes(n) for n in cublas)
        elif key == "cuDNN attention":
            flops, nbytes = _attention_flops(hlo, causal), 0
        elif key == "Pallas kernels":
            flops, nbytes = 0.0, sum(hlo.executions(n) * hlo.io_bytes(n) for n in pallas)
        elif key in hlo.ops:  # identical fusions share one kernel: calls x one fusion's work
            per_step = calls[key] / steps
            flops, nbytes = per_step * hlo.fusion_flops(key), per_step * hlo.io_bytes(key)
        else:
            flops, nbytes = 0.0, 0
        row = {"row": key, "seconds": seconds, "calls_per_step": calls[key] / steps}
        out.append({**row, "flops": flops, "bytes": nbytes})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--hlo", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True, help="steps in the trace")
    parser.add_argument("--peak-flops", type=float, default=989.5e12)
    parser.add_argument("--hbm-bytes-per-s", type=float, default=4.8e12)
    parser.add_argument("--causal", action="store_true", help="attention under a causal mask")
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    trace = json.loads(gzip.decompress(args.trace.read_bytes()))
    raw = args.hlo.read_bytes()
    hlo = Hlo((gzip.decompress(raw) if args.hlo.suffix == ".gz" else raw).decode())
    table = rows(trace, hlo, args.steps, args.causal)
    for r in table:
        r["floor_s"] = max(r["flops"] / args.peak_flops, r["bytes"] / args.hbm_bytes_per_s)
        r["gap_s"] = r["seconds"] - r["floor_s"]
    table.sort(key=lambda r: -r["gap_s"])
    total = sum(r["seconds"] for r in table)
    floor = sum(r["floor_s"] for r in table)
    record = {
        "command": shlex.join(["python", "bench/roofline.py", *sys.argv[1:]]),
        "trace": args.trace.as_posix(),
        "hlo": args.hlo.as_posix(),
        "peak_flops": args.peak_flops,
        "hbm_bytes_per_s": args.hbm_bytes_per_s,
        "kernel_time_s": total,
        "floor_s": floor,
        "rows": table,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"kernel time per step {total * 1e3:.1f} ms, floor {floor * 1e3:.1f} ms")
    print("| row | time ms | TFLOP | GB | floor ms | gap ms | bound |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in table[: args.rows]:
        bound = (
            "compute"
            if r["flops"] / args.peak_flops >= r["bytes"] / args.hbm_bytes_per_s
            else "memory"
        )
        ms = (r["seconds"], r["floor_s"], r["gap_s"])
        print(
            f"| {r['row']} | {ms[0] * 1e3:.2f} | {r['flops'] / 1e12:.2f} | "
            f"{r['bytes'] / 1e9:.2f} | {ms[1] * 1e3:.2f} | {ms[2] * 1e3:.2f} | {bound} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
