"""Benchmark: planner predictions against measured runs (``python bench/planner_accuracy.py``).

For each configuration of a suite (model shape, batch, sequence length, remat policy, SPMD or
MPMD layout), a child process builds Titan's trainer (``titan.layouts.builders.build_run_trainer``,
so custom shapes need no preset), runs ``--steps`` optimizer steps on random tokens with the
training loop's pattern (metrics read one step late) and reports:

- the step time: median wall time between consecutive step completions after ``--warmup``
  steps (the ``step_time_s`` of ``titan train``'s events);
- the peak memory per device: ``memory_stats()["peak_bytes_in_use"]`` on accelerators; on CPU,
  where the runtime keeps no such statistic, XLA's buffer assignment of the compiled SPMD step
  (arguments + outputs - aliased + temporaries), and nothing for MPMD;
- the device kind, the providers that served each op (``titan.ops``), and the rate of a 1024^3
  matmul just before and after the steps.

The parent then predicts both with ``titan.planning`` (no JAX), fits one achievable fraction of
peak per GPU over all of that GPU's runs (``titan.planning.step.calibrate``), and reports per
configuration the predicted and measured values and their errors, with mean and worst absolute
percentage errors, in-sample and leave-one-out. Results go to
``bench/results/planner_accuracy.json`` (merged per suite; ``--no-run`` re-evaluates the stored
measurements after a change to the planner) and a markdown table to stdout.

On CPU the planner's device is the measured host: the peak is the matmul rate measured during
the run (other processes share the cores), and a run on ``n`` forced host devices gets 1/n of
it and of the memory bandwidth. Three CPU effects the planner does not model, so that CPU errors
say little about accelerators: pipeline stages on one host take turns on the same cores (no
idle bubble); XLA:CPU partitions Titan's FSDP rules as a split contraction that gathers
activations (slower and larger than ZeRO-3); and its scan stores saved activations with copies
that make ``--remat none`` slower than ``full``.

Suites: ``cpu`` (small float32 models, 1 and 2 forced host devices), ``h200x1`` and ``h200x2``
(bfloat16 compute on one and two H200s).

Random draws (the held-out figures): ``--draw SEED`` measures the configurations that
``bench/planner_space.py`` draws with that seed (``--count``, from index ``--first``, until
``--budget-s`` has passed), each in its own process, recording the compiled program's memory
analysis before it runs (so a run that then runs out of memory keeps its peak, and is recorded
as ``oom``), into ``bench/results/planner_draws.json``. ``--evaluate`` (no JAX) fits the step
time's three constants on a random half of each draw, scores both halves and leave-one-out,
scores later draws with the first draw's constants too, checks that no configuration the
planner calls a fit ran out of memory, and writes ``bench/results/planner_draws_evaluation.json``
and a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import planner_space

from titan.gpus import gpu_for_device_kind
from titan.planning.memory import Layout, Precision, memory_per_device
from titan.planning.step import Cluster, Measurement, calibrate, estimate_step
from titan.shapes import ModelConfig

RESULTS = Path(__file__).parent / "results" / "planner_accuracy.json"
# The measured draws of bench/planner_space.py, by seed.
DRAWS = Path(__file__).parent / "results" / "planner_draws.json"

# Shapes: (d_model, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size).
CPU_SHAPES = {
    "cpu-s": (256, 4, 8, 4, 688, 4096),
    "cpu-m": (384, 4, 6, 2, 1024, 8192),
    "cpu-w": (512, 2, 8, 2, 1536, 4096),
}
GPU_SHAPES = {
    "0.4b": (1024, 24, 16, 8, 4096, 32000),
    "1.5b": (2048, 16, 32, 8, 8192, 128256),  # the llama3-1b preset, untied
    "3.2b": (3072, 24, 24, 8, 8192, 128256),
}
PIPE = {"layout": "mpmd", "pp": 2}
# (suite, shape, batch in sequences, sequence length, remat, layout options). ``dp`` is 1 unless
# given (``titan train``'s default 0 would fill every device present).
_RUNS = (
    ("cpu", "cpu-s", 8, 128, "none", {}),
    ("cpu", "cpu-s", 8, 128, "dots", {}),
    ("cpu", "cpu-s", 8, 128, "full", {}),
    ("cpu", "cpu-s", 4, 512, "none", {}),
    ("cpu", "cpu-m", 8, 256, "none", {}),
    ("cpu", "cpu-m", 8, 256, "full", {}),
    ("cpu", "cpu-w", 8, 128, "none", {}),
    ("cpu", "cpu-w", 16, 128, "dots", {}),
    ("cpu", "cpu-w", 4, 512, "full", {}),
    ("cpu", "cpu-s", 8, 256, "none", {"dp": 2}),
    ("cpu", "cpu-s", 8, 256, "none", {"tp": 2}),
    ("cpu", "cpu-s", 8, 256, "none", {"fsdp": 2}),
    ("cpu", "cpu-s", 8, 256, "none", PIPE | {"microbatches": 4, "schedule": "1f1b"}),
    ("cpu", "cpu-s", 8, 256, "none", PIPE | {"microbatches": 4, "schedule": "gpipe"}),
    ("h200x1", "1.5b", 4, 2048, "none", {}),
    ("h200x1", "1.5b", 8, 2048, "dots", {}),
    ("h200x1", "1.5b", 8, 2048, "full", {}),
    ("h200x1", "1.5b", 16, 2048, "dots", {}),
    ("h200x1", "0.4b", 16, 2048, "dots", {}),
    ("h200x1", "0.4b", 16, 1024, "none", {}),
    ("h200x1", "3.2b", 8, 2048, "full", {}),
    ("h200x1", "3.2b", 4, 4096, "dots", {}),
    ("h200x2", "1.5b", 16, 2048, "dots", {"dp": 2}),
    ("h200x2", "1.5b", 16, 2048, "dots", {"fsdp": 2}),
    ("h200x2", "1.5b", 16, 2048, "dots", {"tp": 2}),
    ("h200x2", "1.5b", 16, 2048, "dots", PIPE | {"microbatches": 8, "schedule": "1f1b"}),
    ("h200x2", "1.5b", 16, 2048, "dots", PIPE | {"microbatches": 8, "schedule": "zero-bubble"}),
)
SUITES: dict[str, list[dict[str, Any]]] = {
    suite: [
        {"shape": shape, "batch_size": batch, "seq_len": seq, "remat": remat, "dp": 1} | layout
        for name, shape, batch, seq, remat, layout in _RUNS
        if name == suite
    ]
    for suite in ("cpu", "h200x1", "h200x2")
}
SHAPES = CPU_SHAPES | GPU_SHAPES


def devices_of(config: dict[str, Any]) -> int:
    """Devices a configuration uses (dp x fsdp x tp per stage, times pp)."""
    per_stage = config.get("dp", 1) * config.get("fsdp", 1) * config.get("tp", 1)
    return per_stage * config.get("pp", 1)


# ---------------------------------------------------------------- child: one measured run


def model_of(config: dict[str, Any]) -> ModelConfig:
    """The model shape of a configuration: a name of :data:`SHAPES` or the shape's fields."""
    shape = config["shape"]
    if isinstance(shape, dict):
        return ModelConfig("custom", **shape)
    d, layers, heads, kv_heads, ffn, vocab = SHAPES[shape]
    return ModelConfig(shape, vocab, d, layers, heads, kv_heads, ffn)


