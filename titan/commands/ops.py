"""``titan ops check``: run every available op provider against the native reference.

Prints a table (or ``--json``) of forward and backward errors per op, provider, dtype and shape;
exit code 1 when a case fails (or a ``--provider`` asked for served no case here), 2 for an
unknown ``--op`` or ``--provider``. JAX is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from titan.ops.registry import OPS
from titan.telemetry.device_memory import usable_bytes

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(subparsers: Any) -> None:
    """Add ``ops`` (with its ``check`` subcommand) to the ``titan`` subcommands."""
    ops = subparsers.add_parser(
        "ops",
        help="semantic operators and their providers",
        description=f"Semantic operators ({', '.join(OPS)}) and the providers that implement them.",
    )
    actions = ops.add_subparsers(dest="ops_command", required=True, parser_class=type(ops))
    check = actions.add_parser(
        "check",
        help="check every available provider against the native reference",
        description="Run every provider that can serve each case of a grid of shapes and dtypes, "
        "forward and backward, and compare it with the native reference evaluated in float32 "
        "(tolerances per dtype: titan/ops/conformance.py). On accelerators also time each "
        "provider relative to native. Exit 1 on any failure.",
    )
    check.add_argument("--json", action="store_true", help="print machine-readable results")
    check.add_argument("--op", metavar="NAME", help="check only this op")
    check.add_argument("--provider", metavar="NAME", help="check only this provider (and native)")
    check.set_defaults(run=run)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _time(row: Any, backend: str) -> str:
    if backend == "cpu":
        return "n/a (CPU)"
    return "-" if row.time_vs_native is None else f"{row.time_vs_native:.2f}x"


def _print_table(results: list[Any], backend: str, device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"titan ops check: backend {backend} ({device})")
    for column in ("op", "provider", "dtype", "shape"):
        table.add_column(column)
    for column in ("fwd max abs", "fwd max rel", "bwd max abs", "bwd max rel"):
        table.add_column(column, justify="right")
    table.add_column("status")
    table.add_column("time vs native", justify="right")
    styles = {"pass": "green", "FAIL": "bold red", "error": "bold red", "skipped": "dim"}
    for row in results:
        style = styles[row.status.split(":")[0]]
        table.add_row(
            row.op,
            row.provider,
            row.dtype,
            row.shape,
            _number(row.fwd_abs),
            _number(row.fwd_rel),
            _number(row.bwd_abs),
            _number(row.bwd_rel),
            f"[{style}]{row.status}[/]",
            _time(row, backend),
        )
    Console(width=200).print(table)


@contextlib.contextmanager
def _case_progress() -> Iterator[Callable[[int, int, str], None]]:
    """``progress(done, total, case)`` for :func:`titan.ops.conformance.run_checks`, on stderr:
    a bar with the case and the elapsed time in a terminal, else a line per case."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not sys.stderr.isatty():  # as titan.progress_bar: FORCE_COLOR makes no log a terminal

        def line(done: int, total: int, case: str) -> None:
            if case:
                print(
                    f"titan ops check: case {done + 1}/{total}: {case}", file=sys.stderr, flush=True
                )

        yield line
        return
    console = Console(stderr=True)
    columns = [TextColumn("checking"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn("{task.fields[case]}", markup=False), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("cases", total=None, case="")
        yield lambda done, total, case: bar.update(task, completed=done, total=total, case=case)


def run(args: argparse.Namespace) -> int:
    """Run ``titan ops check``; returns the exit code.

    Raises:
        TitanError: an unknown ``--op`` or ``--provider``.
    """
    import jax

    from titan.ops import conformance

    backend = jax.default_backend()
    device = jax.devices()[0].device_kind
    with _case_progress() as progress:
        usable = usable_bytes(jax.devices()) if backend != "cpu" else None
        results = conformance.run_checks(backend, args.op, args.provider, progress, usable)
    failures = [r for r in results if r.failed]
    unserved = args.provider is not None and not any(
        r.ran for r in results if r.provider == args.provider
    )
    if args.json:
        report = {
            "backend": backend,
            "device": device,
            "tolerances": {k: dataclasses.asdict(t) for k, t in conformance.TOLERANCES.items()},
            "results": [dataclasses.asdict(r) for r in results],
            "failures": len(failures),
            # the --provider asked for served no case here: the exit is 1 for that too
            "provider_served_no_case": args.provider if unserved else None,
        }
        print(json.dumps(report, indent=2))
    else:
        _print_table(results, backend, device)
    if unserved:
        print(f"provider {args.provider!r} served no case on backend {backend}", file=sys.stderr)
    return EXIT_FAILED if failures or unserved else EXIT_OK
