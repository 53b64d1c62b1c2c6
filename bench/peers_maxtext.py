"""MaxText 0.2.5 trained by its own trainer, one process on one device, for ``bench/peers.py``.

What runs: MaxText's pre-training entry point, ``maxtext.trainers.pre_train.train`` (what
``python -m maxtext.trainers.pre_train.train maxtext/configs/base.yml k=v ...`` runs: its
``main`` under ``absl.app.run``), called in this process so that the device's allocator
statistics can be read once it returns. Nothing of Titan's runs. The settings (:func:`overrides`,
each recorded in the output's ``settings``):

- the model: MaxText's ``llama3-8b`` config (untied embeddings, SwiGLU, RMSNorm eps 1e-5, plain
  RoPE with theta 500000: Titan's Llama; ``llama3.1-8b`` would add Llama 3.1's RoPE frequency
  scaling, which Titan's presets do not have) with ``override_model_config=true`` and the shape
  of ``--model``: ``base_emb_dim``, ``base_num_decoder_layers``, ``base_num_query_heads``,
  ``base_num_kv_heads``, ``base_mlp_dim``, ``head_dim`` = d_model / n_heads, ``vocab_size``,
  ``rope_max_timescale=500000``;
- data: ``dataset_type=synthetic`` (random tokens, generated on the device once and reused),
  ``packing=false`` (one document per row: a plain causal mask), ``per_device_batch_size`` =
  ``--batch-size``, ``max_target_length`` = ``--seq-len``;
- numerics: ``dtype=bfloat16`` (compute), ``weight_dtype`` = ``--param-dtype`` (the master
  weights; AdamW's moments follow it), ``attention=cudnn_flash_jax`` on a GPU (JAX's cuDNN fused
  attention), ``dot_product`` elsewhere (``--attention`` overrides);
- remat (:data:`REMAT`): Titan's ``--remat`` as MaxText's ``remat_policy``. ``dots`` ->
  ``minimal`` (saves the named matmul outputs: query/key/value projections, the attention output
  projection, the MLP's two input projections and its output projection); ``dots-attention`` ->
  ``minimal_with_context`` (``minimal`` plus ``context``: the cuDNN attention's output and its
  log-sum-exp); ``full`` -> ``full`` (``jax.checkpoint`` with no policy: each layer's input is
  kept, the layer recomputed). MaxText 0.2.5 has no save-everything policy: under
  ``scan_layers=true`` (its default) ``remat_policy=none`` still wraps the scanned layer in
  ``jax.checkpoint`` with no policy, i.e. ``full``; only its unscanned layer loop skips
  ``jax.checkpoint`` for ``none``. So ``none`` -> ``remat_policy=none`` with ``scan_layers=false``
  (the layers unrolled, as Titan unrolls up to 16 layers by default); ``--scan-layers`` changes
  the loop for any policy;
- the optimizer: Titan's defaults (titan/config.py, titan/optimizer.py): AdamW, lr 3e-3,
  betas (0.9, 0.95), eps 1e-8, weight decay 0.1 but not on norm scales (``adamw_mask``), global
  norm clip 1.0, linear warmup over min(30, steps) steps then cosine to 0.1 lr at ``--steps``;
- off: checkpointing, the profiler, GCS, goodput recording and monitoring, TensorBoard, the
  JAX compilation cache (``jax_cache_dir=''``: every run compiles), the JAX distributed system.

The numbers and their sources:

- ``tokens_per_s``: the median, over the steps after ``--skip``, of MaxText's own
  ``perf/per_device_tokens_per_sec`` (times the device count, 1 here) from its ``metrics_file``
  (one JSON line per step, written by ``MetricLogger``): per-device batch x seq-len over
  ``perf/step_time_seconds``, the host's wall time between the ends of two step dispatches,
  which MaxText paces one step behind the device by reading the previous step's metrics;
  ``step_time_s`` is the median of those step times;
- ``peak_memory_gib``: ``jax.local_devices()[0].memory_stats()["peak_bytes_in_use"]`` read in
  this process after the trainer returns (None where the backend keeps no statistics: CPU);
- ``time_to_first_step_s``: from this process's start (its creation time, psutil) to the moment
  MaxText has written step 0's metrics (their values are then on the host, so step 0 has ended;
  MaxText writes them when it has dispatched step 1); ``first_step_unix`` is that moment;
- ``compile_s``: MaxText reports no compile time (only through goodput recording, which needs
  Google Cloud); this is JAX's own compile-duration events (``jax.monitoring``: tracing,
  lowering and XLA compilation) of the function whose XLA compilation took longest, MaxText's
  train step, compiled ahead of time before the first step; ``compiles`` lists the others;
- ``loss_first``/``loss_last``: ``learning/loss`` of the first and last steps.

Carrying MaxText to a machine without a package index (the GPU machine, Python 3.12): the wheels
of ``bench/maxtext-peer-wheels.txt``, installed with ``python3 -m pip install --no-index --no-deps
--target /tmp/site .whl-maxtext/*.whl``, and ``PYTHONPATH=/tmp/site:bench/stubs`` (stand-ins,
each raising if used, for packages imported on this path but never called: xprof).

    PYTHONPATH=/tmp/site:bench/stubs python3 bench/peers_maxtext.py \\
        --model d_model=2048,n_layers=16,n_heads=32,n_kv_heads=8,ffn_dim=8192,vocab_size=128256 \\
        --batch-size 8 --seq-len 2048 --param-dtype float32 --remat dots --steps 15 --skip 3 \\
        --out /tmp/maxtext-peer.json

On failure the output is ``{"error": "<MaxText's last error line>", ...}`` and the exit code 1.
"""

