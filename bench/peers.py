"""Benchmark: Titan against its peers on one GPU, each shape in one call (``bench/peers.py``).

For each shape of :data:`SHAPES` (``--shapes``), in this order, each in its own process:

- ``titan-defaults``: ``titan train --model <shape>`` with its defaults (the document mask,
  ``--remat auto``, the layer loop chosen by depth, the compilation cache), the shape's batch and
  master-weight dtype (``--remat auto`` resolves per shape; the policy it took is recorded as
  ``remat`` and the peers below train with the same one);
- ``titan-best``: the same with :data:`BEST` (the fastest options measured, which change the
  loss or trade memory: ``docs/benchmarks.md``);
- ``titan-float8``: the defaults with ``--matmul-dtype float8`` (the decoder's linear layers in
  FP8 with current scaling, :mod:`titan.ops.linear`);
- ``plain-jax``: the plain-JAX baseline of this folder (``bench/baselines/plain_jax_llama.py``:
  ``jax.jit(value_and_grad)``, optax AdamW, a rolled ``lax.scan`` over layers, cuDNN attention,
  ``dots_with_no_batch_dims_saveable`` remat), random tokens, the same shape, batch and
  master-weight dtype;
- ``torchtitan``: torchtitan 0.3.0's own llama3 trainer (``bench/peers_torchtitan.py``:
  ``torch.compile``, AdamW, bf16 compute over the shape's master-weight dtype, synthetic tokens,
  the activation checkpointing of Titan's defaults' policy), as released: on torch 2.11 it
  stops at its first step (``error`` says where); ``torchtitan-compat``: the same with the two
  calls that torch 2.11 lacks adapted (the runner's ``--compat``) and without CUDA graphs (the
  runner's ``--no-cuda-graphs``: a graph needs the same BlockMask every step, and the document
  mask changes with the batch); ``torchtitan-0.2.2``: the newest release that runs on torch
  2.11 unmodified;
- ``maxtext``: MaxText's own trainer (``bench/peers_maxtext.py``: ``dataset_type=synthetic``,
  cuDNN attention, the remat policy of Titan's defaults' policy); ``maxtext-fp8``: the same with
  MaxText's own FP8 training (``quantization=fp8``: flax's ``fp8_ops``, FP8 GEMMs through
  XLA as Titan's ``--matmul-dtype float8``).

The peers need packages the GPU machine may lack: ``--peer-path SYSTEM=DIR`` puts ``DIR`` (a
``pip install --target`` of the wheels their runners name) and ``bench/stubs`` on that system's
``PYTHONPATH`` alone, so no peer's packages shadow Titan's.

Titan trains on its stdlib corpus (token ids differ from the baseline's random ones; the work
per step does not). Reported per system: ``tokens_per_s`` (Titan: the median of its step records
after ``--skip`` steps; the baseline: ten timed steps after two), ``mfu`` (one convention for
all: tokens/s x FLOPs per token / peak, FLOPs per token 6 N plus 6 L S d, attention halved for
the causal mask, N without the input embedding (:func:`titan.flops.
model_flops_per_token`), peak the catalog's dense bf16 FLOP/s of the device, 989.5e12 on an
H200), ``peak_memory_gib`` (the allocator's peak), ``time_to_first_step_s`` (from the process's
start to the end of its first step: imports, data, compilation, the step) and ``compile_s``
(the train step's compilation; for Titan, that of the ``--remat`` candidate it ran);
where a system fails, ``error``: the last error line of its own output (a peer's runner writes
its own ``error``).

Titan's runs save a checkpoint at their end (removed once read; a run stopped at ``--timeout``
while saving it still reports its step records, with a ``note``); the baseline saves none.

    python bench/peers.py --out bench/results/peers-nvidia-h200.json
    python bench/peers.py --smoke --out /tmp/peers.json     # a tiny shape on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from titan.flops import model_flops_per_token
from titan.gpus import gpu_for_device_kind
from titan.shapes import PRESETS, ModelConfig
from titan.telemetry.records import read_events

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
BASELINE = BENCH / "baselines" / "plain_jax_llama.py"
# shape -> (model, batch, seq_len, master-weight dtype)
SHAPES: dict[str, tuple[ModelConfig, int, int, str]] = {
    "llama3-1b": (PRESETS["llama3-1b"], 8, 2048, "float32"),
    "llama3-3b": (PRESETS["llama3-3b"], 4, 2048, "float32"),
    "llama3-8b": (PRESETS["llama3-8b"], 2, 4096, "bfloat16"),
}
SMOKE = (ModelConfig("smoke", 4096, 64, 2, 4, 2, 128), 8, 32, "float32")
BEST = ("--remat", "dots-attention", "--attention-mask", "causal")
# peer -> (its runner's package, the runner's options besides the shape): torchtitan's Llama
# untied as Titan's (its 1B and 3B flavors tie the head to the embedding)
PEERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torchtitan": ("torchtitan", ("--tie-embeddings", "no")),
    "torchtitan-compat": (
        "torchtitan",
        ("--tie-embeddings", "no", "--compat", "--no-cuda-graphs"),
    ),
    "torchtitan-0.2.2": ("torchtitan", ("--torchtitan-version", "0.2.2")),
    "maxtext": ("maxtext", ()),
    "maxtext-fp8": ("maxtext", ("quantization=fp8",)),
}
# Titan's systems: the titan train options each adds to the shape's
TITAN: dict[str, tuple[str, ...]] = {
    "titan-defaults": (),
    "titan-best": BEST,
    "titan-float8": ("--matmul-dtype", "float8"),
}
SYSTEMS = (*TITAN, "plain-jax", *PEERS)


def _shape_flag(m: ModelConfig) -> str:
    return (
        f"d_model={m.d_model},n_layers={m.n_layers},n_heads={m.n_heads},"
        f"n_kv_heads={m.n_kv_heads},ffn_dim={m.ffn_dim},vocab_size={m.vocab_size}"
    )


def _error(output: str, code: int) -> str:
    """The last line of ``output`` naming an error (else its last line), with the exit code."""
    lines = [line for line in output.strip().splitlines() if line.strip()] or [""]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:)", line)]
    return f"exit {code}: {(errors or lines)[-1].strip()}"


def run_titan(
    shape: tuple[ModelConfig, int, int, str], extra: tuple[str, ...], runs: Path, args
) -> dict[str, Any]:
    """One ``titan train`` run (module docstring); its run dir is removed once read."""
    m, batch, seq_len, param_dtype = shape
    run_id = f"run-{len(list(runs.glob('*'))) if runs.exists() else 0}"
    shape_args = ["--preset", m.name] if PRESETS.get(m.name) == m else ["--model", _shape_flag(m)]
    command = [sys.executable, "-m", "titan.cli", "train", *shape_args]
    command += ["--batch-size", str(batch), "--seq-len", str(seq_len)]
    command += ["--param-dtype", param_dtype, "--steps", str(args.steps)]
    command += ["--checkpoint-every", str(args.steps), "--checkpoint-keep", "1"]
    command += ["--runs-root", str(runs), "--run-id", run_id, *extra, *args.titan_extra]
    launched = time.time()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.timeout, cwd=REPO
        )
        code, output = done.returncode, done.stderr or done.stdout
    except subprocess.TimeoutExpired as err:  # killed: its step records still count
        code, output = None, str(err.stderr or err.stdout or "")
    run_dir = runs / run_id
    try:
        events = read_events(run_dir) if (run_dir / "events.jsonl").exists() else []
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    steps = [e for e in events if e["type"] == "step"]
    timed = [e["tokens_per_s"] for e in steps[args.skip :] if e.get("tokens_per_s")]
    if code != 0 and not timed:
        return {"error": _error(output, code if code is not None else -9)}
    peaks = [e["peak_memory_bytes"] for e in steps if e.get("peak_memory_bytes")]
    compiles = [e for e in events if e["type"] == "compile" and not e.get("passed_over")]
    start = next(e for e in events if e["type"] == "run_start")
    result = {
        "remat": start["config"]["remat"],
        "tokens_per_s": statistics.median(timed),
        "peak_memory_gib": max(peaks) / 2**30 if peaks else None,
        "time_to_first_step_s": steps[0]["time"] - launched,
        "compile_s": compiles[0]["seconds"] if compiles else None,
        "command": shlex.join(["python", "-m", "titan.cli", *command[3:]]),
    }
    if code is None:
        result["note"] = (
            f"stopped at --timeout {args.timeout:g} s after {len(steps)} steps, before its final "
            "checkpoint was written"
        )
    elif code != 0:
        result["note"] = _error(output, code)
    return result


def run_baseline(shape: tuple[ModelConfig, int, int, str], args) -> dict[str, Any]:
    """The plain-JAX baseline as a subprocess (its environment interface)."""
    m, batch, seq_len, param_dtype = shape
    env = {**os.environ, "L": str(m.n_layers), "D": str(m.d_model), "H": str(m.n_heads)}
    env.update(KV=str(m.n_kv_heads), F=str(m.ffn_dim), V=str(m.vocab_size), S=str(seq_len))
    env.update(B=str(batch), PDT=param_dtype, ATTN=args.baseline_attn, REMAT="1")
    launched = time.time()
    done = subprocess.run(
        [sys.executable, str(BASELINE)], env=env, capture_output=True, text=True,
        timeout=args.timeout, cwd=REPO,
    )  # fmt: skip
    record = next(
        (json.loads(line) for line in reversed(done.stdout.splitlines()) if '"tok_s"' in line),
        None,
    )
    if done.returncode != 0 or record is None:
        return {"error": _error(done.stderr or done.stdout, done.returncode)}
    return {
        "tokens_per_s": record["tok_s"],
        "peak_memory_gib": record["peak_mem_gb"],  # the baseline divides bytes by 2**30
        "time_to_first_step_s": record["first_step_unix"] - launched,
        "compile_s": record["compile_s"],
    }


def run_peer(
    system: str, shape: tuple[ModelConfig, int, int, str], remat: str, args
) -> dict[str, Any]:
    """One peer's runner (``bench/peers_<package>.py``, :data:`PEERS`) as a subprocess; its
    JSON result, with ``time_to_first_step_s`` counted from the subprocess's launch as Titan's
    is."""
    m, batch, seq_len, param_dtype = shape
    package, options = PEERS[system]
    paths = dict(item.split("=", 1) for item in args.peer_path)
    env = dict(os.environ)
    if package in paths:
        env["PYTHONPATH"] = os.pathsep.join([paths[package], str(BENCH / "stubs")])
    with tempfile.TemporaryDirectory(prefix=f"titan-bench-{system}-") as tmp:
        out = Path(tmp, "result.json")
        command = [sys.executable, str(BENCH / f"peers_{package}.py"), *options]
        command += ["--model", _shape_flag(m)]
        command += ["--batch-size", str(batch), "--seq-len", str(seq_len)]
        command += ["--param-dtype", param_dtype, "--remat", remat]
        command += ["--steps", str(args.steps), "--skip", str(args.skip), "--out", str(out)]
        launched = time.time()
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=REPO
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result within --timeout {args.timeout:g} s"}
        if not out.exists():
            return {"error": _error(done.stderr or done.stdout, done.returncode)}
        result = json.loads(out.read_text())
        if result.get("first_step_unix"):
            result["time_to_first_step_s"] = result["first_step_unix"] - launched
        return result


def _mfu(result: dict[str, Any], m: ModelConfig, seq_len: int, peak: float | None) -> None:
    tokens_per_s = result.get("tokens_per_s")
    if tokens_per_s and peak:
        result["mfu"] = tokens_per_s * model_flops_per_token(m, seq_len, "causal") / peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="of: " + ", ".join(SYSTEMS) + " (titan-defaults first: the peers take its remat)",
    )
    parser.add_argument(
        "--peer-path",
        action="append",
        default=[],
        metavar="SYSTEM=DIR",
        help="packages of a peer's runner (torchtitan, maxtext) to put on its PYTHONPATH",
    )
    parser.add_argument("--steps", type=int, default=15, help="steps per run (not the baseline's)")
    parser.add_argument("--skip", type=int, default=3, help="first steps not timed (ibid.)")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per process")
    parser.add_argument("--baseline-attn", default="cudnn", help="baseline ATTN (cudnn | xla)")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, on CPU")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("titan_extra", nargs="*", help="more titan train options (after --)")
    args = parser.parse_args()
    import jax  # the device kind, after the arguments parse

    device = jax.devices()[0].device_kind
    spec = gpu_for_device_kind(device)
    peak = spec.bf16_flops if spec is not None and spec.name != "cpu" else None
    shapes = {"smoke": SMOKE} if args.smoke else {s: SHAPES[s] for s in args.shapes.split(",")}
    systems = args.systems.split(",")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="titan-bench-peers-") as tmp:
        for name, shape in shapes.items():
            results[name] = {}
            remat = "dots-attention"  # the peers' policy when titan-defaults did not run
            for system in systems:
                if system == "plain-jax":
                    result = run_baseline(shape, args)
                elif system in PEERS:
                    result = run_peer(system, shape, remat, args)
                else:
                    result = run_titan(shape, TITAN[system], Path(tmp, "runs"), args)
                    if system == "titan-defaults" and "remat" in result:
                        remat = result["remat"]
                _mfu(result, shape[0], shape[2], peak)
                results[name][system] = result
                print(name, system, json.dumps(result), flush=True)
    out = {
        "command": shlex.join(["python", "bench/peers.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device,
        "peak_flops": peak,
        "mfu_convention": "6 N + 6 L S d (attention halved for the causal mask), N without the "
        "input embedding, over the dense bf16 peak",
        "shapes": {
            name: {"model": _shape_flag(s[0]), "batch": s[1], "seq_len": s[2], "param_dtype": s[3]}
            for name, s in shapes.items()
        },
        "best_options": " ".join(BEST),
        "results": results,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
