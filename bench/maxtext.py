"""A MaxText llama against Titan's Llama of the same shape, in one run, on one GPU.

Both are trained by Titan's trainer (``titan.trainer.train.train``, what ``titan train`` runs),
each in its own process, for ``--steps`` steps on the same data (the stdlib corpus, a tokenizer of
4096 pieces, both embeddings 32000 rows), batch and options: batch 8 x 2048 tokens, a causal mask
over the sequence, ``--remat dots-attention`` (MaxText's ``minimal_with_context``), bfloat16
compute, float32 master weights, AdamW. MaxText's model is ``llama2-7b`` reshaped by
:data:`MAXTEXT_SET` to :data:`SHAPE` with MaxText's cuDNN attention (``cudnn_flash_jax``);
Titan's Llama has the same shape and its registry's providers (recorded as ``ops``).

Reported per model: the median tokens/s and MFU of the steps after ``--skip`` (Titan's step
records: MFU = tokens/s x model FLOPs per token / peak, FLOPs per token 6 N plus attention
12 L s d, full or halved for the causal mask; MaxText's N and FLOPs come from the adapter,
:meth:`titan.models.adapters.maxtext.MaxTextAdapter.token_flops`), the peak (the GPU catalog's
dense BF16 figure, :func:`titan.telemetry.mfu.device_peak`), compile seconds, the last
loss and the providers (Titan's ``ops``; MaxText's attention kernel and remat policy).

    python bench/maxtext.py --out bench/results/maxtext-nvidia-h200.json
    python bench/maxtext.py --smoke --out /tmp/maxtext-smoke.json   # tiny shapes, on CPU

Carrying MaxText's stack to a machine without a package index (the GPU machine, Python 3.12):
the wheels of ``bench/maxtext-wheels.txt`` (what building and training the model imports and
that machine lacks; ``pip download --no-deps --only-binary=:all: --python-version 3.12 -r``),
installed with ``pip install --no-deps --target``, and ``bench/stubs`` on ``PYTHONPATH``: a
stand-in for xprof (a 32 MB profiler wheel that tokamax imports at import time and training never
calls). Both runs' tokenizer and token cache are shared through ``TITAN_CACHE``; each run's final
checkpoint (10 GB at this size) is removed once its records are read, and a run dir left by an
earlier call is removed before its run. Should MaxText's run fail with ``cudnn_flash_jax``, it
is run again with its ``dot_product`` attention (run ``maxtext-dot_product``), so that the file
still compares the two models.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The repo root instead of this file's folder, where this file would hide the maxtext package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from titan.config import TrainConfig, validate_train_config  # noqa: E402
from titan.telemetry.mfu import device_peak  # noqa: E402
from titan.trainer.train import train  # noqa: E402

SHAPE = {  # 0.886B: the shape of docs/benchmarks.md's train-step table
    "d_model": 2048,
    "n_layers": 16,
    "n_heads": 16,
    "n_kv_heads": 8,
    "ffn_dim": 5632,
    "vocab_size": 32000,
}
SMOKE_SHAPE = {**SHAPE, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}
SMOKE_SHAPE["ffn_dim"], SMOKE_SHAPE["vocab_size"] = 128, 4096
KERNEL, FALLBACK = "cudnn_flash_jax", "dot_product"  # MaxText's attention on the GPU; the retry
COMMON = {
    "data": "stdlib",
    "vocab_size": 4096,  # the trained tokenizer's pieces; the embeddings have SHAPE's rows
    "seq_len": 2048,
    "batch_size": 8,
    "remat": "dots-attention",
    "attention_mask": "causal",
    "warmup_steps": 2,
    "checkpoint_every": 100_000,
}
SMOKE = {"seq_len": 32, "batch_size": 2}
FRACTIONS = ("causal", "full", "hfu_causal", "hfu_full")  # of a step record's mfu


def maxtext_set(shape: dict[str, int], attention: str) -> list[str]:
    """MaxText's ``llama2-7b`` settings that give ``shape``, with MaxText's ``attention``."""
    return [
        f"base_emb_dim={shape['d_model']}",
        f"base_num_decoder_layers={shape['n_layers']}",
        f"base_num_query_heads={shape['n_heads']}",
        f"base_num_kv_heads={shape['n_kv_heads']}",
        f"base_mlp_dim={shape['ffn_dim']}",
        f"head_dim={shape['d_model'] // shape['n_heads']}",
        f"vocab_size={shape['vocab_size']}",
        f"attention={attention}",
    ]


def options(name: str, smoke: bool, runs_root: str, steps: int) -> dict:
    """The trainer options of run ``name``: ``titan``, ``maxtext`` (MaxText's attention
    :data:`KERNEL`, or ``dot_product`` with ``smoke``: on CPU) or ``maxtext-<attention>``."""
    shape = SMOKE_SHAPE if smoke else SHAPE
    base = {**COMMON, **(SMOKE if smoke else {}), "steps": steps, "runs_root": runs_root}
    if name.startswith("maxtext"):
        attention = name.partition("-")[2] or (FALLBACK if smoke else KERNEL)
        model = {"model_source": "maxtext", "maxtext_model": "llama2-7b"}
        model["maxtext_set"] = " ".join(maxtext_set(shape, attention))
    else:
        model = {"preset": ",".join(f"{k}={v}" for k, v in shape.items())}
    return {**base, **model, "run_id": name}


def train_one(run_options: dict) -> int:
    """Train one run in this process (as ``titan train`` does); its exit code."""
    cfg = TrainConfig.of(**run_options)
    validate_train_config(cfg)
    return train(cfg)


def summary(run_dir: Path, skip: int, seconds: float) -> dict:
    """The figures of one run from its records (medians over the steps after ``skip``)."""
    lines = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    start = next(e for e in lines if e["type"] == "run_start")
    steps = [e for e in lines if e["type"] == "step"][skip:]
    mfu = [e["mfu"] for e in steps if e.get("mfu")]
    env = start["env"]
    peak = device_peak(env["device_kinds"], env["device_count"], start["compute_dtype"])
    return {
        "model_source": start["model_source"],
        "ops": start["ops"],
        "param_count": start["param_count"],
        "model_flops_per_token": steps[-1]["model_flops_per_token"],
        "steps_timed": len(steps),
        "tokens_per_step": steps[-1]["tokens"],
        "tokens_per_s": statistics.median(e["tokens_per_s"] for e in steps),
        "step_time_s": statistics.median(e["step_time_s"] for e in steps),
        "mfu": {k: statistics.median(m[k] for m in mfu) for k in FRACTIONS} if mfu else None,
        "mfu_reason": steps[-1].get("mfu_reason"),
        "peak_flops": peak.flops,
        "peak_kind": peak.kind,
        "peak_source": peak.source,
        "loss_first": lines[[e["type"] for e in lines].index("step")]["loss"],
        "loss_last": steps[-1]["loss"],
        "compile_s": sum(e["seconds"] for e in lines if e["type"] == "compile"),
        "wall_s": seconds,
        "compute_dtype": start["compute_dtype"],
        "env": {k: env[k] for k in ("python", "packages", "device_kinds", "device_count")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=4, help="steps left out of the medians")
    parser.add_argument("--runs-root", default="/tmp/titan-bench-maxtext")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, MaxText on CPU")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: train this run
    args = parser.parse_args()
    if args.one:
        sys.exit(train_one(options(args.one, args.smoke, args.runs_root, args.steps)))
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    result = {
        "shape": shape,
        "options": {**COMMON, **(SMOKE if args.smoke else {}), "steps": args.steps},
        "maxtext_set": maxtext_set(shape, FALLBACK if args.smoke else KERNEL),
        "skip": args.skip,
        "runs": {},
    }
    names = ["maxtext", "titan"]
    for name in names:
        command = [sys.executable, __file__, "--one", name, "--steps", str(args.steps)]
        command += ["--out", args.out, "--runs-root", args.runs_root] + ["--smoke"] * args.smoke
        shutil.rmtree(Path(args.runs_root) / name, ignore_errors=True)  # a run of an earlier call
        start = time.perf_counter()
        code = subprocess.run(command).returncode
        seconds = time.perf_counter() - start
        run_dir = Path(args.runs_root) / name
        result["runs"][name] = (
            summary(run_dir, args.skip, seconds) if code == 0 else {"exit_code": code}
        )
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        if name == "maxtext" and code != 0 and not args.smoke:
            names.append(f"maxtext-{FALLBACK}")
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")  # each run as it ends
        print(f"{name}: exit {code}, {seconds:.0f} s", flush=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
