"""``titan train``: its options are derived from :class:`titan.config.TrainConfig`'s sections,
one argument group per section.

Options default to ``None`` here so that ``--resume`` can tell the options a user typed from the
saved ones. ``--config FILE.toml`` reads options from a file (sections as tables), flags override
it; ``--print-config`` prints the resolved config as TOML and exits.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from titan.checkpoint.init_from import init_from_options
from titan.checkpoint.resume import resume_options
from titan.config import (
    SECTIONS,
    TrainConfig,
    check_typed_shape,
    check_typed_task_options,
    check_vocab_size_unused,
    custom_vocab_options,
    option_fields,
)
from titan.config_files import config_to_toml, read_config_file
from titan.config_flags import add_arguments, section_options, section_summary
from titan.errors import TitanError
from titan.out_paths import GivenOnce, path_argument
from titan.parallel.distributed import DISTRIBUTED_MODES, LaunchSettings
from titan.stopping import StopFlag, StopRequested, stopped_at_start
from titan.streams import surviving_output


def add_parser(subparsers: Any) -> None:
    """Add ``train`` to the ``titan`` subcommands."""
    train = subparsers.add_parser(
        "train",
        help="train a Llama model",
        description="Train a Llama model and record the run (events.jsonl, config.json, "
        "tokenizer, orbax checkpoints) in <runs root>/<run id>/. The batch is named in "
        "sequences (--batch-size) of --seq-len tokens, as in titan plan.",
        epilog="exit codes: 0 completed; 1 failed; 2 bad input, or the run dir is in use by "
        "a live run; 3 stalled (--watchdog-abort); 4 stopped by SIGTERM, SIGINT or SIGHUP after "
        "a checkpoint, resume with --resume (0 with --exit-zero-on-stop).",
    )
    for section in SECTIONS:
        group = train.add_argument_group(f"{section} options", section_summary(section))
        add_arguments(group, section_options(section), explicit=True)
    files = train.add_argument_group("config files and runs")
    files.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        type=path_argument,
        action=GivenOnce,
        help="read options from a TOML file with one table per section ([data] batch_size = 8, "
        "as --print-config writes it; one file); flags given here override the file",
    )
    files.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (defaults, then the --resume run's saved options, the "
        "--config file and the flags, each over the one before) as TOML and exit; each option "
        "is checked, and the --data mixture and the layer split, but the layout is not held "
        "against devices (no device is asked for: that check comes when the run starts)",
    )
    files.add_argument(
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
        help="auto: join the processes of a SLURM, Open MPI or Kubernetes job or a multi-host "
        "TPU slice when one is detected, or those the flags below name; off: one process "
        "(default: auto)",
    )
    group.add_argument(
        "--coordinator", metavar="HOST:PORT", help="address of process 0's coordination service"
    )
    group.add_argument("--num-processes", type=int, metavar="N", help="processes of the run")
    group.add_argument("--process-id", type=int, metavar="I", help="this process, 0 to N - 1")


def explicit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``TrainConfig`` options (flat names) of the ``--config`` file and of the command line
    (which wins), only those given."""
    options = read_config_file(args.config) if getattr(args, "config", None) else {}
    for option in option_fields():
        if getattr(args, option.name) is not None:
            options[option.name] = getattr(args, option.name)
    return options


def _print_config(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """``--print-config``: the resolved config as TOML, once checked as far as it can be
    without a device."""
    from titan.trainer.config_checks import check_without_devices

    cfg = resume_options(Path(args.resume), options) if args.resume else TrainConfig.of(**options)
    check_without_devices(
        cfg.model, cfg.data, cfg.parallel, cfg.checkpoint.init_from, resumed=bool(args.resume)
    )
    print(config_to_toml(cfg), end="")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``titan train``; returns the exit code. The stop signals are handled from here on,
    before JAX is imported (:mod:`titan.stopping`)."""
    if args.resume is not None and not args.resume.strip():  # an unset $RUN: not a new run
        raise TitanError("--resume is empty: give the run dir to continue")
    explicit = explicit_options(args)
    typed = args.vocab_size is not None  # on the command line, not from --config
    check_vocab_size_unused(explicit.get("tokenizer", ""), explicit.get("vocab_size"), typed)
    options = init_from_options(explicit)  # a typed shape checked against --init-from's there
    typed_names = [o.name for o in option_fields() if getattr(args, o.name) is not None]
    if args.resume:  # a resume's task and shape are its record's
        task = resume_options(Path(args.resume), options).model.task
    else:
        if not options.get("init_from"):
            options = custom_vocab_options(options, typed)
        task = TrainConfig.of(**options).model.task
    check_typed_task_options(task, typed_names)
    if args.preset is not None and not (args.resume or explicit.get("init_from")):
        check_typed_shape(args.preset, TrainConfig.of(**options).model)  # typed: --preset, --model
    if args.print_config:
        return _print_config(args, options)
    stop = StopFlag()
    stop.install()
    try:
        from titan.trainer.train import train_from_cli

        launch = LaunchSettings(
            args.distributed, args.coordinator, args.num_processes, args.process_id
        )
        with surviving_output():  # a reader that goes away ends no run
            return train_from_cli(options, args.resume, launch, stop)
    except StopRequested:  # before train() took over: importing JAX, reading a resumed config
        return stopped_at_start(stop, bool(options.get("exit_zero_on_stop")), bool(args.resume))
    finally:
        stop.uninstall()
