"""``titan train``: its options are derived from :class:`titan.config.TrainConfig`'s fields.

Options default to ``None`` here so that ``--resume`` can tell the options a user typed from the
saved ones.
"""

from __future__ import annotations

import argparse
from typing import Any

from titan.config import option_fields

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
    train.set_defaults(run=run)


def explicit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``TrainConfig`` options the user actually gave on the command line."""
    return {
        f.name: getattr(args, f.name) for f in option_fields() if getattr(args, f.name) is not None
    }


def run(args: argparse.Namespace) -> int:
    """Run ``titan train``; returns the exit code."""
    from titan.trainer.train import train_from_cli

    return train_from_cli(explicit_options(args), args.resume)
