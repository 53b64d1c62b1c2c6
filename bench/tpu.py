"""Benchmark: Titan on one TPU chip, in one invocation: the default run, Titan's defaults against
the plain-JAX baseline on two shapes, the memory estimate against the compiled program, and
``titan ops check``.

``python bench/tpu.py`` runs, each in its own process:

(a) ``titan train --steps 30`` with no other option (what a new user types first): whether it
    completes, its wall time, the MFU of its last step and the peak that MFU divides by;
(b) for each shape of :data:`SHAPES` (a 0.32B shape, and the largest Llama-3-style shape of
    :data:`LARGE_CANDIDATES` whose Titan run compiles on the chip with float32 master weights):
    the plain-JAX baseline (``bench/baselines/plain_jax_llama.py``, ``ATTN=xla REMAT=1``: no
    TPU kernel, the baseline's own remat) and ``titan train`` with that shape and batch and
    nothing else (Titan's defaults: ``--remat auto``, ``--attention-mask document``, the
    registry's providers) on the standard-library corpus. Titan's tokens/s is the median of
    its step records after the first :data:`WARMUP_STEPS`; the baseline's is its own timed
    mean. MFU is recomputed for both with the same formula (:func:`titan.flops.
    model_flops_per_token`, causal and full conventions) and the chip's dense bf16 peak from
    the catalog (:func:`titan.gpus.gpu_for_device_kind`);
(c) the memory estimate that ``run_start`` records (``memory_check.estimate_bytes``) against
    the compiled program's bytes (the ``compile`` event's ``memory``: arguments + outputs -
    aliases + temporaries), which on a TPU is what a run is bounded by (docs/planner.md);
(d) ``titan ops check`` and its wall time;
(e) with ``--compare-remat``, the small shape under each other policy of :data:`REMAT_COMPARED`.

Writes ``bench/results/tpu-<device>.json`` (or ``--out``) and prints a Markdown table last.
``--smoke`` runs a tiny version on the CPU so that a test checks the script end to end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from titan.flops import model_flops_per_token
from titan.gpus import gpu_for_device_kind
from titan.shapes import ModelConfig

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
BASELINE = Path(__file__).resolve().parent / "baselines" / "plain_jax_llama.py"
# --remat policies run explicitly on the small shape beside the default's choice.
REMAT_COMPARED = ("none", "dots-attention")
WARMUP_STEPS = 3  # step records left out of the median: the first steps wait on the compile


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Llama-3-style shape and its batch (the baseline's names)."""

    name: str
    layers: int
    d_model: int = 2048
    heads: int = 16
    kv_heads: int = 8
    ffn: int = 5632
    vocab: int = 32_000
    seq: int = 2048
    batch: int = 8

    def model(self) -> ModelConfig:
        return ModelConfig(
            self.name, self.vocab, self.d_model, self.layers, self.heads, self.kv_heads, self.ffn
        )

    def flag(self) -> str:
        """The ``--model`` text of this shape."""
        return (
            f"d_model={self.d_model},n_layers={self.layers},n_heads={self.heads},"
            f"n_kv_heads={self.kv_heads},ffn_dim={self.ffn},vocab_size={self.vocab}"
        )


SMALL = Shape("0.32b", layers=4)
# Tried largest first; the first whose Titan run compiles on the chip is measured. With float32
# master weights and AdamW at 8 x 2048 tokens, XLA refused the 0.69B (12 layers) and the 0.60B
# (10 layers) programs on one v5e under every --remat policy (docs/planner.md).
LARGE_CANDIDATES = (Shape("0.51b", layers=8), Shape("0.41b", layers=6))
SMOKE_SHAPE = Shape("smoke", layers=2, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=512,
                    seq=64, batch=2)  # fmt: skip


def _run(argv: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run ``argv``; its exit code, wall time and the last lines of its output."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": f"timed out after {timeout_s:.0f} s", "stdout": ""}
    tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
    return {
        "rc": done.returncode,
        "wall_s": time.perf_counter() - start,
        "tail": tail,
        "stdout": done.stdout,
    }


