"""Benchmark: titan's train step against the plain-JAX baseline on one GPU, in tokens/s and MFU.

``python bench/mfu.py`` runs, in one go:

(a) the plain-JAX baseline (``bench/baselines/plain_jax_llama.py``, or ``--baseline PATH``; it
    is run as a subprocess with the environment L, S, B, ATTN, REMAT and its last JSON line
    read: ``tok_s``, ``mfu_causal``, ``mfu_palm``, ``peak_mem_gb``);
(b) titan's train step (``titan.layouts.builders.build_run_trainer``: jit over a one-device mesh,
    fp32 master weights, bf16 compute, AdamW) on the same model shape, batch and sequence length
    and random tokens (one document per row, as in the baseline), one subprocess per configuration
    so that peak memory and XLA flags belong to that configuration alone.

The titan configurations are a greedy search over the levers that fit one GPU: starting from
attention within documents (segment ids, as ``titan train`` defaults to; the rows hold one
document each, so ``--attention-mask causal`` computes the same loss), the registry's automatic
choice of attention (on an H200 with segment ids: the Pallas flash kernels), ``dots`` remat (as
the baseline), native cross-entropy, RMSNorm, RoPE and SwiGLU, the layer loop fully unrolled
(titan's default ``--layer-unroll 0``; the baseline's scan is rolled) and no extra XLA flags,
each lever in :data:`LEVERS` is tried in turn with the others held at the best
values so far, and the faster value is kept. Each run records what it changed and its tokens/s
relative to the best configuration it was compared with. Gradient accumulation
(microbatching) is not a lever: the trainer has none, and at this size the batch fits.

MFU (Chowdhery et al. 2022, PaLM, App. B): tokens/s * FLOPs per token / peak FLOP/s, with
FLOPs per token = 6 * N (N: parameters without the input embedding, which is a lookup) plus
attention 12 * L * S * d counted in full (PaLM, torchtitan) or 6 * L * S * d halved for the causal
mask (MaxText), from :func:`titan.flops.model_flops_per_token`; the same formulas as
the baseline file. Peak: the device's dense bf16 FLOP/s from the GPU catalog
(:mod:`titan.gpus`: 989.5e12 on H100/H200 SXM, the baseline file divides by 989e12);
on a device not in the catalog, or the CPU, MFU is reported as unknown.

Writes ``bench/results/mfu-<device>.json`` (or ``--out``) and prints a Markdown table.
``--smoke`` runs a tiny model on CPU (no baseline unless ``--baseline`` is given) so that CI
checks the script end to end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from titan.config import TrainConfig
from titan.flops import model_flops_per_token
from titan.gpus import gpu_for_device_kind
from titan.shapes import ModelConfig

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = Path(__file__).resolve().parent / "baselines" / "plain_jax_llama.py"


@dataclasses.dataclass(frozen=True)
class Shape:
    """Model and batch shape (the baseline's names: L layers, d model dim, S sequence, B batch)."""

    layers: int = 16
    d_model: int = 2048
    heads: int = 16
    kv_heads: int = 8
    ffn: int = 5632
    vocab: int = 32_000
    seq: int = 2048
    batch: int = 8


SMOKE_SHAPE = Shape(layers=2, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq=32, batch=2)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One titan configuration: attention mask, op providers ("auto": the registry's choice),
    remat, XLA flags."""

    attention_mask: str = "document"
    attention: str = "auto"
    remat: str = "dots"
    cross_entropy: str = "native"
    rms_norm: str = "native"
    rope: str = "native"
    swiglu: str = "native"
    layer_unroll: str = "0"
    xla_flags: str = ""

    def overrides(self) -> dict[str, str]:
        ops = {"attention": self.attention, "cross_entropy": self.cross_entropy}
        ops.update(rms_norm=self.rms_norm, rope=self.rope, swiglu=self.swiglu)
        return {op: name for op, name in ops.items() if name != "auto"}


# Values tried per lever, the starting value first.
LEVERS: dict[str, list[str]] = {
    "attention_mask": ["document", "causal"],
    "attention": ["auto", "cudnn", "pallas", "native"],
    "remat": ["dots", "dots-attention", "none", "full"],
    "cross_entropy": ["native", "chunked", "fused"],
    "rms_norm": ["native", "pallas"],
    "rope": ["native", "fused"],
    "swiglu": ["native", "pallas"],
    "layer_unroll": ["0", "1"],
    "xla_flags": [
        "",
        "--xla_gpu_enable_triton_gemm=false",
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_while_loop_double_buffering=true",
        "--xla_gpu_enable_command_buffer=",
        "--xla_gpu_enable_cublaslt=true",
        "--xla_gpu_exhaustive_tiling_search=true",
        "--xla_gpu_enable_dynamic_slice_fusion=true",
    ],
}
SMOKE_LEVERS: dict[str, list[str]] = {
    "attention": ["auto", "pallas"],
    "cross_entropy": ["native", "chunked"],
    "rope": ["native", "fused"],
    "swiglu": ["native", "pallas"],
}
# CPU smoke runs: LLVM's cheapest optimisation level, the tiny model compiles in half the time.
SMOKE_XLA_FLAGS = "--xla_backend_optimization_level=0"


def flops_per_token(shape: Shape, causal_halved: bool) -> float:
    """Training FLOPs per token, 6 N plus attention (:mod:`titan.flops`)."""
    convention = "causal" if causal_halved else "full"
    return model_flops_per_token(model_config(shape), shape.seq, convention)


def peak_flops(device_kind: str) -> float | None:
    """Dense bf16 peak FLOP/s of a device kind (the GPU catalog), None when unknown or CPU."""
    spec = gpu_for_device_kind(device_kind)
    return spec.bf16_flops if spec is not None and spec.name != "cpu" else None


def model_config(shape: Shape) -> ModelConfig:
    """The model of ``shape``, with RoPE theta and norm eps as in the baseline file."""
    return ModelConfig(
        "bench",
        shape.vocab,
        shape.d_model,
        shape.layers,
        shape.heads,
        shape.kv_heads,
        shape.ffn,
        rope_theta=10_000.0,
        norm_eps=1e-5,
    )


def run_titan(shape: Shape, config: RunConfig, steps: int, warmup: int) -> dict[str, Any]:
    """Build, compile and time titan's train step in this process. Returns the run's metrics."""
    import jax
    import numpy as np

    from titan.layouts.builders import build_run_trainer
    from titan.ops import Ops

    backend = jax.default_backend()
    cfg = TrainConfig.of(
        batch_size=shape.batch,
        seq_len=shape.seq,
        steps=warmup + steps,
        dp=1,
        param_dtype="float32",
        compute_dtype="bfloat16" if backend != "cpu" else "float32",
        remat=config.remat,
        attention_mask=config.attention_mask,
        layer_unroll=int(config.layer_unroll),
    )
    ops = Ops(backend, config.overrides())
    trainer = build_run_trainer(model_config(shape), ops, cfg.trainer)
    state = trainer.init_state(0)
    compile_s = trainer.trace() + sum(event.seconds for event in trainer.compile())
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(0, shape.vocab, (shape.batch, shape.seq + 1), dtype=np.int32),
        "segment_ids": np.zeros((shape.batch, shape.seq), np.int32),
    }
    for _ in range(warmup):
        state, metrics = trainer.step(state, batch)
    jax.block_until_ready(metrics["loss"])
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = trainer.step(state, batch)
    loss = float(jax.block_until_ready(metrics["loss"]))
    step_s = (time.perf_counter() - start) / steps
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    tok_s = shape.batch * shape.seq / step_s
    peak = peak_flops(device.device_kind)
    return {
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "served": ops.served,
        "compile_s": compile_s,
        "step_s": step_s,
        "tok_s": tok_s,
        "loss": loss,
        "mfu_causal": peak and tok_s * flops_per_token(shape, True) / peak,
        "mfu_palm": peak and tok_s * flops_per_token(shape, False) / peak,
        "peak_mem_gib": stats["peak_bytes_in_use"] / 2**30 if stats else None,
    }


def _last_json(stdout: str, key: str) -> dict[str, Any] | None:
    """The last stdout line that is a JSON object holding ``key``."""
    for line in reversed(stdout.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and key in record:
            return record
    return None


def _subprocess(argv: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run a benchmark process; its last JSON line with ``tok_s``, or an ``error`` record."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    record = _last_json(done.stdout, "tok_s")
    if done.returncode != 0 or record is None:
        lines = (done.stderr or done.stdout).strip().splitlines() or [""]
        errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
        return {"error": f"exit {done.returncode}: {(errors or lines)[-1].replace('|', '/')}"}
    record["wall_s"] = time.perf_counter() - start
    return record


def run_baseline(path: Path, shape: Shape, attn: str, remat: str, timeout_s: float) -> dict:
    """The plain-JAX baseline as a subprocess (its environment interface: L, S, B, ATTN, REMAT)."""
    env = {**os.environ, "L": str(shape.layers), "S": str(shape.seq), "B": str(shape.batch)}
    env.update(ATTN=attn, REMAT=remat)
    record = _subprocess([sys.executable, str(path)], env, timeout_s)
    if "peak_mem_gb" in record:  # the baseline divides bytes by 2**30
        record["peak_mem_gib"] = record.pop("peak_mem_gb")
    return record


def run_config(args: argparse.Namespace, shape: Shape, config: RunConfig) -> dict[str, Any]:
    """One titan configuration in a fresh process (``--worker``)."""
    env = dict(os.environ)
    flags = [env.get("XLA_FLAGS", ""), SMOKE_XLA_FLAGS if args.smoke else "", config.xla_flags]
    env["XLA_FLAGS"] = " ".join(filter(None, flags))
    worker = {
        "shape": dataclasses.asdict(shape),
        "config": dataclasses.asdict(config),
        "steps": args.steps,
        "warmup": args.warmup,
    }
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(worker)]
    return _subprocess(argv, env, args.timeout)


def sweep(
    args: argparse.Namespace, shape: Shape, levers: dict[str, list[str]], start: RunConfig
) -> list[dict]:
    """Greedy search over ``levers`` from ``start``; every run is returned, with what it changed
    and its tokens/s relative to the best configuration before it."""
    best = start
    best_run = {"config": dataclasses.asdict(best), "lever": "start"}
    best_run.update(run_config(args, shape, best))
    runs = [best_run]
    _progress(best_run)
    for lever, values in levers.items():
        for value in values:
            if value == getattr(best, lever):
                continue
            config = dataclasses.replace(best, **{lever: value})
            run = {"config": dataclasses.asdict(config), "lever": f"{lever}={value or 'none'}"}
            run.update(run_config(args, shape, config))
            if "tok_s" in run and "tok_s" in best_run:
                run["vs_previous_best"] = run["tok_s"] / best_run["tok_s"]
            runs.append(run)
            _progress(run)
            if run.get("tok_s", 0) > best_run.get("tok_s", 0):
                best, best_run = config, run
    return runs


def _progress(run: dict[str, Any]) -> None:
    result = f"{run['tok_s']:.0f} tok/s" if "tok_s" in run else run["error"]
    print(f"[mfu] {run.get('lever', 'baseline')}: {result}", file=sys.stderr, flush=True)


def _cell(value: Any, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def markdown(baseline: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, one row per run, the baseline first."""
    header = (
        "| run | attention mask | attention | remat | cross-entropy | rms_norm | rope | swiglu "
        "| layer unroll | XLA flags "
        "| tokens/s | MFU causal | MFU full | peak GiB | vs prev. best | titan / baseline |"
    )
    lines = [header, "|" + "---|" * 16]
    if "tok_s" in baseline:
        lines.append(
            f"| plain-JAX baseline | causal | {baseline.get('attn', '')} | "
            f"{'dots' if baseline.get('remat') else 'none'} | native | native | native | native | "
            "1 (scan) | | "
            f"{baseline['tok_s']:.0f} | {_cell(baseline.get('mfu_causal'), '.1%')} | "
            f"{_cell(baseline.get('mfu_palm'), '.1%')} | "
            f"{_cell(baseline.get('peak_mem_gib'), '.1f')} | | 1.00 |"
        )
    else:
        lines.append(f"| plain-JAX baseline | {baseline.get('error', 'not run')} |" + " |" * 14)
    for run in runs:
        cfg = run["config"]
        served = run.get("served", {})
        cells = [
            run["lever"],
            cfg.get("attention_mask", "document"),
            f"{cfg['attention']} ({served.get('attention', '?')})",
            cfg["remat"],
            cfg["cross_entropy"],
            cfg["rms_norm"],
            cfg.get("rope", "native"),
            cfg.get("swiglu", "native"),
            cfg.get("layer_unroll", "1"),
            f"`{cfg['xla_flags']}`" if cfg["xla_flags"] else "",
        ]
        if "tok_s" not in run:
            lines.append("| " + " | ".join(cells + [f"error: {run['error']}"]) + " |" * 6)
            continue
        cells += [
            f"{run['tok_s']:.0f}",
            _cell(run["mfu_causal"], ".1%"),
            _cell(run["mfu_palm"], ".1%"),
            _cell(run["peak_mem_gib"], ".1f"),
            _ratio(run.get("vs_previous_best")),
            _ratio(run.get("vs_baseline")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _device_slug(runs: list[dict[str, Any]]) -> str:
    kind = next((r["device_kind"] for r in runs if "device_kind" in r), "unknown")
    return "-".join(kind.lower().split())


def _start_config(parser: argparse.ArgumentParser, spec: str) -> RunConfig:
    """``--start``: RunConfig fields as ``name=value`` pairs (a parser error on unknown names)."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    items = [item for item in spec.split(",") if item]
    pairs = dict(item.split("=", 1) for item in items if "=" in item)
    if set(pairs) - fields or len(pairs) != len(items):
        parser.error(f"--start: expected name=value pairs of {', '.join(sorted(fields))}")
    return RunConfig(**pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline",
        type=Path,
        help=f"the plain-JAX baseline file (default: {DEFAULT_BASELINE.relative_to(REPO)}; "
        "none with --smoke)",
    )
    parser.add_argument("--baseline-attn", default="cudnn", help="baseline ATTN (cudnn | xla)")
    parser.add_argument("--baseline-remat", default="1", help="baseline REMAT (1 | 0)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per process")
    parser.add_argument(
        "--levers", help="comma-separated levers to search (default: all of them)", default=""
    )
    parser.add_argument(
        "--start",
        default="",
        help="starting configuration, e.g. 'attention_mask=causal,remat=dots' (default: the "
        "first value of each lever)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model, CPU-friendly")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        spec = json.loads(args.worker)
        shape, config = Shape(**spec["shape"]), RunConfig(**spec["config"])
        print(json.dumps(run_titan(shape, config, spec["steps"], spec["warmup"])), flush=True)
        return 0
    if args.baseline is None and not args.smoke:
        args.baseline = DEFAULT_BASELINE
    shape = SMOKE_SHAPE if args.smoke else Shape()
    levers = SMOKE_LEVERS if args.smoke else LEVERS
    if args.levers:
        unknown = sorted(set(args.levers.split(",")) - set(levers))
        if unknown:
            parser.error(f"--levers: unknown lever {unknown[0]!r}; levers: {', '.join(levers)}")
        levers = {name: levers[name] for name in args.levers.split(",")}
    start = _start_config(parser, args.start)
    baseline = {"error": "not run (no --baseline)"}
    if args.baseline is not None:
        baseline = run_baseline(
            args.baseline, shape, args.baseline_attn, args.baseline_remat, args.timeout
        )
        _progress(baseline)
    runs = sweep(args, shape, levers, start)
    for run in runs:
        if "tok_s" in run and "tok_s" in baseline:
            run["vs_baseline"] = run["tok_s"] / baseline["tok_s"]
    best = max((r for r in runs if "tok_s" in r), key=lambda r: r["tok_s"], default=None)
    report = {
        "command": shlex.join(["python", "bench/mfu.py", *sys.argv[1:]]),
        "peak_flops": best and peak_flops(best["device_kind"]),
        "shape": dataclasses.asdict(shape),
        "steps": args.steps,
        "warmup": args.warmup,
        "levers": levers,
        "baseline": baseline,
        "runs": runs,
        "best": best,
    }
    out = args.out or RESULTS / f"mfu-{_device_slug(runs)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(baseline, runs))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
