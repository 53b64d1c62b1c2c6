"""``titan train``: its options are derived from :class:`titan.config.TrainConfig`'s fields.

Options default to ``None`` here so that ``--resume`` can tell the options a user typed from the
saved ones.
"""

from __future__ import annotations

import argparse
from typing import Any

from titan.config import option_fields
from titan.parallel.distributed import DISTRIBUTED_MODES, LaunchSettings

_TYPES = {"int": int, "float": float, "str": str}


def add_parser(subparsers: Any) -> None:
    """Add ``train`` to the ``titan`` subcommands."""
    train = subparsers.add_parser(
        "train",
        help="train a Llama model",
        description="Train a Llama model and record the run (events.jsonl, config.json, "
        "tokenizer, orbax checkpoints) in <runs root>/<run id>/.",
    )
    for f in option_fields():
        meta = f.metadata
        train.add_argument(
            meta["flag"],
            dest=f.name,
            type=_TYPES[str(f.type)],
            choices=meta.get("choices"),
            default=None,
            metavar=None if meta.get("choices") else f.name.upper(),
            help=meta["help"]
            if "(default:" in meta["help"]
            else f"{meta['help']} (default: {f.default!r})",
        )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR from its last checkpoint, with its saved options; "
        "options given here (e.g. --steps) override the saved ones where allowed",
    )
    _add_launch_arguments(train)
    train.set_defaults(run=run)


def _add_launch_arguments(train: argparse.ArgumentParser) -> None:
    """How this process joins a run of several (not run options: a run may resume on another
    number of processes); see :mod:`titan.parallel.distributed` and ``titan launch``."""
    group = train.add_argument_group("several processes (jax.distributed)")
    group.add_argument(
        "--distributed",
        choices=DISTRIBUTED_MODES,
        default="auto",
        help="auto: join the processes of a SLURM, Open MPI or Kubernetes job when one is "
        "detected, or those the flags below name; off: one process (default: auto)",
    )
    group.add_argument(
        "--coordinator", metavar="HOST:PORT", help="address of process 0's coordination service"
    )
    group.add_argument("--num-processes", type=int, metavar="N", help="processes of the run")
    group.add_argument("--process-id", type=int, metavar="I", help="this process, 0 to N - 1")


def explicit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``TrainConfig`` options the user actually gave on the command line."""
    return {
        f.name: getattr(args, f.name) for f in option_fields() if getattr(args, f.name) is not None
    }


def run(args: argparse.Namespace) -> int:
    """Run ``titan train``; returns the exit code."""
    from titan.trainer.train import train_from_cli

    launch = LaunchSettings(args.distributed, args.coordinator, args.num_processes, args.process_id)
    return train_from_cli(explicit_options(args), args.resume, launch)