def titan(args: list[str], timeout_s: float) -> dict[str, Any]:
    """``titan ARGS`` in a subprocess of this Python."""
    code = "import sys; from titan.cli import main; sys.exit(main())"
    return _run([sys.executable, "-c", code, *args], dict(os.environ), timeout_s)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_record(run_dir: Path) -> dict[str, Any]:
    """What a ``titan train`` run's record says: tokens/s (median after warm-up), its last
    step's MFU, the memory estimate, the compiled program's bytes, the providers, the end."""
    events = _events(run_dir)
    steps = [e for e in events if e.get("type") == "step" and e.get("tokens_per_s")]
    timed = steps[WARMUP_STEPS:] or steps
    start = next((e for e in events if e.get("type") == "run_start"), {})
    compiled = next(
        (e for e in events if e.get("type") == "compile" and e.get("what") == "train_step"), {}
    )
    memory = compiled.get("memory") or {}
    program = None
    if memory:
        program = (
            memory.get("argument_bytes", 0)
            + memory.get("output_bytes", 0)
            - memory.get("alias_bytes", 0)
            + memory.get("temp_bytes", 0)
        )
    end = next((e for e in reversed(events) if e.get("type") == "run_end"), {})
    last = steps[-1] if steps else {}
    return {
        "tok_s": statistics.median(e["tokens_per_s"] for e in timed) if timed else None,
        "steps_timed": len(timed),
        "mfu": last.get("mfu"),
        "mfu_reason": last.get("mfu_reason"),
        "peak_memory_bytes": last.get("peak_memory_bytes"),
        "memory_check": start.get("memory_check"),
        "remat": (start.get("config") or {}).get("remat"),
        "served": start.get("ops") or start.get("served"),
        "compile_s": compiled.get("seconds"),
        "program_bytes": program,
        "status": end.get("status"),
        "error": end.get("error"),
    }


def run_baseline(shape: Shape, timeout_s: float) -> dict[str, Any]:
    """The plain-JAX baseline on ``shape`` (XLA attention, its remat)."""
    env = dict(os.environ, L=str(shape.layers), S=str(shape.seq), B=str(shape.batch))
    env.update(D=str(shape.d_model), H=str(shape.heads), KV=str(shape.kv_heads))
    env.update(F=str(shape.ffn), V=str(shape.vocab), ATTN="xla", REMAT="1")
    done = _run([sys.executable, str(BASELINE)], env, timeout_s)
    records = []
    for line in done.pop("stdout").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    result = next((r for r in reversed(records) if "tok_s" in r), None)
    matmul = next((r["matmul_tflops"] for r in records if "matmul_tflops" in r), None)
    return {**done, "matmul_tflops": matmul, **(result or {})}


def mfu(shape: Shape, tok_s: float | None, peak: float | None) -> dict[str, float | None]:
    """MFU of ``tok_s`` on ``shape`` in both conventions against ``peak`` FLOP/s."""
    if not tok_s or not peak:
        return {"causal": None, "full": None}
    model = shape.model()
    return {
        convention: tok_s * model_flops_per_token(model, shape.seq, convention) / peak
        for convention in ("causal", "full")
    }