# Options of a configuration that are not titan train options.
NOT_OPTIONS = ("shape", "suite", "devices")


def measure(config: dict[str, Any], steps: int, warmup: int, emit: Any) -> dict[str, Any]:
    """Run one configuration in this process (JAX imported here) and return its measurements;
    ``emit`` gets the compiled program's memory analysis as soon as it is known, so that a run
    that then runs out of memory still reports it."""
    import jax
    import numpy as np

    from titan.config import TrainConfig
    from titan.layouts.builders import build_run_trainer
    from titan.ops import Ops

    model = model_of(config)
    options = {k: v for k, v in config.items() if k not in NOT_OPTIONS}
    cfg = TrainConfig.of(**options, steps=steps, warmup_steps=1)
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    trainer = build_run_trainer(model, ops, cfg.trainer)
    start = time.perf_counter()
    trainer.trace()
    trainer.compile()
    device = jax.devices()[0]
    compiled = {
        "compile_s": time.perf_counter() - start,
        "compiled_memory": _compiled_memory(trainer),
        "device_kind": device.device_kind,
        "backend": jax.default_backend(),
        "ops": ops.served,
        "compute_dtype": str(trainer.compute_dtype),
        "bytes_limit": (device.memory_stats() or {}).get("bytes_limit"),
    }
    emit(compiled)
    state = trainer.init_state(0)
    matmul_before = matmul_flops_per_s()
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(
            0, model.vocab_size, (cfg.data.batch_size, cfg.data.seq_len + 1), dtype=np.int32
        ),
        "segment_ids": np.zeros((cfg.data.batch_size, cfg.data.seq_len), np.int32),
    }
    times, pending, last = [], None, time.perf_counter()
    for _ in range(steps):
        state, metrics = trainer.step(state, batch)
        if pending is not None:
            jax.block_until_ready(pending)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        pending = metrics
    jax.block_until_ready(pending)
    times.append(time.perf_counter() - last)
    return compiled | {
        "step_s": statistics.median(times[warmup:]),
        "step_times_s": times,
        "matmul_flops_per_s": (matmul_before + matmul_flops_per_s()) / 2,
        "peak_bytes": _peak_bytes(trainer),
    }


