"""``titan import maxtext`` and ``titan export maxtext``: move parameters between MaxText's params
checkpoints and Titan (:mod:`titan.checkpoint.maxtext_import`,
:mod:`titan.models.adapters.maxtext_checkpoints`; no maxtext needed).
JAX and orbax are imported only when a command runs."""

from __future__ import annotations

import argparse
from typing import Any

from titan.inert import inert
from titan.out_paths import path_argument


def add_import_format(kinds: Any) -> None:
    """Add ``maxtext`` to the formats of ``titan import``."""
    maxtext = kinds.add_parser(
        "maxtext",
        help="a MaxText llama2-block params checkpoint (llama2, llama3, mistral)",
        description="Read a MaxText params checkpoint (orbax, items/params/params, as MaxText's "
        "save_params_to_path writes it) of a llama2-block model and write --out as titan "
        "import hf does: a Titan Llama checkpoint at step 0 (config.json, tokenizer.model, "
        "checkpoints/0) that titan train --init-from, titan export hf and titan generate "
        "read. The query kernel is scaled by sqrt(head_dim) and the layer axis moved from 1 "
        "to 0 (docs/maxtext.md).",
    )
    maxtext.add_argument(
        "path",
        metavar="DIR",
        type=path_argument,
        help="the MaxText checkpoint (the folder holding items/)",
    )
    maxtext.add_argument(
        "--out", required=True, type=path_argument, help="new folder for the Titan checkpoint"
    )
    maxtext.add_argument(
        "--tokenizer",
        required=True,
        help="the model's tokenizer (a sentencepiece .model, tokenizer.json or Llama 3's "
        "tiktoken file; MaxText's config names it as tokenizer_path); copied into --out",
    )
    maxtext.add_argument(
        "--rope-theta",
        type=float,
        default=10_000.0,
        help="RoPE base of the model (MaxText's rope_max_timescale; llama2: 10000, llama3: "
        "500000) (default: %(default)s)",
    )
    maxtext.add_argument(
        "--norm-eps",
        type=float,
        default=1e-5,
        help="RMSNorm epsilon (MaxText's normalization_layer_epsilon) (default: %(default)s)",
    )
    maxtext.set_defaults(run=run_import)


def add_export_format(kinds: Any) -> None:
    """Add ``maxtext`` to the formats of ``titan export``."""
    maxtext = kinds.add_parser(
        "maxtext",
        help="as a MaxText params checkpoint",
        description="Write the parameters of a run's newest checkpoint (or --step) as a MaxText "
        "params checkpoint at --out, joined from every pipeline chunk: Titan's Llama converted "
        "to MaxText's llama2 block, a --model-source maxtext run's parameters as they are. "
        "Prints the MaxText settings that build the model.",
    )
    maxtext.add_argument("run_dir", metavar="RUN_DIR", type=path_argument, help="the Titan run dir")
    maxtext.add_argument(
        "--out", required=True, type=path_argument, help="new folder for the MaxText checkpoint"
    )
    maxtext.add_argument("--step", type=int, help="the checkpoint step (default: the newest)")
    maxtext.set_defaults(run=run_export)


def run_import(args: argparse.Namespace) -> int:
    from titan.checkpoint.maxtext_import import import_maxtext

    shape = import_maxtext(args.path, args.out, args.tokenizer, args.rope_theta, args.norm_eps)
    print(
        f"titan import maxtext: wrote {inert(args.out)}: Titan's Llama d_model={shape.d_model} "
        f"n_layers={shape.n_layers} n_heads={shape.n_heads} n_kv_heads={shape.n_kv_heads} "
        f"ffn_dim={shape.ffn_dim} vocab_size={shape.vocab_size}, "
        f"{shape.param_count():,} parameters"
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from titan.models.adapters.maxtext_checkpoints import export_run

    written = export_run(args.run_dir, args.out, args.step)
    settings = " ".join(f"{key}={value}" for key, value in written["settings"].items())
    wrote = f"wrote {inert(args.out)} (step {written['step']})"
    print(f"titan export maxtext: {wrote}; MaxText: {settings}")
    return 0
