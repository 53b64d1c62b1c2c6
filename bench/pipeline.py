"""Benchmark: MPMD pipeline schedules against SPMD data parallelism on the same devices.

``python bench/pipeline.py`` (on a machine with 2 GPUs) runs, each in its own process so that
peak memory and compile caches are per configuration:

- SPMD with dp = all devices (the baseline of this run),
- pp = 2 with ``1f1b``, ``interleaved-1f1b`` (2 virtual stages) and ``zero-bubble`` at each
  ``--microbatches`` value,

on the same model, global batch and sequence length, with random tokens (throughput does not
depend on the text). Per configuration it reports tokens/s, MFU under both attention
conventions (:func:`titan.flops.model_flops_per_token`; the dense BF16 peak of the
device from :mod:`titan.gpus`, times the device count), the ratio to SPMD, peak memory
per device, the controller's dispatch time as a share of the step, and the measured bubble
fraction next to the theoretical one.

Measured bubble: one extra step runs with a block after each action, which times every action
without overlap; for each device group, bubble = 1 - (sum of its action times) / (step time of
the normal steps minus the group's optimizer-update time), averaged over groups.

Results go to ``bench/results/pipeline-<device>.json`` and a Markdown table to stdout.
``--smoke`` runs a tiny model on CPU (8 forced devices) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _configs(args: argparse.Namespace) -> list[dict]:
    configs = [
        {"layout": "spmd", "pp": 1, "microbatches": 1, "schedule": "1f1b", "virtual_stages": 1}
    ]
    for schedule in args.schedules:
        for m in args.microbatches:
            v = 2 if schedule == "interleaved-1f1b" else 1
            configs.append(
                {
                    "layout": "mpmd",
                    "pp": 2,
                    "microbatches": m,
                    "schedule": schedule,
                    "virtual_stages": v,
                }
            )
    return configs


def _measure(spec: dict) -> dict:
    """Run one configuration in this process and return its figures."""
    import dataclasses

    import jax
    import numpy as np

    from titan.config import TrainConfig
    from titan.flops import model_flops_per_token
    from titan.gpus import gpu_for_device_kind
    from titan.layouts.builders import build_run_trainer
    from titan.ops import Ops
    from titan.shapes import PRESETS

    model = dataclasses.replace(PRESETS[spec["preset"]], n_layers=spec["layers"])
    if spec["preset"] == "tiny":
        model = dataclasses.replace(model, vocab_size=512)
    steps, warmup = spec["steps"], spec["warmup"]
    cfg = TrainConfig.of(
        preset=spec["preset"],
        batch_size=spec["batch_size"],
        seq_len=spec["seq_len"],
        layout=spec["layout"],
        pp=spec["pp"],
        microbatches=spec["microbatches"],
        schedule=spec["schedule"],
        virtual_stages=spec["virtual_stages"],
        remat=spec["remat"],
        stage_layers=spec["stage_layers"],
        dp=0 if spec["layout"] == "spmd" else 1,
        timing_every=warmup + steps + 1,
        steps=10_000,
    )
    ops = Ops(jax.default_backend())
    trainer = build_run_trainer(model, ops, cfg.trainer)
    state = trainer.init_state(0)
    trainer.trace()
    compile_s = sum(e.seconds for e in trainer.compile())
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(
            0, model.vocab_size, (cfg.data.batch_size, cfg.data.seq_len + 1), dtype=np.int32
        ),
        "segment_ids": np.zeros((cfg.data.batch_size, cfg.data.seq_len), np.int32),
    }
    dispatch = []
    for i in range(warmup + steps):
        if i == warmup:
            jax.block_until_ready(state)
            start = time.perf_counter()
        state, metrics = trainer.step(state, batch)
        dispatch.append(trainer.step_fields().get("dispatch_s", 0.0))
    jax.block_until_ready((state, metrics))
    step_s = (time.perf_counter() - start) / steps
    result = {
        **spec,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": cfg.data.batch_size * cfg.data.seq_len / step_s,
        "loss": float(metrics["loss"]),
        "ops": ops.served,
        "dispatch_share": statistics.median(dispatch[warmup:]) / step_s,
    }
    if spec["layout"] == "mpmd":
        state, _ = trainer.step(state, batch)
        (timing_event,) = trainer.drain_events()
        timing = timing_event.to_json()
        result.update(_bubble(timing, step_s, spec["pp"]))
        from titan.schedules import build_schedule, simulate, theoretical_bubble

        schedule = build_schedule(
            spec["schedule"], spec["pp"], spec["microbatches"], spec["virtual_stages"]
        )
        durations = {(c, i, k): end - start for _, c, i, k, start, end in timing["actions"]}
        ideal_s = simulate(schedule, durations) + result["update_s"] * spec["pp"]
        result["ideal_step_s"] = ideal_s
        result["controller_overhead"] = 1 - ideal_s / step_s
        result["timing"] = timing

        result["theoretical_bubble"] = theoretical_bubble(
            spec["schedule"], spec["pp"], spec["microbatches"], spec["virtual_stages"]
        )
    devices = jax.local_devices()
    result["device_kind"] = devices[0].device_kind
    result["devices"] = len(devices) if spec["layout"] == "spmd" else spec["pp"]
    stats = [d.memory_stats() or {} for d in devices[: result["devices"]]]
    peaks = [s.get("peak_bytes_in_use") for s in stats]
    result["peak_gib"] = [p / 2**30 for p in peaks] if all(peaks) else None
    gpu = gpu_for_device_kind(devices[0].device_kind)
    for convention in ("causal", "full"):
        flops = model_flops_per_token(model, cfg.data.seq_len, convention)
        result[f"mfu_{convention}"] = (
            flops * result["tokens_per_s"] / (gpu.bf16_flops * result["devices"])
            if gpu is not None and gpu.name != "cpu"
            else None
        )
    result["peak_flops_per_device"] = gpu.bf16_flops if gpu else None
    return result


def _bubble(timing: dict, step_s: float, pp: int) -> dict:
    busy = [0.0] * pp
    last_end = 0.0
    for group, _chunk, _mb, _kind, start, end in timing["actions"]:
        busy[group] += end - start
        last_end = max(last_end, end)
    update_s = (timing["step_time_s"] - last_end) / pp
    bubbles = [1 - b / (step_s - update_s) for b in busy]
    return {
        "measured_bubble": statistics.mean(bubbles),
        "bubble_per_stage": bubbles,
        "update_s": update_s,
    }


def _table(results: list[dict]) -> str:
    spmd = next((r for r in results if r["layout"] == "spmd" and "error" not in r), None)
    lines = [
        "| layout | schedule | M | stage layers | tokens/s | vs SPMD | MFU causal | MFU full | "
        "bubble measured (per stage) | bubble theory | controller overhead | peak GiB per device |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(
                f"| {r['layout']} | {r['schedule']} | {r['microbatches']} | | failed: "
                f"{r['error'][-120:]} | | | | | | | |"
            )
            continue
        ratio = r["tokens_per_s"] / spmd["tokens_per_s"] if spmd else float("nan")
        mfu = [f"{r[k]:.1%}" if r[k] is not None else "unknown" for k in ("mfu_causal", "mfu_full")]
        bubble = [
            f"{r[k]:.1%}" if k in r else "-" for k in ("measured_bubble", "theoretical_bubble")
        ]
        if "bubble_per_stage" in r:
            bubble[0] += " (" + ", ".join(f"{b:.0%}" for b in r["bubble_per_stage"]) + ")"
        overhead = f"{r['controller_overhead']:.1%}" if "controller_overhead" in r else "-"
        schedule = r["schedule"] if r["layout"] == "mpmd" else f"dp={r['devices']}"
        peaks = ", ".join(f"{p:.1f}" for p in r["peak_gib"]) if r["peak_gib"] else "n/a"
        lines.append(
            f"| {r['layout']} | {schedule} | {r['microbatches']} | {r['stage_layers'] or 'even'} | "
            f"{r['tokens_per_s']:,.0f} | {ratio:.2f} | {mfu[0]} | {mfu[1]} | {bubble[0]} | "
            f"{bubble[1]} | {overhead} | {peaks} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-1b", help="model preset")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--batch-size", type=int, default=16, help="global batch (sequences)")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument(
        "--schedules", nargs="+", default=["1f1b", "interleaved-1f1b", "zero-bubble"]
    )
    parser.add_argument(
        "--stage-layers",
        default="",
        help="layers per stage for pp schedules, e.g. 10,6 (default: even)",
    )
    parser.add_argument(
        "--interleaved-stage-layers",
        default="",
        help="layers per chunk for interleaved-1f1b, e.g. 5,3,5,3",
    )
    parser.add_argument("--remat", default="dots", help="remat policy (none, dots, full)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    parser.add_argument("--smoke", action="store_true", help="tiny model on 8 CPU devices")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(_measure(json.loads(args.one))), flush=True)
        return
    env = dict(os.environ)
    if args.smoke:
        args.preset, args.layers, args.seq_len, args.batch_size = "tiny", 4, 32, 8
        args.microbatches, args.steps, args.warmup = [4], 2, 1
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        env["JAX_PLATFORMS"] = "cpu"
    results = []
    for config in _configs(args):
        layers = (
            args.interleaved_stage_layers if config["virtual_stages"] > 1 else args.stage_layers
        )
        spec = {
            **config,
            "stage_layers": layers if config["layout"] == "mpmd" else "",
            "preset": args.preset,
            "layers": args.layers,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "remat": args.remat,
            "steps": args.steps,
            "warmup": args.warmup,
        }
        try:
            out = subprocess.run(
                [sys.executable, __file__, "--one", json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=args.timeout,
                env=env,
            )
            lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if lines:
                results.append(json.loads(lines[-1][len("RESULT ") :]))
            else:
                tail = out.stderr.strip().splitlines()[-6:] or ["?"]
                results.append({**spec, "error": " / ".join(tail)})
        except subprocess.TimeoutExpired:
            results.append({**spec, "error": f"timeout after {args.timeout} s"})
        print(json.dumps(results[-1]), flush=True)
    kind = next((r["device_kind"] for r in results if "device_kind" in r), "unknown")
    out_path = args.out or RESULTS / f"pipeline-{kind.replace(' ', '_').lower()}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps(
            {
                "command": shlex.join(["python", "bench/pipeline.py", *sys.argv[1:]]),
                "args": {k: v for k, v in vars(args).items() if k != "out"},
                "results": results,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(_table(results))


if __name__ == "__main__":
    main()