def matmul_flops_per_s(n: int = 1024, reps: int = 5) -> float:
    """FLOP/s of a jitted n^3 matmul in the compute dtype on the first device, now: on a shared
    CPU host this follows the load other processes put on it."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    a = jnp.ones((n, n), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(reps):
        out = matmul(a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - start)


def _compiled_memory(trainer: Any) -> dict[str, float] | None:
    """XLA's buffer assignment of the compiled SPMD step (``memory_analysis()``), bytes, with
    ``peak`` = arguments + outputs - aliased + temporaries; None for MPMD (one program per
    action). The trainer has no public handle on its compiled step, hence the private field."""
    compiled = getattr(trainer, "_compiled", None)
    if compiled is None:
        return None
    m = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    out = {name: float(getattr(m, f"{name}_size_in_bytes")) for name in fields}
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def _peak_bytes(trainer: Any) -> float | None:
    """``peak_bytes_in_use`` of the devices (the largest), or on CPU, where the runtime keeps
    no such statistic, the compiled program's peak (:func:`_compiled_memory`)."""
    import jax

    stats = [d.memory_stats() for d in jax.local_devices()]
    if all(stats):
        return float(max(s["peak_bytes_in_use"] for s in stats))
    compiled = _compiled_memory(trainer)
    return None if compiled is None else compiled["peak"]


# Words of XLA's out-of-memory errors (RESOURCE_EXHAUSTED on every backend).
OOM_WORDS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def child_main(config: dict[str, Any], steps: int, warmup: int) -> None:
    """Print the measurements as JSON lines: the compiled program's first, then the run's, or
    the one-line error (``oom`` when the device ran out of memory)."""

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    try:
        emit(measure(config, steps, warmup, emit))
    except Exception as err:  # noqa: BLE001 - any failure of one run is that run's record
        text = f"{type(err).__name__}: {err}"
        emit({"error": text.splitlines()[0][:300], "oom": any(w in text for w in OOM_WORDS)})


# ---------------------------------------------------------------- parent: predict and compare