from __future__ import annotations

import time

STARTED = time.time()  # this module's start; the process's own start time is preferred

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# This file's folder holds bench/maxtext.py, which would hide the maxtext package.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

SYSTEM = "maxtext 0.2.5"
ENTRY = "maxtext.trainers.pre_train.train"
MODEL_NAME = "llama3-8b"  # MaxText's config: untied, plain RoPE (theta 500000), as Titan's Llama
SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
# Titan's --remat -> (MaxText remat_policy, scan_layers when --scan-layers auto)
REMAT = {
    "none": ("none", False),
    "dots": ("minimal", True),
    "dots-attention": ("minimal_with_context", True),
    "full": ("full", True),
}
# MaxText's own switch for running without Google Cloud: its GCS, monitoring and diagnostics
# helpers are no-ops (maxtext/common/gcloud_stub.py), whatever is installed.
ENVIRONMENT = {"DECOUPLE_GCLOUD": "TRUE"}
# Titan's optimizer defaults (titan/config.py OptimizerOptions, titan/optimizer.py ADAM_*).
LR, MIN_LR_RATIO, WARMUP_STEPS, WEIGHT_DECAY, GRAD_CLIP = 3e-3, 0.1, 30, 0.1, 1.0
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.95, 1e-8


def parse_shape(text: str) -> dict[str, int]:
    """``d_model=2048,n_layers=16,...`` as a dict (each of :data:`SHAPE_KEYS`)."""
    shape = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in SHAPE_KEYS:
            raise SystemExit(f"--model: expected {'=,'.join(SHAPE_KEYS)}=, got {item!r}")
        shape[key.strip()] = int(value)
    missing = [k for k in SHAPE_KEYS if k not in shape]
    if missing:
        raise SystemExit(f"--model: missing {', '.join(missing)}")
    if shape["d_model"] % shape["n_heads"]:
        raise SystemExit("--model: d_model must be a multiple of n_heads")
    return shape


