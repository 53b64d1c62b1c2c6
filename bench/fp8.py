"""Benchmark: Titan's FP8 training and fused projections against its bf16 defaults on one GPU, in
one call (``bench/fp8.py``).

For each shape of ``--shapes`` (llama3-8b B2 x S4096 with bf16 master weights, llama3-1b B8 x
S2048 with fp32 master weights: :data:`bench.peers.SHAPES`), each system of ``--systems`` in its
own process (its own allocator peak and compilation), in this order:

- ``bf16``: Titan's defaults (:data:`SYSTEMS`: the document mask, ``--remat auto`` as the
  planner resolves it, the layer loop chosen by depth, the registry's providers), bf16 compute;
- ``float8``: the same with ``--matmul-dtype float8`` (:mod:`titan.ops.linear`);
- ``fused``: the same as ``bf16`` with ``--fused-projections``;
- ``float8-fused``: both (not run unless named);
- ``maxtext``, ``maxtext-fp8``: MaxText's own trainer (``bench/peers_maxtext.py``, through
  :func:`bench.peers.run_peer`), bf16 and with its own FP8 (``quantization=fp8``), on
  random tokens; run only when named, with ``--peer-path maxtext=DIR`` (the wheels of
  ``bench/maxtext-peer-wheels.txt``).

A Titan system builds the trainer ``titan train`` builds (``build_run_trainer``: one device,
AdamW, the shape's master-weight dtype) and trains it on the same tokens in every process: the
bytes of the Python standard library's modules (byte values as token ids, each module one
document: real text, which the loss can learn, without a tokenizer), ``--warmup`` untimed steps
after compiling, then ``--steps`` timed ones. Nothing is written to disk (no checkpoint).

Reported per system: ``tokens_per_s`` (batch x seq-len x timed steps over their wall time, the
device synchronised at both ends), ``mfu`` (the convention of ``bench/peers.py``: tokens/s x
(6 N + 6 L S d, attention halved for the causal mask) over the dense **bf16** peak of the device,
989.5e12 on an H200, for FP8 rows too, so that the rows compare as tokens/s do),
``vs_bf16`` (tokens/s over the ``bf16`` row's), ``remat`` (the policy ``auto`` took),
``served`` (the op providers), ``compile_s``, ``peak_memory_gib``, ``losses`` (every step's),
``gemms`` and ``fp8_gemms`` (the compiled step's cuBLAS GEMM calls, and its FP8 ones: whether
XLA rewrote the FP8 pattern, :func:`gemm_counts`).

The loss comparison: on ``--loss-shape`` the ``bf16`` and ``float8`` runs take ``--loss-steps``
steps (warm-up included) instead; ``loss_check`` gives each run's mean loss over the last
``--loss-window`` steps and their relative difference (float8 - bf16) / bf16.

    python bench/fp8.py --out bench/results/fp8-nvidia-h200.json     # about 4 minutes on an H200
    python bench/fp8.py --tiny --out /tmp/fp8.json                   # a tiny shape on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peers  # noqa: E402
from titan.gpus import gpu_for_device_kind  # noqa: E402
from titan.shapes import ModelConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# system -> the titan train options it sets (flat TrainConfig names); the peers run through
# bench/peers.py's runners.
SYSTEMS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "float8": {"matmul_dtype": "float8"},
    "fused": {"fused_projections": True},
    "float8-fused": {"matmul_dtype": "float8", "fused_projections": True},
}
PEER_SYSTEMS = {"maxtext": "maxtext", "maxtext-fp8": "maxtext-fp8"}
DEFAULT_SYSTEMS = ("bf16", "float8", "fused")
DEFAULT_SHAPES = ("llama3-8b", "llama3-1b")
# CPU runs: LLVM's cheapest optimisation level (as bench/mfu.py's smoke runs).
TINY_XLA_FLAGS = "--xla_backend_optimization_level=0"
Shape = tuple[ModelConfig, int, int, str]


def stdlib_tokens(count: int) -> tuple[list[int], list[int]]:
    """``count`` token ids and their document ids: the bytes of the standard library's ``.py``
    files in sorted order (each file one document; installed packages left out), repeated from
    the start when they run out.

    Raises:
        RuntimeError: the standard library holds no ``.py`` file.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    tokens: list[int] = []
    documents: list[int] = []
    while len(tokens) < count:
        before = len(tokens)
        for index, path in enumerate(files):
            data = path.read_bytes()
            tokens.extend(data)
            documents.extend([index] * len(data))
            if len(tokens) >= count:
                break
        if len(tokens) == before:
            raise RuntimeError("no .py files in the standard library")
    return tokens[:count], documents[:count]


