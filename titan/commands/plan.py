"""``titan plan``: memory, step time, throughput and budget of a training run before it runs.

One layout (the flags of ``titan train``) prints its memory breakdown with a fits / does-not-fit
verdict, its step-time breakdown and the totals; ``--search`` ranks every layout that fits
(its table keeps the columns that fit the terminal, by priority; ``--wide`` shows all). Both end
with the ``titan train`` command of the layout (the best one with ``--search``), on one line,
or the line that says why there is none (a budget past ``--steps``'s limit). ``--json`` prints
the same as JSON (bytes, seconds, kWh; the command as ``train_command``, why none as
``no_train_command``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.text import Text

from titan.analysis import perfdb, summarize
from titan.config import MAX_STEPS, ParallelOptions, flag_of
from titan.config_flags import add_arguments, section_options
from titan.errors import TitanError
from titan.exit_codes import EXIT_FAILED, EXIT_OK
from titan.flops import ATTENTION_KERNELS
from titan.formatting import format_amount, format_count, format_flops_rate, format_span
from titan.gpus import CATALOG, GpuSpec, find_gpu, gpu_named, on_one_host
from titan.inert import inert
from titan.ops.providers.platform import fused_swiglu_by_default
from titan.out_paths import path_of
from titan.planning.budget import (
    MAX_BATCH_TOKENS,
    Plan,
    PlanRequest,
    check_layouts_exist,
    max_layout_gpus,
    plan,
    search,
)
from titan.planning.collectives import interconnect
from titan.planning.memory import FIT_MARGIN, Layout, Precision
from titan.planning.step import DEFAULT_ACHIEVABLE_FRACTION, Measurement, calibrate
from titan.planning.verdict import Verdict, gpus_needed, verdict
from titan.reading import read_json
from titan.remat import AUTO, auto_candidates
from titan.schedules import SCHEDULES
from titan.shapes import ModelConfig, resolve_model
from titan.tables import Column, console, fitted_table, print_fitted
from titan.telemetry.records import default_runs_root

# Llama 3 pre-training (Meta 2024, "The Llama 3 Herd of Models", Sec. 3.4.1): sequences of 8,192
# tokens, batches of 4M tokens and more.
DEFAULT_SEQ_LEN = 8192
DEFAULT_BATCH_TOKENS = 512 * 8192
GB = 1e9
DEFAULT_TOP = 20  # rows of the --search table
# What the help says of the options that --from makes optional.
REQUIRED = "(required unless --from)"
# Compute-optimal training tokens per parameter: Hoffmann et al. 2022, "Training
# Compute-Optimal Large Language Models" (Chinchilla), about 20 tokens per parameter.
TOKENS_PER_PARAM = 20


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default named once: ``(default: X)`` is appended
    unless the option has none (None, a switch's False, suppressed) or its help names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if any(action.default is none for none in (None, False, argparse.SUPPRESS)):
            return text
        return text if "(default" in text else f"{text} (default: %(default)s)"


def _token_count(text: str) -> int:
    """A ``--batch-tokens`` value: a whole number, written out or as ``4e6`` as ``--tokens``.

    Raises:
        argparse.ArgumentTypeError: not a number, or not a whole one.
    """
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, not {text!r}")
    return int(value)


def add_parser(subparsers: Any) -> None:
    """Add ``plan`` to the ``titan`` subcommands."""
    p = subparsers.add_parser(
        "plan",
        help="estimate memory, step time and cost of a training run",
        description="Estimate memory per device, step time, tokens/s, MFU, total time, "
        "GPU- or chip-hours, energy and cost of training a model on a GPU cluster or TPU "
        "slices, for one layout or, "
        "with --search, for every layout that fits.",
        formatter_class=HelpFormatter,
    )
    add_plan_arguments(p)
    p.set_defaults(run=run)


def add_plan_arguments(p: argparse.ArgumentParser) -> tuple[argparse.Action, ...]:
    """Add ``titan plan``'s options to ``p``; returns their actions in ``--help`` order (the
    planner form of the console builds its fields from them, and parses its texts with ``p``).
    The layout and precision options are ``titan train``'s own (:data:`PLANNED_OPTIONS`)."""
    actions: list[argparse.Action] = []
    actions.append(
        p.add_argument(
            "--model",
            metavar="PRESET|SHAPE",
            help="a decoder preset (the llama family; diffusion models are not modelled) or "
            "d_model=..,n_layers=..,n_heads=..,n_kv_heads=..,ffn_dim=..,vocab_size=.. (as titan "
            f"train --model takes it) {REQUIRED}",
        )
    )
    actions.append(
        p.add_argument(
            "--accelerator",
            "--gpu",
            dest="gpu",
            help=f"accelerator model (GPU or TPU): {', '.join(CATALOG)} {REQUIRED}",
        )
    )
    actions.append(
        p.add_argument(
            "--accelerators",
            "--gpus",
            dest="gpus",
            type=int,
            help=f"number of accelerators (GPUs or TPU chips) {REQUIRED}",
        )
    )
    actions.append(
        p.add_argument(
            "--gpus-per-node",
            type=int,
            default=None,
            help="accelerators per node, the scale-up domain (default: the catalog's for the "
            "--accelerator: a GPU's reference server, a TPU's largest slice)",
        )
    )
    actions.append(
        p.add_argument(
            "--seq-len", type=int, help=f"tokens per sequence (default: {DEFAULT_SEQ_LEN})"
        )
    )
    batch = p.add_mutually_exclusive_group()
    actions.append(
        batch.add_argument(
            "--batch-tokens",
            type=_token_count,
            help=f"global batch, tokens (or --batch-size) (default: {DEFAULT_BATCH_TOKENS})",
        )
    )
    actions.append(
        batch.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="global batch in sequences per step, as titan train names it (tokens: "
            "--batch-size x --seq-len)",
        )
    )
    actions.append(
        p.add_argument(
            "--tokens",
            type=float,
            help="training budget, tokens (default: 20 per parameter, compute-optimal after "
            "Hoffmann et al. 2022; with --from, one step's batch)",
        )
    )
    actions.append(
        p.add_argument(
            "--from",
            dest="from_run",
            type=path_of,
            metavar="RUN_DIR",
            help="predict the configuration of this run (its run_start record) and print the "
            "prediction against what the run measured; the model, GPUs, batch, precision and "
            "layout come from it (giving one of their options too is refused)",
        )
    )
    actions.append(
        p.add_argument(
            "--price",
            type=float,
            default=None,
            help="price per GPU-hour (TPU: chip-hour) in any currency (adds the cost, in that "
            "currency)",
        )
    )
    actions += add_arguments(
        p, PLANNED_OPTIONS, explicit=True
    )  # typed ones told from defaults: --from
    actions.append(
        p.add_argument(
            "--attention",
            choices=ATTENTION_KERNELS,
            help="fused kernel, or scores materialized (titan.ops native provider) (default: "
            f"{PLAN_DEFAULTS['attention']})",
        )
    )
    actions.append(
        p.add_argument(
            "--calibration",
            default=None,
            metavar="FILE|perfdb",
            help="achievable fraction of peak per GPU: a JSON file (GPU name -> fraction, or a "
            "planner_accuracy result), or 'perfdb': fitted to the measured runs of the "
            f"performance database of --runs-root (default: {DEFAULT_ACHIEVABLE_FRACTION} for "
            "every GPU, fitted on one H200: titan.planning.step)",
        )
    )
    actions.append(
        p.add_argument(
            "--runs-root",
            type=path_of,
            default=None,
            help="runs root of --calibration perfdb, only with it (default: $TITAN_RUNS, else "
            "./runs)",
        )
    )
    actions.append(
        p.add_argument(
            "--search",
            action="store_true",
            help="rank every layout that fits (the layout options --dp ... --remat are not taken)",
        )
    )
    actions.append(
        p.add_argument(
            "--top",
            type=int,
            default=argparse.SUPPRESS,  # absent unless given (the help names the default)
            metavar="N",
            help="rows of the --search table, at least 1, only with --search (default: "
            f"{DEFAULT_TOP})",
        )
    )
    actions.append(p.add_argument("--json", action="store_true", help="print JSON"))
    actions.append(
        p.add_argument(
            "--wide",
            action="store_true",
            help="every --search column, however wide the terminal, only with --search (default: "
            "the columns that fit, by priority; dp, fsdp, tp and pp always)",
        )
    )
    return tuple(actions)


