"""Benchmark: titan's DiT train step against a plain-JAX DiT step on one GPU, in images/s and MFU.

``python bench/dit.py`` runs, in one go, (a) the baseline ``bench/baselines/plain_jax_dit.py``
(a subprocess; its last JSON line is read) and (b) titan's train step
(``titan.layouts.builders.build_run_trainer`` with ``--task diffusion --preset dit-l-2``: the
458 M-parameter DiT-L/2 on the 32 x 32 x 4 latent of a 256 x 256 image, one-device mesh, fp32
master weights, bf16 compute, AdamW, the registry's providers) on the same batch of random
latents. MFU is images/s x the model's FLOPs per image (:func:`titan.flops.
dit_token_flops` x 256 patches) / the device's dense bf16 peak (:mod:`titan.gpus`); the
baseline counts its own (GELU MLP) FLOPs the same way.

Writes ``bench/results/dit-<device>.json`` (or ``--out``) and prints a Markdown row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from titan.config import TrainConfig  # noqa: E402
from titan.layouts.builders import build_run_trainer  # noqa: E402
from titan.ops import Ops  # noqa: E402
from titan.telemetry.mfu import device_peak  # noqa: E402
from titan.trainer.image_task import image_model_config  # noqa: E402

BASELINE = ROOT / "bench" / "baselines" / "plain_jax_dit.py"


def baseline(batch: int, steps: int) -> dict:
    env = {**os.environ, "B": str(batch), "STEPS": str(steps)}
    done = subprocess.run(
        [sys.executable, str(BASELINE)], env=env, capture_output=True, text=True, timeout=400
    )
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def titan(batch: int, steps: int, preset: str) -> dict:
    cfg = TrainConfig.of(task="diffusion", preset=preset, batch_size=batch, dp=1)
    model = image_model_config(cfg.model.shape, cfg.diffusion.image_size, 1000)
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    trainer = build_run_trainer(model, ops, cfg.trainer)
    state = trainer.init_state(0)
    compile_s = trainer.trace() + sum(e.seconds for e in trainer.compile())
    rng = np.random.default_rng(0)
    image = (batch, model.image_size, model.image_size, model.channels)
    data = {
        "noisy": rng.standard_normal(image, np.float32),
        "target": rng.standard_normal(image, np.float32),
        "t": (rng.random(batch) * 1000).astype(np.float32),
        "labels": (np.arange(batch) % 1000).astype(np.int32),
        "weight": np.ones(batch, np.float32),
    }
    state, metrics = trainer.step(state, data)
    jax.block_until_ready(metrics["loss"])
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = trainer.step(state, data)
    jax.block_until_ready(metrics["loss"])
    step_s = (time.perf_counter() - start) / steps
    model_flops, _ = trainer.adapter.token_flops()
    flops_per_image = model_flops["full"] * model.patches
    device = jax.devices()[0]
    peak = device_peak([device.device_kind], 1, str(trainer.compute_dtype))
    images_s = batch / step_s
    stats = device.memory_stats() or {}
    return {
        "preset": preset,
        "params": trainer.adapter.param_count(),
        "served": ops.served,
        "compile_s": compile_s,
        "step_s": step_s,
        "images_s": images_s,
        "flops_per_image": flops_per_image,
        "mfu": images_s * flops_per_image / peak.flops if peak.flops else None,
        "mfu_reason": peak.reason or None,
        "peak_mem_gb": stats.get("peak_bytes_in_use", 0) / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--preset", default="dit-l-2")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = jax.devices()[0].device_kind
    result = {
        "device_kind": device,
        "jax": jax.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "baseline": baseline(args.batch, args.steps),
        "titan": titan(args.batch, args.steps, args.preset),
    }
    slug = device.lower().replace(" ", "-")
    out = Path(args.out or ROOT / "bench" / "results" / f"dit-{slug}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    b, t = result["baseline"], result["titan"]
    print(json.dumps(result, indent=2))
    print(
        f"| {args.preset} B={args.batch} | baseline {b.get('images_s', 0):.0f} img/s, "
        f"MFU {b.get('mfu', 0):.3f} | titan {t['images_s']:.0f} img/s, MFU {t['mfu'] or 0:.3f} |"
    )


if __name__ == "__main__":
    main()
