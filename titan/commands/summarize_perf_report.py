"""``titan summarize``, ``titan perf check`` and ``titan report``: run records read back.

``summarize`` and ``perf check`` read the run records through the runs root's DuckDB; both
ingest the new lines of every ``events.jsonl`` first (:mod:`titan.analysis.summarize`),
so they are the database's one writer while they run. A runs root that cannot be written is
only read: its database is kept in the cache (:func:`~titan.analysis.summarize.database_path`),
and a line on stderr says where. ``--json`` prints the same as JSON. ``summarize`` lists the
error of each failed run (``run_end``'s ``error``) under its table.
``titan perf check`` exits 1 when a run it lists is flagged (more than 5% slower than the best
earlier run of its key), so that a script or CI job can gate on it; 2 when it could check
no run; 0 otherwise. ``titan
report`` writes one run's Markdown report and figures (:mod:`titan.analysis.report`);
``titan export tensorboard|csv|wandb-offline`` its metrics (:mod:`titan.telemetry.sinks`;
formats of the ``export`` command that :mod:`titan.commands.import_export` defines).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from titan.errors import TitanError
from titan.formatting import format_bounded, format_duration, format_number
from titan.inert import inert
from titan.out_paths import path_argument
from titan.tables import Column, console, fitted_table, print_fitted
from titan.telemetry import sinks
from titan.telemetry.records import EVENTS_FILE, default_runs_root

EXIT_OK, EXIT_FLAGGED = 0, 1
# Runs that ``titan summarize`` lists by default: the most recent ones (a runs root may hold
# 100k; History in the console and --all list every one).
SUMMARY_RUNS = 50
# Where ``summarize`` and ``perf check`` keep the database (titan.analysis.summarize).
DATABASE_HELP = (
    "The database is RUNS_ROOT/titan.duckdb; when RUNS_ROOT cannot be written (a read-only "
    "mount, another user's records) the records are only read and the database is kept in "
    "$TITAN_CACHE/databases/ (default ~/.cache/titan/databases/), one per runs root."
)


def _count(text: str) -> int:
    """A ``--last`` value: a whole number of runs, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of runs, 1 or more, not {text!r}"
        )
    return value


def add_parser(subparsers: Any) -> None:
    """Add ``summarize``, ``perf`` and ``report`` to the ``titan`` subcommands (the metric sinks
    join ``export``'s formats: :func:`add_export_formats`)."""
    s = subparsers.add_parser(
        "summarize",
        help="summarize the runs of a runs root",
        description="Ingest the run records of RUNS_ROOT into its database (incrementally) and "
        "print each run's status, steps, tokens, throughput, MFU, energy, ETTR and goodput, "
        "stalls, restarts and losses; under the table, the error of each failed run and the runs "
        "whose record holds lines that are not events (skipped: damage), with their count. "
        + DATABASE_HELP,
    )
    _add_common(s, run_summarize)
    shown = s.add_mutually_exclusive_group()
    shown.add_argument(
        "--last",
        type=_count,
        default=SUMMARY_RUNS,
        metavar="N",
        help=f"the N runs that started last, listed by run id (default: {SUMMARY_RUNS}; a line "
        "after the table, or on stderr with --json, says how many are not shown)",
    )
    shown.add_argument("--all", action="store_true", help="every run of RUNS_ROOT")

    perf = subparsers.add_parser(
        "perf",
        help="performance database of measured step times",
        description="Measured step times keyed by model shape, layout, device kind and count "
        "and JAX versions.",
    )
    actions = perf.add_subparsers(dest="perf_command", required=True)
    c = actions.add_parser(
        "check",
        help="flag runs slower than the best earlier run of the same key",
        description="List each run's median step time (first 3 steps of each attempt left "
        "out) against the best earlier run of the same key; flag it when more than 5% slower. "
        "Runs without a steady step time are named under the table. Exit code 1 when a listed "
        "run is flagged; 2 when no run could be checked (a gate that checked nothing does not "
        "pass). " + DATABASE_HELP,
    )
    _add_common(c, run_perf_check)

    r = subparsers.add_parser(
        "report",
        help="write a Markdown report with figures of one run",
        description="Write RUN_DIR's report.md (summary, attempts, configuration, environment, "
        "profile trace) with PNG figures of loss, tokens/s, MFU and power over the run, into "
        "--out (default: RUN_DIR/report).",
    )
    r.add_argument(
        "run_dir", metavar="RUN_DIR", type=path_argument, help="a run dir (holding events.jsonl)"
    )
    r.add_argument(
        "--out", default=None, metavar="DIR", type=path_argument, help="default: RUN_DIR/report"
    )
    r.set_defaults(run=run_report)