def run_child(config: dict[str, Any], steps: int, warmup: int, timeout_s: int) -> dict[str, Any]:
    """Measure ``config`` in a fresh process (fresh device memory statistics), merging the JSON
    lines it printed (those before a crash or a timeout too)."""
    env = dict(os.environ)
    if config["suite"] == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_of(config)}"
    run = {k: v for k, v in config.items() if k != "suite"}
    argv = [sys.executable, __file__, "--child", json.dumps(run)]
    argv += ["--steps", str(steps), "--warmup", str(warmup)]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=timeout_s)
        failure = None
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        failure = f"timed out after {timeout_s} s"
    record: dict[str, Any] = {}
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("{"):
            record |= json.loads(line)
    if failure or (child.returncode and "error" not in record):
        tail = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        record["error"] = failure or tail[:300]
        record.setdefault("oom", any(w in tail for w in OOM_WORDS))
    return record


def planner_inputs(config: dict[str, Any], measured: dict[str, Any]) -> Measurement:
    """A measured run as the planner sees it (``titan.planning.step.Measurement``; ``step_s``
    is NaN for a run that did not step)."""
    layout = Layout(
        dp=config["dp"],
        fsdp=config.get("fsdp", 1),
        tp=config.get("tp", 1),
        pp=config.get("pp", 1),
        microbatches=config.get("microbatches", 1),
        schedule=config.get("schedule", "1f1b"),
        remat=config["remat"],
    )
    gpu = gpu_for_device_kind(measured["device_kind"])
    if gpu is None:
        raise SystemExit(f"device kind {measured['device_kind']!r} is not in the GPU catalog")
    if gpu.name == "cpu":
        shared = devices_of(config)
        gpu = dataclasses.replace(
            gpu,
            bf16_flops=measured["matmul_flops_per_s"] / shared,
            hbm_bytes_per_s=gpu.hbm_bytes_per_s / shared,
        )
    precision = Precision.of_providers(
        config.get("param_dtype", "float32"), measured["compute_dtype"], measured["ops"]
    )
    return Measurement(
        model=model_of(config),
        layout=layout,
        gpu=gpu,
        gpus_per_node=devices_of(config),
        seq_len=config["seq_len"],
        batch_sequences=config["batch_size"],
        precision=precision,
        step_s=measured.get("step_s", math.nan),
    )


def _pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted / measured - 1.0)