def run_shape(
    shape: Shape, runs_root: Path, steps: int, timeout_s: float, remat: str = "auto"
) -> dict[str, Any]:
    """Titan's defaults on ``shape`` through ``titan train`` (with ``--remat`` ``remat``)."""
    run_id = f"bench-{shape.name}-{remat}"
    args = ["train", "--model", shape.flag(), "--batch-size", str(shape.batch), "--remat", remat]
    args += ["--seq-len", str(shape.seq), "--steps", str(steps), "--log-every", "1"]
    args += ["--runs-root", str(runs_root), "--run-id", run_id]
    done = titan(args, timeout_s)
    done.pop("stdout")
    return {**done, "args": shlex.join(args), **train_record(runs_root / run_id)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of each titan train run")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per process")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument(
        "--runs-root", type=Path, help="where the titan train runs go (default: a new temp dir)"
    )
    parser.add_argument(
        "--large",
        default=",".join(shape.name for shape in LARGE_CANDIDATES),
        help="the large shapes to try, largest first (of "
        + ", ".join(shape.name for shape in LARGE_CANDIDATES)
        + "; empty for none)",
    )
    parser.add_argument(
        "--compare-remat",
        action="store_true",
        help="also run the small shape with each other policy of REMAT_COMPARED (about a "
        "minute each on a v5e; the rest takes about 8)",
    )
    args = parser.parse_args()
    by_name = {shape.name: shape for shape in LARGE_CANDIDATES}
    unknown = [name for name in args.large.split(",") if name and name not in by_name]
    if unknown:
        parser.error(f"--large: unknown shape {unknown[0]!r}; of {', '.join(by_name)}")
    large = [by_name[name] for name in args.large.split(",") if name]

    # The chip is held by one process at a time: this one never opens it, each run below does.
    probe = "import jax; d = jax.devices()[0]; print(jax.__version__); print(d.device_kind)"
    found = _run([sys.executable, "-c", probe], dict(os.environ), args.timeout)
    version, device_kind = (found["stdout"].strip().splitlines() or ["?", "?"])[-2:]
    spec = gpu_for_device_kind(device_kind)
    peak = spec.bf16_flops if spec is not None else None
    report: dict[str, Any] = {
        "command": shlex.join(["python", "bench/tpu.py", *sys.argv[1:]]),
        "device_kind": device_kind,
        "jax": version,
        "peak_flops": peak,
        "peak_source": spec.source if spec is not None else None,
    }
    runs_root = args.runs_root or Path(tempfile.mkdtemp(prefix="titan-bench-tpu-"))
    out = args.out or RESULTS / f"tpu-{'-'.join(device_kind.lower().split())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every phase, so that a call cut short keeps what it measured
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    default_args = ["train", "--steps", "4" if args.smoke else "30"]
    default_args += ["--runs-root", str(runs_root), "--run-id", "default"]
    if args.smoke:
        default_args += ["--batch-size", "2", "--seq-len", "32"]
    default = titan(default_args, args.timeout)
    default.pop("stdout")
    report["default_run"] = {**default, **train_record(runs_root / "default")}
    _progress("default run", report["default_run"])
    save()

    shapes = [SMOKE_SHAPE] if args.smoke else [SMALL, *large]
    report["shapes"] = []
    measured_large = False
    for shape in shapes:
        if shape in LARGE_CANDIDATES and measured_large:
            continue
        titan_run = run_shape(shape, runs_root, args.steps, args.timeout)
        _progress(f"{shape.name} titan", titan_run)
        if shape in LARGE_CANDIDATES:
            if titan_run["status"] != "completed":
                report["shapes"].append({"shape": dataclasses.asdict(shape), "titan": titan_run})
                save()
                continue
            measured_large = True
        baseline = {} if args.smoke else run_baseline(shape, args.timeout)
        if baseline:
            _progress(f"{shape.name} baseline", baseline)
        row = {
            "shape": dataclasses.asdict(shape),
            "params": shape.model().param_count(),
            "titan": {**titan_run, "mfu_recomputed": mfu(shape, titan_run["tok_s"], peak)},
            "baseline": {**baseline, "mfu_recomputed": mfu(shape, baseline.get("tok_s"), peak)},
        }
        if titan_run["tok_s"] and baseline.get("tok_s"):
            row["titan_over_baseline"] = titan_run["tok_s"] / baseline["tok_s"]
        estimate = (titan_run.get("memory_check") or {}).get("estimate_bytes")
        if estimate and titan_run.get("program_bytes"):
            row["estimate_over_compiled"] = estimate / titan_run["program_bytes"]
        report["shapes"].append(row)
        save()

    ops = titan(["ops", "check", "--json"], args.timeout)
    try:
        rows = json.loads(ops.pop("stdout"))["results"]
    except (ValueError, KeyError, TypeError):
        rows = []
    ops["rows"] = len(rows)
    ops["not_passed"] = [r for r in rows if not r["status"].startswith(("pass", "skipped"))]
    ops["timed"] = [r for r in rows if r.get("time_ms") is not None]
    report["ops_check"] = ops
    _progress("ops check", ops)
    for row in ops["not_passed"]:
        what = f"{row['op']} {row['provider']} {row['dtype']} {row['shape']}"
        print(f"[tpu]   {what}: {row['status']}", file=sys.stderr, flush=True)
    save()
    chosen = report["shapes"][0]["titan"].get("remat")
    report["remat"] = {  # what --remat auto chose on the small shape, against the others
        remat: run_shape(shapes[0], runs_root, args.steps, args.timeout, remat)
        for remat in (REMAT_COMPARED if args.compare_remat else ())
        if remat != chosen
    }
    save()
    print(markdown(report))
    print(f"\nresults: {out}")
    return 0