def batches(batch: int, seq_len: int, steps: int) -> list[dict[str, Any]]:
    """``steps`` batches of ``batch`` rows of ``seq_len + 1`` tokens (:func:`stdlib_tokens`,
    consecutive rows), as the trainer takes them: ``tokens`` (B, S + 1) and ``segment_ids``
    (B, S) int32, the document of each input token."""
    import numpy as np

    rows = batch * steps
    tokens, documents = stdlib_tokens(rows * (seq_len + 1))
    ids = np.asarray(tokens, np.int32).reshape(steps, batch, seq_len + 1)
    docs = np.asarray(documents, np.int32).reshape(steps, batch, seq_len + 1)[:, :, :-1]
    return [{"tokens": ids[i], "segment_ids": docs[i]} for i in range(steps)]


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One Titan system in this process (module docstring): build, compile, train, time."""
    import jax

    from titan.config import TrainConfig
    from titan.layouts.builders import build_run_trainer
    from titan.ops import Ops

    model, batch, seq_len, param_dtype = shape_of(spec["shape"])
    warmup, steps = spec["warmup"], spec["steps"]
    cfg = TrainConfig.of(
        batch_size=batch,
        seq_len=seq_len,
        steps=warmup + steps,
        dp=1,
        param_dtype=param_dtype,
        **SYSTEMS[spec["system"]],
    )
    ops = Ops(jax.default_backend())
    trainer = build_run_trainer(model, ops, cfg.trainer)
    state = trainer.init_state(0)
    compile_s = trainer.trace() + sum(event.seconds for event in trainer.compile())
    data = batches(batch, seq_len, warmup + steps)
    losses = []
    for step_batch in data[:warmup]:
        state, metrics = trainer.step(state, step_batch)
        losses.append(metrics["loss"])
    jax.block_until_ready(state)
    start = time.perf_counter()
    for step_batch in data[warmup:]:
        state, metrics = trainer.step(state, step_batch)
        losses.append(metrics["loss"])
    jax.block_until_ready(state)
    step_s = (time.perf_counter() - start) / steps
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return gemm_counts(trainer) | {
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "remat": getattr(trainer.adapter, "remat", None),
        "served": ops.served,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": batch * seq_len / step_s,
        "peak_memory_gib": stats["peak_bytes_in_use"] / 2**30 if stats else None,
        "losses": [float(loss) for loss in losses],
    }


def shape_of(name: str) -> Shape:
    """(model, batch, seq-len, master-weight dtype) of a shape of ``bench/peers.py``
    (``tiny``: its smoke shape)."""
    return peers.SMOKE if name == "tiny" else peers.SHAPES[name]


def gemm_counts(trainer: Any) -> dict[str, int]:
    """How many cuBLAS(Lt) GEMM calls the compiled train step makes, and how many of them are
    FP8 (XLA's custom-call target ``__cublas$lt$matmul$f8``): whether XLA rewrote the FP8
    pattern of :mod:`titan.ops.linear` into FP8 GEMMs (0 and 0 on the CPU). Reads the SPMD
    trainer's compiled program (``_compiled``, as ``bench/planner_accuracy.py`` does)."""
    compiled = getattr(trainer, "_compiled", None)
    text = compiled.as_text() if compiled is not None else ""
    calls = [line for line in text.splitlines() if 'custom_call_target="__cublas$' in line]
    fp8 = [line for line in calls if "__cublas$lt$matmul$f8" in line]
    return {"gemms": len(calls), "fp8_gemms": len(fp8)}


def run_titan(system: str, shape: str, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    """``system`` on the shape named ``shape`` (:func:`shape_of`) in a fresh process
    (``--worker``), ``steps`` steps in all; its result, or ``error``."""
    warmup = min(args.warmup, steps - 1)
    spec = {"system": system, "shape": shape, "warmup": warmup, "steps": steps - warmup}
    env = {k: v for k, v in os.environ.items() if k != "TITAN_OPS"}
    if args.tiny:
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), TINY_XLA_FLAGS]))
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within --timeout {args.timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": peers._error(done.stderr or done.stdout, done.returncode)}
    return json.loads(lines[-1])


def loss_check(results: dict[str, dict[str, Any]], window: int) -> dict[str, Any] | None:
    """The mean loss of the last ``window`` steps of the ``bf16`` and ``float8`` runs and their
    relative difference, or None when either has no losses."""
    bf16, float8 = (results.get(s, {}).get("losses") for s in ("bf16", "float8"))
    if not bf16 or not float8:
        return None
    means = {name: statistics.fmean(losses[-window:]) for name, losses in
             (("bf16", bf16), ("float8", float8))}  # fmt: skip
    return {
        "steps": len(bf16),
        "window": window,
        "mean_loss": means,
        "first_loss": {"bf16": bf16[0], "float8": float8[0]},
        "relative_difference": (means["float8"] - means["bf16"]) / means["bf16"],
    }


def table(out: dict[str, Any]) -> str:
    """The results as a Markdown table, one row per shape and system, then the loss checks."""
    lines = [
        "| shape | system | tokens/s | MFU (bf16 peak) | vs bf16 | remat | FP8 GEMMs | compile s "
        "| peak GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, systems in out["results"].items():
        for system, r in systems.items():
            if "error" in r:
                lines.append(f"| {name} | {system} | error: {r['error']} |" + " |" * 6)
                continue
            cells = [
                f"{r['tokens_per_s']:,.0f}",
                f"{r['mfu']:.1%}" if r.get("mfu") else "unknown",
                f"{r['vs_bf16']:.3f}" if r.get("vs_bf16") else "",
                str(r.get("remat") or ""),
                f"{r['fp8_gemms']} of {r['gemms']}" if "gemms" in r else "",
                f"{r['compile_s']:.1f}" if r.get("compile_s") else "",
                f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "",
            ]
            lines.append(f"| {name} | {system} | " + " | ".join(cells) + " |")
    for name, check in out["loss_check"].items():
        if check is None:
            lines.append(f"\nloss check {name}: not run (bf16 or float8 missing)")
            continue
        means = check["mean_loss"]
        lines.append(
            f"\nloss check {name}, {check['steps']} steps, mean of the last {check['window']}: "
            f"bf16 {means['bf16']:.4f}, float8 {means['float8']:.4f}, relative difference "
            f"{check['relative_difference']:+.3%}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="of bench/peers.py's")
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help="of: " + ", ".join([*SYSTEMS, *PEER_SYSTEMS]) + " (bf16 first: vs_bf16 needs it)",
    )
    parser.add_argument("--steps", type=int, default=12, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    parser.add_argument("--loss-shape", default="llama3-1b", help="shape of the loss comparison")
    parser.add_argument("--loss-steps", type=int, default=60, help="its steps (bf16, float8)")
    parser.add_argument("--loss-window", type=int, default=10, help="last steps averaged")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per process")
    parser.add_argument(
        "--peer-path",
        action="append",
        default=[],
        metavar="SYSTEM=DIR",
        help="packages of a peer's runner (maxtext) to put on its PYTHONPATH",
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    if args.out is None:
        parser.error("--out is required")
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS and s not in PEER_SYSTEMS]
    if unknown:
        known = ", ".join([*SYSTEMS, *PEER_SYSTEMS])
        parser.error(f"--systems: unknown {unknown[0]!r}; of {known}")
    import jax  # the device kind, after the arguments parse

    device = jax.devices()[0].device_kind
    spec = gpu_for_device_kind(device)
    peak = spec.bf16_flops if spec is not None and spec.name != "cpu" else None
    if args.tiny:
        args.shapes = args.loss_shape = "tiny"
    shapes = {s: shape_of(s) for s in args.shapes.split(",")}
    peer_args = argparse.Namespace(
        peer_path=args.peer_path, steps=args.steps, skip=args.warmup, timeout=args.timeout
    )
    out: dict[str, Any] = {
        "command": shlex.join(["python", "bench/fp8.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device,
        "peak_flops": peak,
        "mfu_convention": "6 N + 6 L S d (attention halved for the causal mask), N without the "
        "input embedding, over the dense bf16 peak (FP8 rows too)",
        "shapes": {
            name: {
                "model": peers._shape_flag(s[0]),
                "batch": s[1],
                "seq_len": s[2],
                "param_dtype": s[3],
            }
            for name, s in shapes.items()
        },  # fmt: skip
        "systems": {s: SYSTEMS.get(s, "bench/peers.py") for s in systems},
        "results": {},
        "loss_check": {},
    }
    for name, shape in shapes.items():
        results: dict[str, dict[str, Any]] = {}
        for system in systems:
            started = time.perf_counter()
            if system in PEER_SYSTEMS:  # with the remat policy Titan's defaults took
                remat = results.get("bf16", {}).get("remat") or "dots-attention"
                result = peers.run_peer(PEER_SYSTEMS[system], shape, remat, peer_args)
            else:
                long = name == args.loss_shape and system in ("bf16", "float8")
                result = run_titan(system, name, args.loss_steps if long else args.steps, args)
            result["wall_s"] = time.perf_counter() - started
            peers._mfu(result, shape[0], shape[2], peak)
            if result.get("tokens_per_s") and results.get("bf16", {}).get("tokens_per_s"):
                result["vs_bf16"] = result["tokens_per_s"] / results["bf16"]["tokens_per_s"]
            results[system] = result
            brief = {k: v for k, v in result.items() if k != "losses"}
            print(name, system, json.dumps(brief), file=sys.stderr, flush=True)
        out["results"][name] = results
        if name == args.loss_shape:
            out["loss_check"][name] = loss_check(results, args.loss_window)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
