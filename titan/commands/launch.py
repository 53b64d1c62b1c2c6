"""``titan launch``: several local processes of one run (:mod:`titan.launch.local`)."""

from __future__ import annotations

import argparse
from typing import Any

from titan.launch.local import PLATFORMS, PROCESSES_PER_CPU, STOP_GRACE_S, launch_local


def add_parser(subparsers: Any) -> None:
    """Add ``launch`` to the ``titan`` subcommands."""
    launch = subparsers.add_parser(
        "launch",
        help="run one training run as several local processes",
        description="Start N local processes of one run (JAX's distributed runtime on a free "
        "local port), each with its share of the devices; forward SIGTERM, SIGINT and SIGHUP "
        f"to all (SIGKILL to those still running {STOP_GRACE_S:.0f} s after the first or at a "
        "second); children die with the launcher; show process 0's lines prefixed with [0] "
        "(a failed process's last lines too), a child's stderr on stderr, where the launcher's "
        "own lines go too; exit with the worst exit code. "
        "Example: titan launch --processes 2 --devices-per-process 2 -- train --preset tiny",
    )
    launch.add_argument(
        "--processes",
        type=int,
        required=True,
        metavar="N",
        help="local processes to start, one JAX process each (required; at most "
        f"{PROCESSES_PER_CPU} per CPU this launcher may run on)",
    )
    launch.add_argument(
        "--devices-per-process",
        type=int,
        default=None,
        metavar="D",
        help="devices each process gets (default: CPU 1, GPU the visible GPUs / N)",
    )
    launch.add_argument(
        "--platform",
        choices=PLATFORMS,
        default="auto",
        help="how devices are split: cpu (JAX_NUM_CPU_DEVICES) or gpu (CUDA_VISIBLE_DEVICES); "
        "auto: gpu when GPUs are visible (default: auto)",
    )
    launch.add_argument(
        "--all-logs",
        action="store_true",
        help="show every process's lines, gloo's connection lines among them (default: "
        "process 0's)",
    )
    launch.add_argument(
        "train_args", nargs=argparse.REMAINDER, metavar="command", help="-- train OPTIONS"
    )
    launch.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``titan launch``; returns the worst child's exit code."""
    command = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    return launch_local(
        command, args.processes, args.devices_per_process, args.platform, all_logs=args.all_logs
    )