def evaluate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Calibrate one fraction per GPU on all successful runs, then fill in each run's predictions
    and errors, also with the run left out of its GPU's fit. Returns the calibration and the
    per-GPU summary."""
    done = [row for row in rows if "error" not in row["measured"]]
    runs = [planner_inputs(row["config"], row["measured"]) for row in done]
    calibration = calibrate(runs)
    for row, run in zip(done, runs, strict=True):
        others = [r for r in runs if r is not run and r.gpu.name == run.gpu.name]
        loo_eta = calibrate(others).get(run.gpu.name, calibration[run.gpu.name])
        peak = memory_per_device(
            run.model, run.layout, run.gpu, run.seq_len, run.batch_sequences, run.precision
        ).total
        step_s, loo_s = run.predict_s(calibration[run.gpu.name]), run.predict_s(loo_eta)
        measured = row["measured"]
        row["predicted"] = {"step_s": step_s, "peak_bytes": peak, "loo_step_s": loo_s}
        row["error_pct"] = {
            "step": _pct(step_s, run.step_s),
            "loo_step": _pct(loo_s, run.step_s),
            "memory": _pct(peak, measured["peak_bytes"]) if measured["peak_bytes"] else None,
        }
    summary = {
        name: _summary(
            [row for row, run in zip(done, runs, strict=True) if run.gpu.name == name], eta
        )
        for name, eta in calibration.items()
    }
    return {"calibration": calibration, "summary": summary}


def _summary(group: list[dict[str, Any]], eta: float) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(group), "achievable_fraction": eta}
    for key in ("step", "loo_step", "memory"):
        errors = [abs(r["error_pct"][key]) for r in group if r["error_pct"][key] is not None]
        if errors:
            out[f"{key}_mean_abs_pct"] = statistics.fmean(errors)
            out[f"{key}_worst_abs_pct"] = max(errors)
    return out


def _label(config: dict[str, Any]) -> str:
    layout = [f"{k}{config[k]}" for k in ("dp", "fsdp", "tp", "pp") if config.get(k, 1) > 1]
    if config.get("layout") == "mpmd":
        layout += [config.get("schedule", "1f1b"), f"m{config['microbatches']}"]
    elif config.get("microbatches", 1) > 1:
        layout.append(f"m{config['microbatches']}")
    model = model_of(config)
    words = [f"{model.param_count() / 1e9:.2f}B" if model.name == "custom" else model.name]
    words += [f"b{config['batch_size']}", f"s{config['seq_len']}", config["remat"]]
    if "param_dtype" in config:
        ops = config.get("ops", {})
        words += [config["param_dtype"][:4], config["attention_mask"][:3]]
        words += [f"{op[:4]}={name}" for op, name in ops.items()]
    return " ".join(words + (layout or ["1 device"]))


def markdown(rows: list[dict[str, Any]], report: dict[str, Any]) -> str:
    """The accuracy table and per-kind summary, as markdown."""
    lines = [
        "| suite | configuration | step s measured | predicted | error | leave-one-out "
        "| peak GB measured | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m = row["measured"]
        if "error" in m:
            lines.append(
                f"| {row['config']['suite']} | {_label(row['config'])} | failed: "
                f"{m['error'][:80]} | | | | | | |"
            )
            continue
        p, e = row["predicted"], row["error_pct"]
        memory = ("-", "-", "-")
        if m["peak_bytes"]:
            memory = (
                f"{m['peak_bytes'] / 1e9:.3f}",
                f"{p['peak_bytes'] / 1e9:.3f}",
                f"{e['memory']:+.1f}%",
            )
        lines.append(
            f"| {row['config']['suite']} | {_label(row['config'])} | {m['step_s']:.4f} "
            f"| {p['step_s']:.4f} | {e['step']:+.1f}% | {e['loo_step']:+.1f}% | "
            + " | ".join(memory)
            + " |"
        )
    lines.append("")
    for name, s in report["summary"].items():
        lines.append(
            f"- {name}: {s['runs']} runs, achievable fraction {s['achievable_fraction']:.3f};"
            f" step time mean |error| {s['step_mean_abs_pct']:.1f}% (worst "
            f"{s['step_worst_abs_pct']:.1f}%), leave-one-out {s['loo_step_mean_abs_pct']:.1f}% "
            f"(worst {s['loo_step_worst_abs_pct']:.1f}%)"
            + (
                f"; peak memory mean |error| {s['memory_mean_abs_pct']:.1f}% (worst "
                f"{s['memory_worst_abs_pct']:.1f}%)"
                if "memory_mean_abs_pct" in s
                else ""
            )
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- draws: fit on half, score


def _errors(values: list[float]) -> dict[str, Any]:
    """Mean and worst absolute percentage error of signed percentage errors."""
    if not values:
        return {"n": 0}
    absolute = [abs(v) for v in values]
    return {
        "n": len(values),
        "mean_abs_pct": statistics.fmean(absolute),
        "worst_abs_pct": max(absolute),
    }


def _draw_rows(draw: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured configurations of one draw, in index order, with their planner inputs and
    the compiled programs' peak (bytes; also for runs that then ran out of memory)."""
    rows = []
    for index in sorted(int(i) for i in draw["runs"]):
        config, measured = draw["configs"][index], draw["runs"][str(index)]
        if not measured.get("compiled_memory"):
            continue
        config = {"suite": f"draw{draw['seed']}", **config}
        run = planner_inputs(config, measured)
        memory = memory_per_device(
            run.model, run.layout, run.gpu, run.seq_len, run.batch_sequences, run.precision
        )
        rows.append(
            {
                "index": index,
                "label": _label(config),
                "run": run,
                "memory": memory,
                "peak_bytes": measured["compiled_memory"]["peak"],
                "bytes_limit": measured.get("bytes_limit"),
                "oom": bool(measured.get("oom")),
            }
        )
    return rows


