"""A MaxText llama against Titan's Llama of the same shape, in one run, on one GPU.

Both are trained by ``titan train`` for ``--steps`` steps on the same data, batch and options
(cuDNN attention, ``--remat dots-attention``, causal mask, bfloat16 compute); the result is the
median tokens/s and MFU (Titan's FLOPs-per-token model, 6 N + attention, against the device's
dense BF16 peak) of the steps after ``--skip``, with the providers each run recorded.

    python bench/maxtext.py --out bench/results/maxtext-nvidia-h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPE = {  # 0.886B: the shape of docs/benchmarks.md's train-step table
    "d_model": 2048,
    "n_layers": 16,
    "n_heads": 16,
    "n_kv_heads": 8,
    "ffn_dim": 5632,
    "vocab_size": 32000,
}
MAXTEXT_SET = [
    f"base_emb_dim={SHAPE['d_model']}",
    f"base_num_decoder_layers={SHAPE['n_layers']}",
    f"base_num_query_heads={SHAPE['n_heads']}",
    f"base_num_kv_heads={SHAPE['n_kv_heads']}",
    f"base_mlp_dim={SHAPE['ffn_dim']}",
    f"head_dim={SHAPE['d_model'] // SHAPE['n_heads']}",
    f"vocab_size={SHAPE['vocab_size']}",
    "attention=cudnn_flash_jax",
]
COMMON = ["--seq-len", "2048", "--batch-size", "8", "--remat", "dots-attention"]
COMMON += ["--attention-mask", "causal", "--warmup-steps", "2", "--checkpoint-every", "1000"]


def _run(name: str, args: list[str], runs_root: Path, data: str, steps: int) -> Path:
    command = [sys.executable, "-m", "titan.cli", "train", "--runs-root", str(runs_root)]
    command += ["--run-id", name, "--data", data, "--steps", str(steps), *COMMON, *args]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return runs_root / name


def _summary(run_dir: Path, skip: int) -> dict:
    lines = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    start = next(e for e in lines if e["type"] == "run_start")
    steps = [e for e in lines if e["type"] == "step"][skip:]
    mfu = [e["mfu"] for e in steps if e.get("mfu")]
    return {
        "model_source": start["model_source"],
        "ops": start["ops"],
        "param_count": start["param_count"],
        "steps": len(steps),
        "tokens_per_s": statistics.median(e["tokens_per_s"] for e in steps),
        "mfu": {k: statistics.median(m[k] for m in mfu) for k in mfu[0]} if mfu else None,
        "loss_last": steps[-1]["loss"],
        "compile_s": sum(e["seconds"] for e in lines if e["type"] == "compile"),
        "env": {k: start["env"].get(k) for k in ("jax", "devices", "device_kind") if start["env"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", default="stdlib")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=4, help="steps left out of the medians")
    parser.add_argument("--runs-root", default="/tmp/titan-bench-maxtext")
    args = parser.parse_args()
    root = Path(args.runs_root)
    shape = ",".join(f"{k}={v}" for k, v in SHAPE.items())
    runs = {
        "maxtext": _run(
            "maxtext",
            ["--model-source", "maxtext", "--maxtext-model", "llama2-7b", "--maxtext-set"]
            + MAXTEXT_SET,
            root,
            args.data,
            args.steps,
        ),
        "titan": _run("titan", ["--model", shape], root, args.data, args.steps),
    }
    result = {
        "shape": SHAPE,
        "options": COMMON,
        "maxtext_set": MAXTEXT_SET,
        "runs": {name: _summary(path, args.skip) for name, path in runs.items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