# The layout and precision options of titan train that titan plan takes.
PLANNED_OPTIONS = (
    *section_options("parallel", planner=True),
    *sorted(section_options("compute", planner=True), key=lambda o: o.name != "remat"),
)  # --remat first among the compute options, as in titan train --help
# The defaults of the options whose parser default is None (so that typed ones are told).
PLAN_DEFAULTS: dict[str, Any] = {
    **{o.name: o.default for o in PLANNED_OPTIONS},
    **{"seq_len": DEFAULT_SEQ_LEN, "batch_tokens": DEFAULT_BATCH_TOKENS, "attention": "flash"},
}
# The options of one layout: --search ranks every value of them.
LAYOUT_DESTS = (*(o.name for o in section_options("parallel", planner=True)), "remat")
# The options whose values --from takes from the run.
FROM_RUN_DESTS = (
    *("model", "gpu", "gpus", "gpus_per_node", "seq_len", "batch_tokens", "batch_size"),
    *LAYOUT_DESTS,
    *("param_dtype", "compute_dtype", "matmul_dtype", "attention", "search"),
)


def _first_given(args: argparse.Namespace, dests: tuple[str, ...]) -> str | None:
    """The flag of the first of ``dests`` typed on the command line (their parser default is
    None, a switch's False: a typed default counts), or None."""
    given = (d for d in dests if getattr(args, d) is not None and getattr(args, d) is not False)
    return next(("--" + d.replace("_", "-") for d in given), None)