def _step_parts(run: Measurement) -> tuple[float, float, float]:
    """Seconds of a one-GPU step per unit of 1 / (matmul fraction of peak), 1 / (attention
    fraction of peak) and 1 / (fraction of HBM bandwidth): on one GPU the planner's step time
    is their sum, weighted (``titan.planning.step.estimate_step``: no communication, no
    bubble)."""
    step = estimate_step(
        run.model,
        run.layout,
        Cluster(run.gpu, 1, {run.gpu.name: 1.0}),
        run.seq_len,
        run.batch_sequences,
        run.precision,
    )
    peak, bandwidth = run.gpu.bf16_flops, run.gpu.hbm_bytes_per_s
    matmul = step.device_flops - step.attention_flops
    return matmul / peak, step.attention_flops / peak, step.memory_bytes / bandwidth


def fit_step_constants(runs: list[Measurement]) -> dict[str, float]:
    """The matmul and attention fractions of peak and the fraction of HBM bandwidth that fit
    ``runs`` best (least squares of the relative error; the planner's
    ``DEFAULT_ACHIEVABLE_FRACTION``, ``ATTENTION_EFFICIENCY`` x it and ``MEMORY_EFFICIENCY``)."""
    import numpy as np

    parts = np.array([_step_parts(run) for run in runs])
    measured = np.array([run.step_s for run in runs])
    inverse = np.linalg.lstsq(parts / measured[:, None], np.ones(len(runs)), rcond=None)[0]
    matmul, attention, memory = (1 / inverse).tolist()
    return {"matmul": matmul, "attention": attention, "memory": memory}


def predict_step_s(run: Measurement, constants: dict[str, float]) -> float:
    """One-GPU step time with ``constants`` (:func:`fit_step_constants`)."""
    matmul, attention, memory = _step_parts(run)
    return (
        matmul / constants["matmul"]
        + attention / constants["attention"]
        + memory / constants["memory"]
    )


def _score(rows: list[dict[str, Any]], constants: dict[str, float]) -> dict[str, Any]:
    """Errors of ``rows`` with step ``constants``: step time (runs that stepped) and peak
    memory (every compiled program), per row and summarised."""
    step, memory = [], []
    for row in rows:
        run = row["run"]
        row["memory_error_pct"] = _pct(row["memory"].total, row["peak_bytes"])
        memory.append(row["memory_error_pct"])
        if not math.isnan(run.step_s):
            row["step_error_pct"] = _pct(predict_step_s(run, constants), run.step_s)
            step.append(row["step_error_pct"])
    return {"step": _errors(step), "memory": _errors(memory)}


def _false_fits(rows: list[dict[str, Any]]) -> list[int]:
    """Indices the planner calls a fit (margin included) that ran out of memory or whose
    compiled peak exceeds the device's pool."""
    return [
        row["index"]
        for row in rows
        if row["memory"].fits
        and (row["oom"] or (row["bytes_limit"] and row["peak_bytes"] > row["bytes_limit"]))
    ]