def _add_common(parser: argparse.ArgumentParser, run: Any) -> None:
    """``RUNS_ROOT``, ``--run``, ``--json``, ``--wide`` and the command's ``run``."""
    parser.add_argument(
        "runs_root",
        nargs="?",
        type=path_argument,
        default=None,
        metavar="RUNS_ROOT",
        help="default: $TITAN_RUNS, else ./runs",
    )
    parser.add_argument(
        "--run", dest="run_id", default=None, metavar="RUN_ID", help="only this run"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every column and whole run ids, however wide the terminal (default: the "
        "columns that fit, by priority; a run id wider than 40%% of the terminal is cut with …)",
    )
    parser.set_defaults(run=run)


def _root(args: argparse.Namespace) -> Path:
    return default_runs_root(args.runs_root or "")


def run_summarize(args: argparse.Namespace) -> int:
    """Run ``titan summarize``; returns the exit code.

    Raises:
        TitanError: as :func:`titan.analysis.summarize.connect`, or ``--run`` names no run
            of the runs root.
    """
    from titan.analysis import summarize

    root = summarize.check_holds_runs(_root(args))
    recent = None if args.all or args.run_id is not None else args.last
    with summarize.ingested(root) as con:
        rows = summarize.summaries(con, args.run_id, recent)
        total = summarize.run_count(con) if args.run_id is None else len(rows)
    _note_database(args.command, root, summarize.database_path(root))
    if args.run_id is not None and not rows:
        raise TitanError(f"--run {args.run_id}: no such run in {root}")
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        _print_summaries(root, rows, args.wide, sorted({r.mfu_peak for r in rows if r.mfu_peak}))
        _print_errors(rows)
        _print_bad_lines(rows)
    if total > len(rows):
        hidden = (
            f"{len(rows):,} most recent of {total:,} runs shown ({total - len(rows):,} "
            "hidden; --all lists all)"
        )
        print(hidden, file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def run_perf_check(args: argparse.Namespace) -> int:
    """Run ``titan perf check``; returns 1 when a listed run is flagged, else 0. The runs it
    could not check (no steady step time) are named under the table (on stderr with
    ``--json``).

    Raises:
        TitanError: as :func:`titan.analysis.summarize.connect`; the runs root holds no run
            (nothing written), or none with a steady step time (a gate that checked nothing
            must not pass); ``--run`` names no measured run.
    """
    from titan.analysis import perfdb, summarize

    root = summarize.check_holds_runs(_root(args))
    if root.is_dir() and not any(summarize.scan_runs_root(root)):
        raise TitanError(f"runs root {root} holds no runs: nothing to check")
    with summarize.ingested(root) as con:
        checks = perfdb.check(perfdb.measurements(con))
        unmeasured = perfdb.unmeasured(con)
    _note_database(f"{args.command} {args.perf_command}", root, summarize.database_path(root))
    if not checks:
        raise TitanError(
            f"no run in {root} has a steady step time (the first {perfdb.WARMUP_STEPS} steps "
            f"of each attempt are left out): nothing checked; runs read: {len(unmeasured):,}"
        )
    if args.run_id is not None:
        checks = [c for c in checks if c.run_id == args.run_id]
        if not checks:
            raise TitanError(f"--run {args.run_id}: no step-time measurement for it in {root}")
        unmeasured = []
    if args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        _print_checks(root, checks, args.wide)
    _print_unmeasured(unmeasured, sys.stderr if args.json else sys.stdout)
    return EXIT_FLAGGED if any(c.flagged for c in checks) else EXIT_OK


def _print_unmeasured(run_ids: list[str], out: TextIO) -> None:
    """Under the checks: the runs not checked, for want of a steady step time."""
    if run_ids:
        print("runs without a steady step time, not checked:", file=out)
    for run_id in run_ids:
        print(inert(f"  {run_id}"), file=out)


def _note_database(command: str, root: Path, path: Path) -> None:
    """One line on stderr when the database ``path`` is not in the runs root ``root`` (which
    cannot be written, :func:`titan.analysis.summarize.database_path`): where it is."""
    if path.parent != root:
        note = f"titan {command}: {root} cannot be written: its records are only read; "
        print(inert(f"{note}database: {path}"), file=sys.stderr)


def run_report(args: argparse.Namespace) -> int:
    """Run ``titan report``; prints the report's path."""
    from titan.analysis.report import write_report

    print(inert(write_report(Path(args.run_dir), Path(args.out) if args.out else None)))
    return EXIT_OK


def _plain(value: Any) -> Any:
    """A string from a record (or a path) as a table cell: control characters escaped
    (:func:`~titan.inert.inert`) and Rich markup shown as written, never
    interpreted."""
    from rich.text import Text

    return Text(inert(value))


# The summary's columns, by priority (0 always shown; the rest as the width allows).
SUMMARY_COLUMNS = (
    Column("run", 0, "left", key=True),
    Column("status", 0, "left", max_width=24),
    Column("steps", 1),
    Column("tokens", 7),
    Column("wall", 6),
    Column("tokens/s", 3),
    Column("MFU", 4),
    Column("energy (J)", 10),
    Column("tokens/J", 11),
    Column("peak GB", 14),
    Column("ETTR", 5),
    Column("goodput", 9),
    Column("stalls", 12),
    Column("restarts", 13),
    Column("final loss", 2),
    Column("best loss", 8),
    Column("best eval", 15),
)
CHECK_COLUMNS = (
    Column("run", 0, "left", key=True),
    Column("median step (s)", 0),
    Column("best earlier (s)", 2),
    Column("best earlier run", 3, "left", key=True),
    Column("slower", 1),
    Column("flag", 0),
)
# Width of the tables when the output is neither a terminal nor sized by $COLUMNS.
PIPE_WIDTH = 200


def _print_summaries(root: Path, rows: list[Any], wide: bool, peaks: list[str]) -> None:
    """The summary table; its caption names the MFU convention and the ``peaks`` it divides by
    (each run's ``mfu_peak``)."""
    conventions = sorted({r.mfu_convention for r in rows if r.mfu_convention})
    cells = []
    for r in rows:
        status = f"{r.status} ({r.reason})" if r.reason else r.status
        cells.append(
            (
                _plain(r.run_id),
                _plain(status),
                format_number(r.steps, ","),
                format_number(r.tokens, ","),
                format_duration(r.wall_s),
                format_number(r.median_tokens_per_s, ",.0f"),
                format_number(r.median_mfu, ".1%", "unknown"),
                format_number(r.energy_j, ",.0f", "unavailable"),
                format_number(r.tokens_per_j, ",.2f", "unavailable"),
                format_number(
                    None if r.peak_memory_bytes is None else r.peak_memory_bytes / 1e9,
                    ",.2f",
                    "not reported",
                ),
                format_number(r.ettr, ".1%"),
                format_number(r.goodput, ".1%"),
                str(r.stalls),
                str(r.restarts),
                format_number(r.final_loss, ".3f"),
                format_number(r.best_loss, ".3f"),
                format_number(r.best_eval_loss, ".3f"),
            )
        )
    out = console(PIPE_WIDTH)
    table, width = fitted_table(
        SUMMARY_COLUMNS,
        cells,
        None if wide else out.width,
        caption=_plain(
            "ETTR: productive / available time (Kokolis et al. 2024); goodput badput "
            "breakdown in --json"
            + (f"; MFU convention: {', '.join(conventions)}" if conventions else "")
            + (f", of the peak of {'; '.join(peaks)}" if peaks else "")
        ),
        title=_plain(f"runs in {root}"),
    )
    print_fitted(out, table, width)


def _print_errors(rows: list[Any]) -> None:
    """Under the summary table: the error of each run whose last ``run_end`` carries one, one
    line each (record text, shown inert: no terminal sequence or markup takes effect)."""
    failed = [(r.run_id, r.error_text()) for r in rows if r.error is not None]
    if failed:
        print("errors (run_end):")
    for run_id, error in failed:
        print(inert(f"  {run_id}: {error}"))


def _print_bad_lines(rows: list[Any]) -> None:
    """Under the summary table: each run whose record holds complete lines that are not events
    (damage: a line cut by a crash and written over, bytes that are not JSON), and how many;
    its figures come from the events that are read."""
    damaged = [(r.run_id, r.bad_lines) for r in rows if r.bad_lines]
    if damaged:
        print("lines that are not events, skipped:")
    for run_id, count in damaged:
        print(inert(f"  {run_id}: {count:,} in {EVENTS_FILE}"))


def _print_checks(root: Path, checks: list[Any], wide: bool) -> None:
    cells = [
        (
            _plain(c.run_id),
            format_bounded(c.median_step_s, ".4f"),
            format_bounded(c.best_earlier_s, ".4f"),
            _plain(c.best_earlier_run or "-"),
            format_bounded(c.slower, "+.1%"),
            "[red]SLOWER[/red]" if c.flagged else "ok",
        )
        for c in checks
    ]
    out = console(PIPE_WIDTH)
    table, width = fitted_table(
        CHECK_COLUMNS,
        cells,
        None if wide else out.width,
        caption="median step_time_s, first 3 steps of each attempt left out; flagged: more "
        "than 5% slower than the best earlier run of the same key",
        title=_plain(f"step times in {root}"),
    )
    print_fitted(out, table, width)


OUT_HELP = {
    "tensorboard": "the directory to write to (an earlier export's event file there is "
    "replaced; the live writer's is kept)",
    "csv": "the file to write (an existing one is refused unless --force, a file of the run "
    "itself always; the default RUN_DIR/metrics.csv is replaced)",
    "wandb-offline": "the directory under which wandb writes (each export adds an offline "
    "run, PATH/wandb/offline-run-*; default RUN_DIR)",
}


def add_export_formats(formats: Any) -> None:
    """Add the metric sinks (:data:`titan.telemetry.sinks.SINKS`) as formats of
    ``titan export``: ``titan export tensorboard|csv|wandb-offline RUN_DIR [--out PATH]``."""
    described = {
        "tensorboard": "TensorBoard event files (tensorboardX); default RUN_DIR/tensorboard",
        "csv": "a CSV, one line per step, one column per scalar; default RUN_DIR/metrics.csv",
        "wandb-offline": "a W&B offline run (the wandb library, offline: upload it with wandb "
        "sync); default RUN_DIR/wandb",
    }
    for sink in sinks.SINKS:
        f = formats.add_parser(
            sink,
            help=f"a run's metrics as {described[sink].split(';')[0]}",
            description=f"Write the scalars of RUN_DIR's events.jsonl (step, eval and checkpoint "
            f"events, one value per step and field) as {described[sink]}. events.jsonl stays "
            "the source of truth; an export can be written again at any time.",
        )
        f.add_argument(
            "run_dir",
            metavar="RUN_DIR",
            type=path_argument,
            help="a run dir (holding events.jsonl)",
        )
        f.add_argument(
            "--out", default=None, metavar="PATH", type=path_argument, help=OUT_HELP[sink]
        )
        if sink == "csv":
            f.add_argument(
                "--force", action="store_true", help="replace the file --out if it exists"
            )
        f.set_defaults(run=run_export, sink=sink, force=False)


def run_export(args: argparse.Namespace) -> int:
    """``titan export``: prints the path written."""
    out = Path(args.out) if args.out else None
    out = sinks.export_run(Path(args.run_dir), args.sink, out, args.force)
    print(inert(str(out)))
    return EXIT_OK
