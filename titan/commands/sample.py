"""``titan sample RUN_DIR``: a grid PNG of class-conditional samples of a diffusion run's newest
checkpoint, or of one it names (:mod:`titan.trainer.image_samples`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from titan.checkpoint.init_from import resolve_source
from titan.errors import TitanError
from titan.inert import inert
from titan.out_paths import path_argument


def add_parser(subparsers: Any) -> None:
    """Add ``sample`` to the ``titan`` subcommands."""
    sample = subparsers.add_parser(
        "sample",
        help="write a grid PNG of samples of a diffusion run",
        description="Restore a checkpoint of a --task diffusion run (its newest committed one, "
        "or --step N, or one checkpoint <run dir>/checkpoints/<step>) onto one device and "
        "write a grid of samples, one row per class (deterministic for a seed: Euler steps for "
        "flow matching, DDIM for DDPM, optional classifier-free guidance).",
    )
    sample.add_argument(
        "source",
        metavar="RUN_DIR|CHECKPOINT",
        type=path_argument,
        help="the run dir, or one of its checkpoints <run dir>/checkpoints/<step>",
    )
    sample.add_argument(
        "--step",
        type=int,
        default=None,
        help="the committed checkpoint to sample (default: the newest that can be read)",
    )
    sample.add_argument(
        "--out",
        default=None,
        type=path_argument,
        help="the PNG to write (default: RUN_DIR/samples-<step>.png)",
    )
    sample.add_argument(
        "--per-class", type=int, default=8, help="samples per class, 1 to 64 (default 8)"
    )
    sample.add_argument(
        "--seed", type=int, default=0, help="seed of the initial noise, in [0, 2**32) (default 0)"
    )
    sample.add_argument(
        "--sample-steps", type=int, default=50, help="sampler steps, 1 to 1000 (default 50)"
    )
    sample.add_argument(
        "--guidance",
        type=float,
        default=1.0,
        help="classifier-free guidance scale, a number in [0, 3.4e38] (the sampler computes in "
        "float32; 1: the conditional model alone; default 1)",
    )
    sample.add_argument(
        "--scale",
        type=int,
        default=1,
        help="pixels per sample pixel in the PNG, 1 to 16 (nearest neighbour; default 1)",
    )
    sample.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the grid; prints its path. Returns 0 (bad input raises TitanError: exit 2)."""
    from titan.trainer.image_samples import write_sample_grid

    run_dir, step = resolve_source(args.source, args.step)
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix.lower() != ".png":
        raise TitanError(f"--out {out}: the grid is a PNG; give a path ending in .png")
    path, step = write_sample_grid(
        run_dir,
        out,
        args.scale,
        checkpoint_step=step,
        per_class=args.per_class,
        seed=args.seed,
        steps=args.sample_steps,
        guidance=args.guidance,
    )
    print(f"titan sample: step {step}: {inert(path)}")
    return 0