def overrides(args: argparse.Namespace, shape: dict[str, int], attention: str, hardware: str,
              workdir: Path) -> list[str]:  # fmt: skip
    """MaxText's ``key=value`` settings of this run (the module docstring says why each)."""
    policy, scan_auto = REMAT[args.remat]
    scan = scan_auto if args.scan_layers == "auto" else args.scan_layers == "true"
    warmup = min(WARMUP_STEPS, args.steps) / args.steps  # Titan: warmup min(30, steps) steps
    settings = {
        "model_name": MODEL_NAME,
        "override_model_config": "true",
        "base_emb_dim": shape["d_model"],
        "base_num_decoder_layers": shape["n_layers"],
        "base_num_query_heads": shape["n_heads"],
        "base_num_kv_heads": shape["n_kv_heads"],
        "base_mlp_dim": shape["ffn_dim"],
        "head_dim": shape["d_model"] // shape["n_heads"],
        "vocab_size": shape["vocab_size"],
        "rope_max_timescale": 500_000,
        "dataset_type": "synthetic",
        "packing": "false",
        "per_device_batch_size": args.batch_size,
        "max_target_length": args.seq_len,
        "dtype": "bfloat16",
        "weight_dtype": args.param_dtype,
        "attention": attention,
        "remat_policy": policy,
        "scan_layers": str(scan).lower(),
        "opt_type": "adamw",
        "learning_rate": LR,
        "learning_rate_final_fraction": MIN_LR_RATIO,
        "warmup_steps_fraction": warmup,
        "learning_rate_schedule_steps": args.steps,
        "lr_schedule_type": "cosine",
        "adam_b1": ADAM_B1,
        "adam_b2": ADAM_B2,
        "adam_eps": ADAM_EPS,
        "adam_weight_decay": WEIGHT_DECAY,
        "adamw_mask": "[norm]",  # no decay on RMSNorm scales, as Titan (its _decay_mask)
        "gradient_clipping_threshold": GRAD_CLIP,
        "steps": args.steps,
        "hardware": hardware,
        "skip_jax_distributed_system": "true",
        "enable_checkpointing": "false",
        "save_checkpoint_on_completion": "false",
        "profiler": "''",  # YAML's empty string (a bare "profiler=" reads as null)
        "enable_goodput_recording": "false",
        "monitor_goodput": "false",
        "enable_gcp_goodput_metrics": "false",
        "gcs_metrics": "false",
        "enable_tensorboard": "false",
        "jax_cache_dir": "''",
        "base_output_directory": str(workdir),
        "run_name": "peer",
        "metrics_file": str(workdir / "metrics.jsonl"),
    }
    return [f"{key}={value}" for key, value in settings.items()] + list(args.maxtext_extra)


def process_start() -> float:
    """This process's start (unix seconds): its creation time, else this module's start."""
    try:
        import psutil

        return psutil.Process(os.getpid()).create_time()
    except Exception:  # noqa: BLE001 - psutil absent, or /proc unreadable
        return STARTED


def last_error_line(exc: BaseException) -> str:
    """``exc``'s type and the last line of its own message (not the notes JAX adds, nor
    pydantic's link to its documentation), as MaxText raised it."""
    kind = type(exc).__qualname__
    if type(exc).__module__ not in ("builtins", "__main__"):
        kind = f"{type(exc).__module__}.{kind}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("For further information")]
    return f"{kind}: {lines[-1]}" if lines else kind