def _progress(what: str, run: dict[str, Any]) -> None:
    """One line on stderr per finished process: its exit, wall time and tokens/s, and the last
    lines of its output when it failed."""
    wall = run.get("wall_s")
    line = f"[tpu] {what}: exit {run.get('rc')}, {wall or 0:.0f} s, tokens/s {run.get('tok_s')}"
    print(line, file=sys.stderr, flush=True)
    if run.get("rc") != 0:
        for tail in run.get("tail") or [run.get("error")]:
            print(f"[tpu]   {tail}", file=sys.stderr, flush=True)


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def _gb(value: float | None) -> str:
    return "unknown" if not value else f"{value / 1e9:.2f}"


def markdown(report: dict[str, Any]) -> str:
    """The results as Markdown: the default run, then one row per shape and program."""
    default = report["default_run"]
    mfu_line = default.get("mfu") or {}
    lines = [
        f"device: {report['device_kind']}, peak {(report['peak_flops'] or 0) / 1e12:.0f} "
        f"TFLOP/s dense bf16 ({report['peak_source']})",
        f"default `titan train --steps 30`: exit {default['rc']}, {default.get('wall_s', 0):.0f} s,"
        f" MFU causal {_pct(mfu_line.get('causal'))} of {mfu_line.get('peak_kind', 'no peak')}",
        f"`titan ops check`: exit {report['ops_check']['rc']}, "
        f"{report['ops_check'].get('wall_s', 0):.0f} s, {report['ops_check'].get('rows', 0)} rows, "
        f"{len(report['ops_check'].get('not_passed', []))} not passed",
        "",
        "| shape | program | remat | tokens/s | MFU causal | MFU full | estimate GB "
        "| compiled GB | titan / baseline |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["shapes"]:
        name = row["shape"]["name"]
        titan_run, baseline = row["titan"], row.get("baseline", {})
        if "baseline" not in row:
            lines.append(f"| {name} | titan | | {titan_run['status']}: {titan_run['error']} |||||")
            continue
        if baseline.get("tok_s"):
            b_mfu = baseline["mfu_recomputed"]
            lines.append(
                f"| {name} | plain JAX | dots | {baseline['tok_s']:,.0f} | {_pct(b_mfu['causal'])}"
                f" | {_pct(b_mfu['full'])} | | | 1.00 |"
            )
        t_mfu = titan_run["mfu_recomputed"]
        estimate = (titan_run.get("memory_check") or {}).get("estimate_bytes")
        ratio = row.get("titan_over_baseline")
        lines.append(
            f"| {name} | titan defaults | {titan_run.get('remat')} | "
            f"{titan_run['tok_s'] or 0:,.0f} | {_pct(t_mfu['causal'])} | {_pct(t_mfu['full'])} "
            f"| {_gb(estimate)} | {_gb(titan_run.get('program_bytes'))} "
            f"| {'' if ratio is None else f'{ratio:.3f}'} |"
        )
    small = report["shapes"][0]["shape"]["name"] if report["shapes"] else ""
    for remat, run in report.get("remat", {}).items():
        lines.append(
            f"| {small} | titan --remat {remat} | {run.get('remat')} | "
            f"{run['tok_s'] or 0:,.0f} | | | | {_gb(run.get('program_bytes'))} | |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