def evaluate_draw(draw: dict[str, Any]) -> dict[str, Any]:
    """Fit the achievable fraction on a random half of a draw (``planner_space.split`` with
    the draw's seed), score both halves, and leave-one-out over the whole draw; the memory
    model has no fitted constant, and the margin its verdict needs is the largest
    under-prediction on the fitting half."""
    rows = _draw_rows(draw)
    fit_at, score_at = planner_space.split(len(rows), draw["seed"])
    fit, held = [rows[i] for i in fit_at], [rows[i] for i in score_at]
    fit_indices = {row["index"] for row in fit}
    timed = [row for row in rows if not math.isnan(row["run"].step_s)]

    def constants_of(group: list[dict[str, Any]]) -> dict[str, float]:
        return fit_step_constants([r["run"] for r in group if not math.isnan(r["run"].step_s)])

    constants = constants_of(fit)
    loo = []
    for row in timed:
        others = constants_of([r for r in timed if r is not row])
        loo.append(_pct(predict_step_s(row["run"], others), row["run"].step_s))
    fit_score, held_score = _score(fit, constants), _score(held, constants)
    under = [-min(row["memory_error_pct"], 0.0) / 100 for row in fit]
    margin = max(1 / (1 - u) - 1 for u in under)
    return {
        "seed": draw["seed"],
        "configurations": len(rows),
        "fit_indices": sorted(fit_indices),
        "step_constants": constants,
        "fit": fit_score,
        "held_out": held_score,
        "leave_one_out_step": _errors(loo),
        "margin_needed": margin,
        "false_fits": _false_fits(rows),
        "rows": [_row_record(row, constants, row["index"] in fit_indices) for row in rows],
    }


def _row_record(row: dict[str, Any], constants: dict[str, float], fitted: bool) -> dict[str, Any]:
    """One configuration of a draw as the evaluation file keeps it (seconds, GB)."""
    run = row["run"]
    stepped = not math.isnan(run.step_s)
    return {
        "index": row["index"],
        "half": "fit" if fitted else "held out",
        "label": row["label"],
        "oom": row["oom"],
        "step_s": run.step_s if stepped else None,
        "predicted_step_s": predict_step_s(run, constants),
        "step_error_pct": row.get("step_error_pct"),
        "peak_gb": row["peak_bytes"] / 1e9,
        "predicted_gb": row["memory"].total / 1e9,
        "memory_error_pct": row["memory_error_pct"],
        "fits": row["memory"].fits,
    }


def evaluate_draws(stored: dict[str, Any]) -> dict[str, Any]:
    """Each draw fitted and scored on its own halves (:func:`evaluate_draw`), every other draw
    also scored whole with the first draw's fitted fraction, and the spread between draws'
    held-out figures."""
    draws = [evaluate_draw(stored[key]) for key in sorted(stored, key=int)]
    first = draws[0]
    for key, report in zip(sorted(stored, key=int)[1:], draws[1:], strict=True):
        rows = _draw_rows(stored[key])
        report["with_first_draw_fit"] = _score(rows, first["step_constants"])
    spread = {
        kind: max(d["held_out"][kind].get("mean_abs_pct", 0) for d in draws)
        - min(d["held_out"][kind].get("mean_abs_pct", 0) for d in draws)
        for kind in ("step", "memory")
    }
    return {"draws": draws, "held_out_spread_pct": spread}