class LastLogLine(logging.Handler):
    """The last line MaxText logged (through absl): what it said before a ``sys.exit``."""

    def __init__(self) -> None:
        super().__init__()
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        lines = [line.strip() for line in record.getMessage().splitlines() if line.strip()]
        self.line = lines[-1] if lines else self.line


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """MaxText's metrics_file: one JSON object per step, in step order."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda row: row["step"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="d_model=,n_layers=,n_heads=,...")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--remat", choices=tuple(REMAT), default="dots-attention")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--skip", type=int, default=3, help="first steps left out of medians")
    parser.add_argument("--out", type=Path, required=True, help="JSON result")
    parser.add_argument(
        "--attention", default="auto", help="auto: cudnn_flash_jax on GPU, else dot_product"
    )
    parser.add_argument(
        "--scan-layers", choices=("auto", "true", "false"), default="auto",
        help="MaxText's layer loop; auto: unrolled for --remat none, scanned otherwise",
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path, help="MaxText's output folder (default: a temp)")
    parser.add_argument("maxtext_extra", nargs="*", help="more MaxText key=value (after --)")
    args = parser.parse_args()
    shape = parse_shape(args.model)
    started = process_start()
    result: dict[str, Any] = {"system": SYSTEM, "entry_point": ENTRY}

    def fail(message: str) -> int:
        result["error"] = message
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result), flush=True)
        return 1

    os.environ.update(ENVIRONMENT)
    try:
        import jax
        import maxtext
        from absl import app
        from maxtext.common import metric_logger
        from maxtext.trainers.pre_train import train
    except Exception as exc:  # noqa: BLE001 - a missing package, said in the result
        return fail(last_error_line(exc))

    backend = jax.default_backend()
    attention = args.attention
    if attention == "auto":
        attention = "cudnn_flash_jax" if backend == "gpu" else "dot_product"
    hardware = "gpu" if backend == "gpu" else "cpu"
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="maxtext-peer-")
        workdir = Path(tmp.name)
    else:
        workdir = args.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "metrics.jsonl").unlink(missing_ok=True)
    settings = overrides(args, shape, attention, hardware, workdir)
    base_yml = Path(maxtext.__file__).parent / "configs" / "base.yml"
    argv = [train.__file__, str(base_yml), *settings]
    result["settings"] = {
        "overrides": settings,
        "environment": ENVIRONMENT,
        "config": str(base_yml.relative_to(Path(maxtext.__file__).parent.parent)),
        "remat": f"--remat {args.remat} -> remat_policy={REMAT[args.remat][0]}",
        "tokens_per_step": args.batch_size * args.seq_len * jax.device_count(),
        "steps": args.steps,
        "skip": args.skip,
        "backend": backend,
        "device_kind": jax.devices()[0].device_kind,
        "device_count": jax.device_count(),
    }

    # Observers only: the time step 0's metrics reach the host, and JAX's compile durations.
    first_step: list[float] = []
    write_metrics = metric_logger.MetricLogger.write_metrics

    def observed_write_metrics(self, metrics, step, metric_type="train"):
        out = write_metrics(self, metrics, step, metric_type)
        if metric_type == "train" and not first_step:
            first_step.append(time.time())
        return out

    metric_logger.MetricLogger.write_metrics = observed_write_metrics
    compiles: dict[str, dict[str, float]] = {}  # seconds per phase, summed over compilations
    counts: dict[str, int] = {}  # XLA compilations per function
    phases = {
        "/jax/core/compile/jaxpr_trace_duration": "trace",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
        "/jax/core/compile/backend_compile_duration": "compile",
    }

    def on_duration(event: str, seconds: float, **kwargs: Any) -> None:
        if event in phases:
            name = str(kwargs.get("fun_name", "?"))  # "f" when traced, "jit(f)" after
            name = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name
            entry = compiles.setdefault(name, {"trace": 0.0, "lower": 0.0, "compile": 0.0})
            entry[phases[event]] += seconds
            if phases[event] == "compile":
                counts[name] = counts.get(name, 0) + 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)

    last_log = LastLogLine()
    logging.getLogger("absl").addHandler(last_log)
    print(f"peers_maxtext: python -m {ENTRY} {base_yml} " + " ".join(settings), flush=True)
    try:
        try:
            app.run(train.main, argv=argv)  # MaxText's own __main__; it ends in sys.exit
        except SystemExit as exc:
            if exc.code not in (None, 0):
                return fail(f"MaxText exited with {exc.code}: {last_log.line}")
    except Exception as exc:  # noqa: BLE001 - MaxText's own error is the result
        traceback.print_exc()
        return fail(last_error_line(exc))
    finally:
        metric_logger.MetricLogger.write_metrics = write_metrics

    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    rows = read_metrics(workdir / "metrics.jsonl")
    if tmp is not None:
        tmp.cleanup()
    timed = [row for row in rows if row["step"] >= args.skip]
    if not timed:
        return fail(f"MaxText wrote {len(rows)} step metrics, none after --skip {args.skip}")
    per_device = [row["perf/per_device_tokens_per_sec"] for row in timed]
    train_step = max(compiles.items(), key=lambda item: item[1]["compile"], default=None)
    result.update(
        {
            "tokens_per_s": statistics.median(per_device) * jax.device_count(),
            "step_time_s": statistics.median(row["perf/step_time_seconds"] for row in timed),
            "steps_timed": len(timed),
            "peak_memory_gib": peak / 2**30 if peak is not None else None,
            "time_to_first_step_s": first_step[0] - started if first_step else None,
            "first_step_unix": first_step[0] if first_step else None,
            "process_start_unix": started,
            "compile_s": sum(train_step[1].values()) if train_step else None,
            "compiled_function": train_step[0] if train_step else None,
            "compiles": {
                name: {**{k: round(v, 3) for k, v in entry.items()}, "n": counts.get(name, 0)}
                for name, entry in sorted(compiles.items(), key=lambda i: -i[1]["compile"])[:5]
            },
            "loss_first": rows[0]["learning/loss"],
            "loss_last": rows[-1]["learning/loss"],
            "losses": [round(row["learning/loss"], 4) for row in rows],
            "tflops_per_s_per_device": statistics.median(
                row["perf/per_device_tflops_per_sec"] for row in timed
            ),
        }
    )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
