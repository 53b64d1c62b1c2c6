"""The ``titan`` command: subcommands built on argparse.

Every ``titan train`` option is derived from :class:`titan.config.TrainConfig`'s fields. Options
default to ``None`` here so that ``--resume`` can tell the options a user typed from the saved
ones. User errors (bad values, impossible layouts, missing files) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from titan.config import option_fields
from titan.errors import TitanError

EXIT_USAGE = 2
_TYPES = {"int": int, "float": float, "str": str}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_train_parser(subparsers: Any) -> None:
    train = subparsers.add_parser(
        "train",
        help="train a Llama model",
        description="Train a Llama model and record the run (events.jsonl, config.json, "
        "tokenizer, orbax checkpoints) in <runs root>/<run id>/.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
            help=f"{meta['help']} (default: {f.default!r})",
        )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR from its last checkpoint, with its saved options; "
        "options given here (e.g. --steps) override the saved ones where allowed",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full ``titan`` parser (used by ``main`` and by tests of ``--help``)."""
    parser = _Parser(prog="titan", description="Titan: train Llama-class models with JAX.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train_parser(subparsers)
    return parser


def explicit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``TrainConfig`` options the user actually gave on the command line."""
    return {
        f.name: getattr(args, f.name) for f in option_fields() if getattr(args, f.name) is not None
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``titan`` console script. Returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            from titan.trainer.train import train_from_cli

            return train_from_cli(explicit_options(args), args.resume)
    except TitanError as err:
        print(f"titan {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