def draws_markdown(report: dict[str, Any]) -> str:
    """The figures of :func:`evaluate_draws` as a markdown table."""
    lines = [
        "| draw (seed) | configs | half | step time mean / worst | peak memory mean / worst |",
        "|---|---|---|---|---|",
    ]

    def cell(errors: dict[str, Any]) -> str:
        if not errors.get("n"):
            return "-"
        return f"{errors['mean_abs_pct']:.1f}% / {errors['worst_abs_pct']:.1f}% (n={errors['n']})"

    for d in report["draws"]:
        halves = [("fit", d["fit"]), ("held out", d["held_out"])]
        if "with_first_draw_fit" in d:
            halves.append(("all, draw 1's fit", d["with_first_draw_fit"]))
        for name, score in halves:
            lines.append(
                f"| {d['seed']} | {d['configurations']} | {name} | {cell(score['step'])} | "
                f"{cell(score['memory'])} |"
            )
        loo = d["leave_one_out_step"]
        lines.append(f"| {d['seed']} | {d['configurations']} | leave-one-out | {cell(loo)} | - |")
    for d in report["draws"]:
        lines.append(
            f"- draw {d['seed']}: fitted on its fit half: matmul "
            f"{d['step_constants']['matmul']:.3f} and attention "
            f"{d['step_constants']['attention']:.3f} of peak, "
            f"{d['step_constants']['memory']:.3f} of HBM bandwidth; margin needed on its fit half "
            f"{d['margin_needed']:.1%}; false fits {d['false_fits'] or 'none'}"
        )
    spread = report["held_out_spread_pct"]
    lines.append(
        f"- held-out spread between draws: step time {spread['step']:.1f} points, peak memory "
        f"{spread['memory']:.1f} points"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", choices=tuple(SUITES), help="default: cpu")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="step times left out")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument(
        "--no-run", action="store_true", help="re-evaluate the stored runs of --out, run nothing"
    )
    parser.add_argument(
        "--draw",
        type=int,
        help="measure the draw of bench/planner_space.py with this seed (results: --draws)",
    )
    parser.add_argument("--count", type=int, default=36, help="configurations of --draw")
    parser.add_argument("--first", type=int, default=0, help="first index of --draw to run")
    parser.add_argument("--budget-s", type=float, default=540, help="--draw: start no run after")
    parser.add_argument("--draws", type=Path, default=DRAWS, help="JSON results of --draw")
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="fit and score the measured draws of --draws (no run); report beside it",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(json.loads(args.child), args.steps, args.warmup)
        return
    if args.draw is not None:
        run_draw(args)
        return
    if args.evaluate:
        stored = json.loads(args.draws.read_text())
        report = evaluate_draws(stored)
        stored_report = args.draws.with_name("planner_draws_evaluation.json")
        stored_report.write_text(json.dumps(report, indent=1) + "\n")
        print(draws_markdown(report))
        return
    suites = [] if args.no_run else args.suite or ["cpu"]
    previous = json.loads(args.out.read_text()).get("runs", []) if args.out.exists() else []
    rows = [r for r in previous if r["config"]["suite"] not in suites]
    for suite in suites:
        for config in SUITES[suite]:
            config = {"suite": suite, **config}
            print(f"running {suite}: {_label(config)}", file=sys.stderr, flush=True)
            measured = run_child(config, args.steps, args.warmup, args.timeout)
            rows.append({"config": config, "measured": measured})
    report = evaluate(rows)
    stored = dict.fromkeys(row["config"]["suite"] for row in rows)
    command = "python bench/planner_accuracy.py " + " ".join(f"--suite {s}" for s in stored)
    result = {"command": command, "time": time.time(), **report, "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(rows, report))


def run_draw(args: argparse.Namespace) -> None:
    """Measure the configurations ``--first``.. of draw ``--draw`` until ``--budget-s`` has
    passed, merging them into ``--draws`` by (seed, index); each is written as soon as it is
    measured."""
    start = time.perf_counter()
    stored = json.loads(args.draws.read_text()) if args.draws.exists() else {}
    draw = stored.setdefault(str(args.draw), {"seed": args.draw, "runs": {}, "commands": []})
    configs = planner_space.draw(args.draw, args.count)
    draw["configs"] = configs
    draw.setdefault("commands", []).append(
        "python bench/planner_accuracy.py " + " ".join(sys.argv[1:])
    )
    for index in range(args.first, args.count):
        if time.perf_counter() - start > args.budget_s:
            print(f"budget spent: stopped before index {index}", file=sys.stderr, flush=True)
            break
        config = {"suite": f"draw{args.draw}", **configs[index]}
        began = time.perf_counter()
        measured = run_child(config, args.steps, args.warmup, args.timeout)
        measured["wall_s"] = time.perf_counter() - began
        draw["runs"][str(index)] = measured
        args.draws.parent.mkdir(parents=True, exist_ok=True)
        args.draws.write_text(json.dumps(stored, indent=1) + "\n")
        what = measured.get("error", f"{measured.get('step_s', 0):.3f} s/step")
        print(
            f"{index} {_label(config)}: {what} ({measured['wall_s']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    main()