def fill_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with each option left out set to its default (:data:`PLAN_DEFAULTS`); after
    :func:`check_exclusive_options`, which tells the typed ones by their None."""
    for dest, default in PLAN_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    return args


def check_exclusive_options(args: argparse.Namespace) -> None:
    """Refuse options that ``--from`` (the run gives them) or ``--search`` (it ranks every
    layout) would override.

    Raises:
        TitanError: names the first such option.
    """
    if args.from_run is not None and (flag := _first_given(args, FROM_RUN_DESTS)):
        raise TitanError(
            f"{flag} conflicts with --from: the run gives its model, GPUs, batch, precision "
            "and layout"
        )
    if args.search and (flag := _first_given(args, LAYOUT_DESTS)):
        raise TitanError(
            f"{flag} conflicts with --search: it ranks every layout (dp, fsdp, tp, pp, "
            "microbatches, schedule, virtual stages, remat)"
        )


def check_dependent_options(args: argparse.Namespace) -> int:
    """Refuse options without the one they serve (``--top`` or ``--wide`` without
    ``--search``, ``--runs-root`` without ``--calibration perfdb``); returns the rows of the
    ``--search`` table.

    Raises:
        TitanError: names the option, or a ``--top`` below 1.
    """
    top = getattr(args, "top", None)
    if top is not None and not args.search:
        raise TitanError("--top needs --search (it sets the rows of the ranked table)")
    if args.wide and not args.search:
        raise TitanError("--wide needs --search (it shows every column of the ranked table)")
    if args.runs_root is not None and args.calibration != PERFDB:
        raise TitanError(f"--runs-root needs --calibration {PERFDB} (it is the runs root it reads)")
    top = DEFAULT_TOP if top is None else top
    if top < 1:
        raise TitanError(f"--top must be >= 1, got {top}")
    return top


# --calibration's value that fits the calibration to the performance database.
PERFDB = "perfdb"


def perfdb_runs_root(runs_root: Path | None) -> Path:
    """The runs root of ``--calibration perfdb``: ``--runs-root``, else ``$TITAN_RUNS``, else
    ``./runs``.

    Raises:
        TitanError: it is not a directory; names where it came from and ``--runs-root``.
    """
    root = default_runs_root(str(runs_root or ""))
    if root.is_dir():
        return root
    state = "is not a directory" if root.exists() else "does not exist"
    if runs_root is not None:
        raise TitanError(f"--runs-root {root} {state} (the runs root of --calibration perfdb)")
    source = "$TITAN_RUNS" if os.environ.get("TITAN_RUNS") else "the default"
    raise TitanError(
        f"--calibration perfdb: runs root {root} ({source}) {state}; give one with --runs-root"
    )


def perfdb_calibration(runs_root: Path | None) -> dict[str, float]:
    """The achievable fraction per GPU fitted (``titan.planning.step.calibrate``) to every run
    of the performance database of ``runs_root`` (ingested first, as ``titan summarize``
    does) whose device the catalog lists.

    Raises:
        TitanError: no runs root there (:func:`perfdb_runs_root`), or no run of a catalog GPU
            with steady steps in it (then a database this call created is removed: nothing is
            left written).
    """
    root = perfdb_runs_root(runs_root)
    none_found = TitanError(f"--calibration perfdb: no measured run of a catalog GPU in {root}")
    scanned = summarize.scan_runs_root(root)
    if not scanned[0] and not scanned[1]:
        raise none_found  # before the database is opened (and created)
    fresh = not summarize.database_path(root).exists()
    con = summarize.connect(root)
    try:
        with summarize.guarded(summarize.database_path(root)):
            summarize.ingest(con, root, scanned)
            found = perfdb.planner_measurements(perfdb.measurements(con))
    finally:
        con.close()
    if not found:
        if fresh:
            summarize.database_path(root).unlink(missing_ok=True)
        raise none_found
    return calibrate(found)


def load_calibration(value: str | None, runs_root: Path | None = None) -> dict[str, float]:
    """Calibration from ``perfdb`` (:func:`perfdb_calibration`) or a JSON file: a mapping GPU
    name -> fraction, or an object with such a mapping under ``calibration`` (as
    ``bench/planner_accuracy.py`` writes).

    Raises:
        TitanError: a file :func:`titan.reading.read_json` refuses, no such mapping, a key that
            names no catalog GPU or a value outside (0, 1]; names the file and the key.
    """
    if value is None:
        return {}
    if value == PERFDB:
        return perfdb_calibration(runs_root)
    path = Path(value)
    data = read_json(path, "--calibration")
    mapping = data.get("calibration", data)
    if not isinstance(mapping, dict):
        raise TitanError(f"--calibration {path}: expected {{gpu: fraction in (0, 1]}}")
    return {
        _calibrated_gpu(path, name): _calibrated_fraction(path, name, fraction)
        for name, fraction in mapping.items()
    }


def _calibrated_gpu(path: Path, name: str) -> str:
    """The catalog name of key ``name`` of calibration file ``path``."""
    gpu = gpu_named(name)
    if gpu is None:
        raise TitanError(
            f"--calibration {path}: key {name!r} is not a GPU of the catalog; known: "
            f"{', '.join(CATALOG)}"
        )
    return gpu.name


def _calibrated_fraction(path: Path, name: str, fraction: Any) -> float:
    """The value of key ``name`` of calibration file ``path``: a number in (0, 1]."""
    number = isinstance(fraction, int | float) and not isinstance(fraction, bool)
    if not (number and 0 < fraction <= 1):
        shown = json.dumps(fraction)
        shown = shown if len(shown) <= 40 else shown[:39] + "…"
        raise TitanError(
            f"--calibration {path}: {name!r} is {shown}, expected a fraction in (0, 1]"
        )
    return float(fraction)


def batch_tokens(args: argparse.Namespace) -> int:
    """The global batch in tokens: ``--batch-size`` sequences x ``--seq-len`` when given, else
    ``--batch-tokens`` (default :data:`DEFAULT_BATCH_TOKENS`).

    Raises:
        TitanError: ``--batch-size`` below 1, or a batch above
            :data:`~titan.planning.budget.MAX_BATCH_TOKENS` tokens.
    """
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise TitanError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.batch_size * args.seq_len > MAX_BATCH_TOKENS:
            raise TitanError(
                f"--batch-size {args.batch_size:,} x --seq-len {args.seq_len:,} must be <= "
                f"{MAX_BATCH_TOKENS:,} tokens (2^40), got {args.batch_size * args.seq_len:,}"
            )
        return args.batch_size * args.seq_len
    return args.batch_tokens


def check_peak_dtype(gpu: GpuSpec, compute_dtype: str) -> None:
    """Refuse a plan whose step time would divide by another dtype's peak: the catalog holds
    one matmul peak per device, that of ``gpu.compute_dtype`` (the trainer's MFU is unknown
    there too, :func:`titan.telemetry.mfu.device_peak`). A float32 step on an H100 runs at the
    TF32 rate JAX uses by default, half its bfloat16 peak (NVIDIA H100 datasheet).

    Raises:
        TitanError: names ``--compute-dtype`` and the dtype the device's peak is for.
    """
    if compute_dtype != gpu.compute_dtype:
        raise TitanError(
            f"--compute-dtype {compute_dtype}: the catalog's {gpu.label} peak is for "
            f"{gpu.compute_dtype}, so a {compute_dtype} step time cannot be estimated; "
            f"plan with --compute-dtype {gpu.compute_dtype} (or auto)"
        )


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    """The :class:`PlanRequest` of the command line.

    Raises:
        TitanError: unknown model or GPU, a model of another family than llama, bad
            calibration file, ``--matmul-dtype float8`` on a GPU without FP8.
    """
    flags = {"model": "--model", "gpu": "--accelerator", "gpus": "--accelerators"}
    missing = [flag for dest, flag in flags.items() if getattr(args, dest) is None]
    if missing:
        raise TitanError(f"{missing[0]} is required (or give --from RUN_DIR)")
    gpu = find_gpu(args.gpu)
    compute = gpu.compute_dtype if args.compute_dtype == "auto" else args.compute_dtype
    check_peak_dtype(gpu, compute)
    if args.matmul_dtype == "float8" and gpu.fp8_flops is None:
        raise TitanError(
            f"--matmul-dtype float8: the catalog lists no FP8 peak for {gpu.label}; plan with "
            "--matmul-dtype compute"
        )
    swiglu = "fused" if fused_swiglu_by_default(gpu.accelerator) else "native"  # the registry's
    model = resolve_model(args.model)
    check_planned_family(model, f"--model {args.model}")
    per_node = gpu.gpus_per_node if args.gpus_per_node is None else args.gpus_per_node
    return PlanRequest(
        model=model,
        gpu=on_one_host(gpu, min(args.gpus, per_node)),
        gpus=args.gpus,
        gpus_per_node=per_node,
        seq_len=args.seq_len,
        batch_tokens=batch_tokens(args),
        tokens=args.tokens if args.tokens is not None else TOKENS_PER_PARAM * model.param_count(),
        price_per_gpu_hour=args.price,
        precision=Precision(
            args.param_dtype, compute, args.attention, swiglu, matmul=args.matmul_dtype
        ),
        calibration=load_calibration(args.calibration, args.runs_root),
    )


def check_planned_family(model: ModelConfig, what: str) -> None:
    """Refuse a model that the planner does not model: only decoders of the llama family,
    whose tokens are text, are.

    Raises:
        TitanError: names ``what`` (the flag and its value) and the model's family.
    """
    if model.family != "llama":
        raise TitanError(
            f"{what}: a {model.family} model; titan plan models decoders (the llama family), "
            "whose tokens are text: a diffusion model's memory and time are not modelled"
        )


def request_from_run(args: argparse.Namespace, run: Measurement) -> PlanRequest:
    """The :class:`PlanRequest` of a measured run (``--from``): its model, GPUs, batch and
    precision; ``--tokens`` (default: one step's batch), ``--price`` and ``--calibration``
    from the command line.

    Raises:
        TitanError: the run's model is not of the llama family (:func:`check_planned_family`).
    """
    check_planned_family(run.model, f"--from {args.from_run}")
    batch = run.batch_sequences * run.seq_len
    return PlanRequest(
        model=run.model,
        gpu=run.gpu,
        gpus=run.layout.devices,
        gpus_per_node=run.gpus_per_node,
        seq_len=run.seq_len,
        batch_tokens=batch,
        tokens=batch if args.tokens is None else args.tokens,
        price_per_gpu_hour=args.price,
        precision=run.precision,
        calibration=load_calibration(args.calibration, args.runs_root),
    )


def planned(request: PlanRequest, args: argparse.Namespace) -> Plan:
    """The plan of the command line's layout. ``--remat auto`` (the default, as ``titan
    train``'s) takes the first policy of :func:`titan.remat.auto_candidates` that fits, the
    margin included (the last when none does). ``titan train`` takes the first whose estimate
    fits without the margin and holds it against the compiled program instead
    (:mod:`titan.layouts.memory_check`), so it may run a faster policy than the plan names.

    Raises:
        TitanError: as :func:`layout_from_args` and :func:`titan.planning.budget.plan`.
    """
    if args.remat != AUTO:
        return plan(request, layout_from_args(args, args.remat, request.gpu))
    for remat in auto_candidates(request.gpu.accelerator):  # estimated only until one fits
        candidate = plan(request, layout_from_args(args, remat, request.gpu))
        if candidate.memory.fits:
            break
    return candidate


def layout_from_args(args: argparse.Namespace, remat: str, gpu: GpuSpec) -> Layout:
    """The layout flags (:class:`titan.config.ParallelOptions`, the options ``titan train``
    takes) with ``remat``, with ``--dp 0`` taking the ``gpu`` devices left by fsdp x tp x pp.

    Raises:
        TitanError: a size below its minimum, an unknown schedule, a schedule option without
            a pipeline, ``--dp 0`` with ``--gpus`` not a multiple of fsdp x tp x pp.
    """
    parallel = ParallelOptions(
        **{o.field.name: getattr(args, o.name) for o in section_options("parallel", planner=True)}
    )
    if parallel.pp == 1:  # no pipeline: as titan train's --layout spmd
        defaults = ParallelOptions()
        for name in ("schedule", "virtual_stages"):
            if getattr(parallel, name) != getattr(defaults, name):
                raise TitanError(f"{flag_of(name)} needs a pipeline (--pp > 1)")
    per_dp = parallel.fsdp * parallel.tp * parallel.pp
    if not parallel.dp and args.gpus % per_dp:
        raise TitanError(
            f"{gpu.count_flag} {args.gpus} is not a multiple of --fsdp {parallel.fsdp} x --tp "
            f"{parallel.tp} x --pp {parallel.pp} = {per_dp} (--dp 0 takes the {gpu.unit}s they "
            "leave)"
        )
    return Layout.from_parallel(parallel, args.gpus, remat)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What ``titan plan`` found for its arguments, as the command and the console's planner
    show it.

    Attributes:
        request: the planned request.
        plans: the command line's layout, or with ``--search`` every layout that fits, fastest
            first.
        judged: the verdict of the one layout (None with ``--search``).
        needed: with ``--search`` and no layout that fits, the fewest GPUs some layout fits on
            (None when none does, or otherwise).
    """

    request: PlanRequest
    plans: list[Plan]
    judged: Verdict | None
    needed: int | None

    @property
    def fits(self) -> bool:
        """Whether the first plan fits."""
        return bool(self.plans) and (self.judged is None or self.judged.fits)

    @property
    def no_command(self) -> str | None:
        """Why a first plan that fits gets no ``titan train`` command, in one line: its budget
        takes more steps than ``titan train --steps`` allows (:data:`titan.config.MAX_STEPS`);
        None when it gets one."""
        steps = self.request.steps
        if not self.fits or steps <= MAX_STEPS:
            return None
        return (
            f"no titan train command: the budget takes {steps:,} steps, above titan train's "
            f"--steps limit of {MAX_STEPS:,}; plan a larger batch or fewer --tokens"
        )

    @property
    def command_offered(self) -> bool:
        """Whether a ``titan train`` command is offered: the first plan fits and its steps are
        within ``--steps``'s limit."""
        return self.fits and self.no_command is None

    def verdict_line(self) -> str:
        """The first plan's memory verdict in one line (:meth:`Verdict.summary`); "" without
        a plan."""
        if not self.plans:
            return ""
        return (self.judged or verdict(self.plans[0])).summary(self.plans[0])

    def notes(self) -> list[str]:
        """The lines under the tables: the MFU's convention and peak, the matmul efficiency,
        what would make a misfit fit, and why no command is offered (as ``titan plan`` prints
        them, for the console's planner)."""
        if not self.plans:
            return []
        first = self.plans[0]
        lines = [
            mfu_caption(self.request, "halved for causal / in full"),
            eta_caption(first),
        ]
        if self.judged is not None and self.judged.remedies:
            lines += ["would fit with:", *(f"  {r}" for r in self.judged.remedies)]
        return lines + ([self.no_command] if self.no_command else [])

    def none_fit(self) -> str:
        """A search that found no layout, in one line: the GPUs that would be needed."""
        request = self.request
        unit, flag = request.gpu.unit, request.gpu.count_flag
        more = (
            f"{self.needed} {unit}s would be needed (titan plan {flag} {self.needed} --search)"
            if self.needed
            else f"no power-of-two multiple of {request.gpus} up to "
            f"{max_layout_gpus(request.model, request.batch_sequences)} {unit}s (the most any "
            "layout of this model and batch spans) fits either"
        )
        gpus = f"{request.gpus} {unit}{'s' if request.gpus != 1 else ''}"
        return f"no layout of {gpus} fits in memory; {more}"


def outcome(args: argparse.Namespace) -> Outcome:
    """The plans of ``titan plan``'s arguments (``--from`` aside) and their verdict.

    Raises:
        TitanError: as :func:`request_from_args`, :func:`planned` and
            :func:`titan.planning.budget.check_layouts_exist` (with ``--search``: no layout
            splits the model and batch over ``--gpus``).
    """
    request = request_from_args(fill_defaults(args))
    if args.search:
        check_layouts_exist(request)
    plans = search(request) if args.search else [planned(request, args)]
    judged = None if args.search else verdict(plans[0])
    needed = gpus_needed(request) if args.search and not plans else None
    return Outcome(request, plans, judged, needed)


def run(args: argparse.Namespace) -> int:
    """Run ``titan plan``; returns the exit code: :data:`EXIT_FAILED` when the layout does not
    fit (or, with ``--search``, when none does), else :data:`EXIT_OK`."""
    top = check_dependent_options(args)
    check_exclusive_options(args)
    if args.from_run is not None:
        return run_from(args)
    found = outcome(args)
    plans, judged = found.plans, found.judged
    # never for a misfit, nor past --steps's limit
    command = train_command(args.model, plans[0]) if found.command_offered else None
    if args.json:
        report = _json(found.request, plans[:top])
        if args.search:
            report["layouts_fit"] = len(plans)
            report["gpus_needed"] = found.needed
        else:
            assert judged is not None  # judged unless --search
            report["verdict"] = dataclasses.asdict(judged)
        report["train_command"] = command
        report["no_train_command"] = found.no_command
        print(json.dumps(report, indent=2))
        if not found.fits:  # the exit code's reason, for a reader of stderr
            print(f"titan plan: {found.verdict_line() or found.none_fit()}", file=sys.stderr)
        return EXIT_OK if found.fits else EXIT_FAILED
    if args.search:
        _print_search(found, top, args.wide)
    else:
        assert judged is not None  # judged unless --search
        _print_plan(plans[0], judged)
    if command is not None:
        print(f"{'best layout' if args.search else 'this layout'}, for titan train:")
        print(command)
    if found.no_command:
        print(found.no_command)
    return EXIT_OK if found.fits else EXIT_FAILED


def run_from(args: argparse.Namespace) -> int:
    """``titan plan --from RUN_DIR``: the run's configuration predicted, against what the run
    recorded: its measured median steady step time and its compiled programs' peak bytes (what
    XLA planned, not a measured peak); exit code as :func:`run` for a single layout."""
    run, peak = perfdb.run_measurement(args.from_run)
    p = plan(request_from_run(args, run), run.layout)
    judged = verdict(p)
    step_s = None if math.isnan(run.step_s) else run.step_s
    rows = [  # the run's: its measured median step time, its compiled programs' peak bytes
        ("step time (s), measured", p.step.step_s, step_s, 1.0),
        ("peak memory (GB), as compiled", p.memory.total, peak, GB),
    ]
    fitted_on_it = _calibrated_on(args)
    if args.json:
        report = _json(p.request, [p]) | {"verdict": dataclasses.asdict(judged)}
        report["measured"] = {"step_s": rows[0][2], "peak_bytes": peak}
        report["calibrated_on_this_run"] = fitted_on_it
        print(json.dumps(report, indent=2))
        if not judged.fits:  # the exit code's reason, for a reader of stderr
            print(f"titan plan: {judged.summary(p)}", file=sys.stderr)
        return EXIT_OK if judged.fits else EXIT_FAILED
    from rich.table import Table

    out = console(PIPE_WIDTH)
    out.print(Text(inert(f"{args.from_run}: {_header(p.request)}")))  # names from the record
    out.print(f"layout: {p.layout.label()}")
    table = Table(title="predicted against the run's record")
    for name in ("quantity", "predicted", "the run", "error"):
        table.add_column(name, justify="left" if name == "quantity" else "right")
    for name, predicted, measured, unit in rows:
        shown = "not reported" if measured is None else f"{measured / unit:,.4g}"
        error = "-" if measured is None else f"{predicted / measured - 1:+.1%}"
        table.add_row(name, f"{predicted / unit:,.4g}", shown, error)
    out.print(table)
    if fitted_on_it:
        out.print(
            "the perfdb calibration was fitted on the runs of --runs-root, this one among them: "
            "its step-time error is no check of the model on a run it has not seen"
        )
    out.print(Text(judged.summary(p), style="green" if judged.fits else "red"))
    if args.tokens is not None or args.price is not None:  # a budget to plan the run for
        out.print(_totals(p))
    return EXIT_OK if judged.fits else EXIT_FAILED


def _calibrated_on(args: argparse.Namespace) -> bool:
    """Whether ``--calibration perfdb`` was fitted on the runs of a runs root that holds the
    ``--from`` run dir (the database ingests the run dirs directly under it)."""
    if args.calibration != PERFDB:
        return False
    root = perfdb_runs_root(args.runs_root).resolve()
    return Path(args.from_run).resolve().parent == root


def train_command(model: str, p: Plan) -> str:
    """The ``titan train`` command line (one line, shell-quoted) of a plan
    (:func:`train_options`)."""
    words = ["titan", "train"]
    for name, value in train_options(model, p).items():
        words += [flag_of(name), str(value)]
    return shlex.join(words)


def train_options(model: str, p: Plan) -> dict[str, Any]:
    """The ``titan train`` options of a plan, by config field name: the model as ``--model``
    was given, ``--steps`` for the token budget (ceil(tokens / batch tokens)), the batch in
    sequences, the precision (``--matmul-dtype`` where not ``compute``) and the layout's
    options (:meth:`Layout.options`; ``--layout mpmd`` with a pipeline); with a remat policy,
    ``--layer-unroll 1``: the memory model is that of a rolled layer loop, which an unrolled
    one (the default up to 16 or 28 layers) can exceed under remat (docs/planner.md,
    "Limits")."""
    request, layout = p.request, p.layout
    rolled = {"layer_unroll": 1} if layout.remat != "none" else {}
    values = {
        "preset": model,  # --model
        "steps": request.steps,
        "batch_size": request.batch_sequences,
        "seq_len": request.seq_len,
        "param_dtype": request.precision.param_dtype,
        "compute_dtype": request.precision.compute_dtype,
        "layout": "mpmd" if layout.pp > 1 else "spmd",
    }
    if request.precision.matmul != "compute":  # the plan priced the FP8 linear layers
        values["matmul_dtype"] = request.precision.matmul
    return values | layout.options() | rolled


def _json(request: PlanRequest, plans: list[Plan]) -> dict[str, Any]:
    """The report of ``--json``: the inputs, then the plans."""
    return {
        "model": request.model.name,
        "params": request.model.param_count(),
        "gpu": request.gpu.name,
        "gpus": request.gpus,
        "gpus_per_node": request.gpus_per_node,
        "seq_len": request.seq_len,
        "batch_tokens": request.batch_tokens,
        "tokens": request.tokens,
        "price_per_gpu_hour": request.price_per_gpu_hour,
        "precision": dataclasses.asdict(request.precision),
        "peak_flops": known_peak(request.gpu),
        "mfu_convention": _MFU_CONVENTION,
        "plans": [p.as_dict() for p in plans],
    }


_MFU_CONVENTION = (
    "model FLOPs per token (6 N_matmul + 12 L s d, attention halved for 'causal') x tokens/s "
    "/ (GPUs x dense peak of the compute dtype); recomputation not counted"
)


def _header(request: PlanRequest) -> str:
    m = request.model
    network = interconnect(request.gpu, request.gpus, request.gpus_per_node)
    where = f"({request.gpus_per_node} per node)" if network is None else f"({network})"
    return (
        f"{m.name}: {format_count(m.param_count())} params, {request.gpus} x {request.gpu.label} "
        f"{where}, seq {request.seq_len}, batch {request.batch_tokens:,} tokens, budget "
        f"{request.tokens:.3g} tokens"
        + (
            f", the blocks' linear layers in {request.precision.matmul} (priced at the FP8 peak)"
            if request.precision.matmul != "compute"
            else ""
        )
    )


def _energy_text(energy_kwh: float | None, per: float = 1.0) -> str:
    """An energy total in kWh / ``per``, or ``-`` where the catalog has no power figure."""
    return "-" if energy_kwh is None else format_amount(energy_kwh / per)


def known_peak(gpu: GpuSpec) -> float | None:
    """The dense peak FLOP/s that MFU divides by (``GpuSpec.bf16_flops``: the peak of
    ``gpu.compute_dtype``), or None when it is not a positive finite number (unknown)."""
    peak = gpu.bf16_flops
    return peak if math.isfinite(peak) and peak > 0 else None


def peak_text(gpu: GpuSpec) -> str:
    """The peak of :func:`known_peak` in TFLOP/s (GFLOP/s below 1 TFLOP/s), 4 significant
    digits, with its dtype (``989.5 TFLOP/s dense bfloat16``); ``unknown`` when unknown. The CPU
    entry's figure is said to be a measured rate (:mod:`titan.gpus`)."""
    peak = known_peak(gpu)
    if peak is None:
        return "unknown"
    if gpu.name == "cpu":  # titan.gpus: measured on one VM, and runs there exceed it
        return f"{format_flops_rate(peak)} {gpu.compute_dtype} (a measured matmul rate)"
    return f"{format_flops_rate(peak)} dense {gpu.compute_dtype}"


def mfu_caption(request: PlanRequest, conventions: str) -> str:
    """What the plan's MFU divides, in one line: the model FLOPs per token
    (:func:`titan.flops.model_flops_per_token`, N the matmul parameters: the embedding lookup is
    no matmul), the attention ``conventions`` and the peak (:func:`peak_text`)."""
    gpu = request.gpu
    divisor = "rate per device, not a peak" if gpu.name == "cpu" else f"peak per {gpu.unit}"
    return (
        f"MFU: model FLOPs per token (6N + 12Lsd, N the matmul parameters, attention "
        f"{conventions}), no recomputation, of the {divisor}: {peak_text(request.gpu)}"
    )


def eta_caption(p: Plan) -> str:
    """The matmul efficiency the step time assumes, in one line, and where it comes from: the
    calibration's figure for the GPU, else the default of
    :func:`titan.planning.step.achievable_fraction` (no calibration given, or none for the GPU).
    """
    gpu, calibration = p.request.gpu, p.request.calibration
    if gpu.name in calibration:
        source = "calibrated"
    elif calibration:
        source = f"default: the calibration has no {gpu.name}"
    else:
        source = "default"
    return f"eta = {p.step.achievable_fraction:.2f} of peak for matmuls ({source})"


# Width of the output when it is neither a terminal nor sized by $COLUMNS (files, logs).
PIPE_WIDTH = 160


def _print_plan(p: Plan, judged: Verdict) -> None:
    from rich.table import Table

    out = console(PIPE_WIDTH)
    request = p.request
    out.print(_header(request))
    out.print(f"layout: {p.layout.label()}")
    memory = Table(title="memory per device (GB)")
    memory.add_column("part")
    memory.add_column("GB", justify="right")
    for name, value in p.memory.as_dict().items():
        memory.add_row(name.replace("_", " "), f"{value / GB:,.2f}")
    memory.add_row("usable", f"{p.memory.capacity / GB:,.2f}")
    memory.caption = f"margin for the verdict: {FIT_MARGIN:.0%} (titan.planning.memory)"
    out.print(memory)
    out.print(Text(judged.summary(p), style="green" if judged.fits else "red"))
    if judged.remedies:
        out.print("would fit with:")
        for remedy in judged.remedies:
            out.print(Text(f"  {remedy}"))
    step = Table(title="step time (s)")
    step.add_column("part")
    step.add_column("s", justify="right")
    for name, value in p.step.as_dict().items():
        step.add_row(name.removesuffix("_s"), f"{value:.4f}")
    step.caption = eta_caption(p)
    out.print(step)
    out.print(_totals(p))


def _totals(p: Plan) -> Any:
    """The run table of a plan: tokens/s, MFU, and the budget's time, GPU-hours, energy and
    cost (with ``--price``)."""
    from rich.table import Table

    totals = Table(title="run", caption=mfu_caption(p.request, "halved for causal / in full"))
    totals.add_column("quantity")
    totals.add_column("value", justify="right")
    mfu = p.mfu
    for name, text in (
        ("tokens/s", f"{p.step.tokens_per_s:,.0f}"),
        ("MFU causal / full", f"{mfu['causal']:.1%} / {mfu['full']:.1%}"),
        ("total time", format_span(p.total_s)),
        (f"{p.request.gpu.unit}-hours", format_amount(p.gpu_hours)),
        ("energy (kWh)", _energy_text(p.energy_kwh)),
    ):
        totals.add_row(name, text)
    if p.cost is not None:
        totals.add_row("cost (--price currency)", format_amount(p.cost))
    return totals


def _schedule_cell(layout: Layout) -> str:
    if layout.pp == 1:
        return "-"
    short = SCHEDULES[layout.schedule].short
    return f"{short}x{layout.virtual_stages}" if layout.virtual_stages > 1 else short


# The --search table's columns, by priority (0 always shown: the rank and the layout).
SEARCH_COLUMNS = (
    Column("#", 0),
    Column("dp", 0),
    Column("fsdp", 0),
    Column("tp", 0),
    Column("pp", 0),
    Column("sched", 1),
    Column("m", 1),
    Column("remat", 2),
    Column("GB/dev", 3),
    Column("step s", 5),
    Column("tokens/s", 2),
    Column("MFU", 4),
    Column("time", 4),
    Column("GPU-h", 6),
    Column("MWh", 7),
)
COST_COLUMN = Column("cost", 6)


def _print_search(found: Outcome, top: int, wide: bool) -> None:
    from rich import box

    request, plans, total = found.request, found.plans[:top], len(found.plans)
    out = console(PIPE_WIDTH)
    out.print(_header(request))
    if not plans:
        out.print(Text(found.none_fit(), style="red"))
        return
    rows = []
    for rank, p in enumerate(plans, 1):
        layout = p.layout
        row = [
            str(rank),
            str(layout.dp),
            str(layout.fsdp),
            str(layout.tp),
            str(layout.pp),
            _schedule_cell(layout),
            str(layout.microbatches),
            layout.remat,
            f"{p.memory.total / GB:,.1f}",
            f"{p.step.step_s:.3f}",
            f"{p.step.tokens_per_s:,.0f}",
            f"{p.mfu['causal']:.1%}",
            format_span(p.total_s),
            format_amount(p.gpu_hours),
            _energy_text(p.energy_kwh, 1000),
        ]
        if p.cost is not None:
            row.append(format_amount(p.cost))
        rows.append(row)
    hours = dataclasses.replace(SEARCH_COLUMNS[-2], name=f"{request.gpu.unit}-h")
    cost = (COST_COLUMN,) if plans[0].cost is not None else ()
    columns: tuple[Column, ...] = (*SEARCH_COLUMNS[:-2], hours, SEARCH_COLUMNS[-1], *cost)
    table, width = fitted_table(
        columns,
        rows,
        None if wide else out.width,
        caption=mfu_caption(request, "halved for the causal mask"),
        title=f"{total} layouts fit; fastest {len(plans)} (int = interleaved-1f1b x chunks, "
        "zb = zero-bubble)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    print_fitted(out, table, width)
