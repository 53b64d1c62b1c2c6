"""``titan import hf|maxtext`` and ``titan export hf|maxtext|tensorboard|csv|wandb-offline``:
models in and out of Titan checkpoints (Hugging Face Llama directories here,
:mod:`titan.checkpoint.hf_checkpoints`, imported when a command runs: it imports JAX; MaxText's
formats from :mod:`titan.commands.import_export_maxtext`) and a run's metrics out
(:func:`titan.commands.summarize_perf_report.add_export_formats`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from titan.checkpoint.init_from import resolve_source
from titan.commands import import_export_maxtext
from titan.commands.summarize_perf_report import add_export_formats
from titan.inert import inert
from titan.out_paths import path_argument

EXPORT_DTYPES = ("float32", "bfloat16")


def add_parser(subparsers: Any) -> None:
    """Add ``import`` and ``export`` (each with its ``hf`` format; ``export`` also with the
    metric sinks' formats) to the subcommands."""
    imports = subparsers.add_parser(
        "import", help="import a model into a Titan checkpoint", description="Import a model."
    )
    formats = imports.add_subparsers(dest="format", required=True, parser_class=type(imports))
    hf = formats.add_parser(
        "hf",
        help="a Hugging Face Llama directory",
        description="Turn a Hugging Face Llama directory (config.json, safetensors, tokenizer) "
        "into a Titan checkpoint at step 0 with its model shape, tokenizer and a fresh AdamW "
        "state (weights as float32 master weights); start a run from it with titan train "
        "--init-from OUT.",
    )
    hf.add_argument(
        "source", metavar="DIR", type=path_argument, help="the Hugging Face model directory"
    )
    hf.add_argument(
        "--out",
        metavar="PATH",
        type=path_argument,
        help="directory to write (default: ./<DIR name>-titan)",
    )
    hf.set_defaults(run=run_import)
    import_export_maxtext.add_import_format(formats)

    exports = subparsers.add_parser(
        "export",
        help="export a run's checkpoint or its metrics",
        description="Export a run's checkpoint (hf) or its metrics (tensorboard, csv, "
        "wandb-offline).",
    )
    formats = exports.add_subparsers(dest="format", required=True, parser_class=type(exports))
    hf = formats.add_parser(
        "hf",
        help="as a Hugging Face Llama directory",
        description="Write a run's checkpoint (any layout) as a Hugging Face Llama directory: "
        "safetensors, config.json and the tokenizer's files.",
    )
    hf.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        type=path_argument,
        help="a run dir or a titan import hf output (its newest checkpoint that can be read), "
        "or one of its checkpoints, RUN_DIR/checkpoints/STEP",
    )
    hf.add_argument(
        "--step", type=int, metavar="N", help="the checkpoint to export (default: the newest)"
    )
    hf.add_argument(
        "--out",
        metavar="DIR",
        type=path_argument,
        help="directory to write (default: ./<run id>-hf-<step>)",
    )
    hf.add_argument(
        "--dtype",
        choices=EXPORT_DTYPES,
        default="float32",
        help="dtype of the tensors (default: float32, the master weights)",
    )
    hf.set_defaults(run=run_export)
    import_export_maxtext.add_export_format(formats)
    add_export_formats(formats)  # tensorboard, csv, wandb-offline: a run's metrics


def run_import(args: argparse.Namespace) -> int:
    """``titan import hf``: prints the output directory and the model's shape."""
    from titan.checkpoint import hf_checkpoints

    source = Path(args.source)
    out = Path(args.out) if args.out else Path(f"{source.absolute().name}-titan")
    model = hf_checkpoints.import_hf(source, out)
    print(f"{inert(out)}: step 0, {model.param_count():,} parameters ({model.n_layers} layers)")
    return 0


def run_export(args: argparse.Namespace) -> int:
    """``titan export hf``: prints the output directory and the step exported."""
    from titan.checkpoint import hf_checkpoints

    run_dir, step = resolve_source(args.run_dir, args.step)
    out = Path(args.out) if args.out else None
    step, out = hf_checkpoints.export_hf(run_dir, step, out, args.dtype)
    print(f"{inert(out)}: step {step} of {inert(run_dir)}")
    return 0
