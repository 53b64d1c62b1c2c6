"""``titan generate``: continue a prompt from a run's checkpoint (:mod:`titan.generation`)."""

from __future__ import annotations

import argparse
from typing import Any

from titan.generation import MAX_TEMPERATURE
from titan.out_paths import path_argument


def add_parser(subparsers: Any) -> None:
    """Add ``generate`` to the ``titan`` subcommands."""
    generate = subparsers.add_parser(
        "generate",
        help="generate text from a run's checkpoint",
        description="Continue --prompt with the model of a run dir (its newest committed "
        "checkpoint, or --step N) or of one checkpoint <run dir>/checkpoints/<step>, written by "
        "any layout; tokens stream to stdout as they are decoded (KV cache, one jitted step "
        "per token). Example: titan generate runs/<run id> --prompt 'def main(' "
        "--max-new-tokens 64 --temperature 0.8 --top-p 0.95",
    )
    generate.add_argument(
        "source",
        metavar="RUN_DIR|CHECKPOINT",
        type=path_argument,
        help="a run dir (its newest committed checkpoint, or --step N) or one checkpoint "
        "<run dir>/checkpoints/<step>",
    )
    generate.add_argument("--prompt", required=True, help="text to continue")
    generate.add_argument(
        "--step", type=int, default=None, help="checkpoint step of a run dir (default: newest)"
    )
    generate.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens to generate at most; prompt and new tokens fit in the run's --seq-len "
        "(default: 64, fewer where --seq-len leaves less room)",
    )
    generate.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help=f"softmax temperature, 0 to {MAX_TEMPERATURE:g}; 0 is greedy, the argmax (default: 0)",
    )
    generate.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus sampling: draw from the most probable tokens holding this much "
        "probability, in (0, 1] (default: 1, all)",
    )
    generate.add_argument(
        "--seed", type=int, default=0, help="sampling seed, 0 to 2**32 - 1 (default: 0)"
    )
    generate.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TOKEN",
        help="also stop at this token, not printed: a token id when all digits (128008), else "
        "the text of one token of the run's tokenizer ('<|eom_id|>'); repeat for more. "
        "Generation always stops at the tokenizer's end tokens: its EOS and every id the "
        "eos_token_id of the generation_config.json or config.json beside it named (Llama 3 "
        "Instruct: 128001 and 128009)",
    )
    generate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``titan generate``; returns the exit code (TitanError for bad input)."""
    from titan.generation.generate import Sampling, generate_from_cli

    sampling = Sampling(
        args.max_new_tokens, args.temperature, args.top_p, args.seed, tuple(args.stop)
    )
    return generate_from_cli(args.source, args.step, args.prompt, sampling)
