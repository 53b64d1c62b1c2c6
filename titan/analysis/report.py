"""``titan report RUN_DIR``: a Markdown report of one run with PNG figures.

Written to ``<out>/report.md`` (``<out>``: ``--out``, default ``<run dir>/report/``) with
``loss.png``, ``throughput.png``, ``mfu.png`` and ``power.png`` beside it (:mod:`plots`). The
summary table is :func:`titan.analysis.summarize.summarize_run_dir`'s, the numbers
``titan summarize`` prints; the figures are drawn from the step events, one series per attempt
(a resumed run's ``events.jsonl`` holds several ``run_start`` ... ``run_end`` attempts,
:func:`titan.analysis.ettr.split_attempts`). MFU is plotted as the trainer recorded it,
titled with its peak (``peak_flops``, ``peak_kind`` of the step's
:class:`~titan.telemetry.events.Mfu`) and said to be unknown, with the recorded reason, when
the record has none; the same for power (``run_start``'s ``power.reason``). A diffusion run's
report shows ``samples.png``, a grid of samples of its newest checkpoint drawn by ``titan sample``
in a child process (so that this module stays free of JAX). Events are read with
:func:`titan.telemetry.events.parse_event`; a torn last line (a writer killed mid-line) and
lines that are not events are skipped and counted in the report.

This module imports neither JAX nor matplotlib (:mod:`plots` imports it when drawing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from titan import cli_command
from titan.analysis import ettr, plots
from titan.analysis.summarize import RunSummary, ettr_now, summarize_run_dir
from titan.analysis.trace_summary import summarize_trace
from titan.errors import TitanError
from titan.formatting import format_clock, format_duration, format_flops_rate, format_number
from titan.inert import inert, markdown_text
from titan.out_paths import check_outside_run, remove_orphaned_stagings
from titan.progress_bar import progress_bar
from titan.telemetry.events import Eval, Event, Profile, RunStart, Step, parse_events
from titan.telemetry.records import EVENTS_FILE, run_record_tail

REPORT_DIR = "report"
REPORT_FILE = "report.md"
STAGING_PREFIX = ".report.tmp"  # + pid: the folder in --out a report is written into first
FIGURES = ("loss.png", "throughput.png", "mfu.png", "power.png", "samples.png")
SAMPLES_TIMEOUT_S = 600
POWER_WINDOW_S = 5.0
NOT_RECORDED = "not recorded in the events"
MFU_CONVENTIONS = ("causal", "full")  # the fields of Mfu that are MFU (not HFU or the peak)


def read_run(run_dir: Path) -> tuple[list[Event], int, int]:
    """(events, lines that are not events, bytes of a torn last line) of ``run_dir``.

    Raises:
        TitanError: ``run_dir`` is not a directory, has no ``events.jsonl`` or no ``run_start``.
    """
    tail = run_record_tail(run_dir)
    with progress_bar(f"reading {EVENTS_FILE}: MiB") as update:
        events, not_events = parse_events(list(tail.iter_to_end(update)))
    tail.check_read()
    if not any(isinstance(e, RunStart) for e in events):
        raise TitanError(f"RUN_DIR {run_dir}: {EVENTS_FILE} holds no readable run_start event")
    return events, tail.bad_lines + not_events, tail.pending_bytes


def _mfu_values(step: Step) -> dict[str, float | None]:
    """MFU per convention (:data:`MFU_CONVENTIONS`) of one step; empty without MFU."""
    if step.mfu is None:
        return {}
    return {c: getattr(step.mfu, c) for c in MFU_CONVENTIONS}


def step_series(events: list[Event]) -> list[plots.StepSeries]:
    """One :class:`plots.StepSeries` per attempt, times from the first ``run_start``."""
    attempts = ettr.split_attempts(events)
    t0 = attempts[0][0].written_time
    series = []
    for index, attempt in enumerate(attempts, 1):
        resumed = ettr.attempt_start(attempt).resumed_from_step
        label = f"attempt {index}" + (f" (resumed from step {resumed})" if resumed else "")
        s = plots.StepSeries(label)
        steps = [e for e in attempt if isinstance(e, Step)]
        conventions = [
            c for c in MFU_CONVENTIONS if any(_mfu_values(e).get(c) is not None for e in steps)
        ]
        s.mfu = {c: [] for c in conventions}
        for e in steps:
            s.steps.append(e.step)
            s.time_s.append(e.written_time - t0)
            s.loss.append(e.loss)
            s.tokens_per_s.append(e.tokens_per_s)
            s.step_time_s.append(e.step_time_s)
            s.energy_j.append(e.energy_j)
            values = _mfu_values(e)
            for c in conventions:
                s.mfu[c].append(values.get(c))
        for event in attempt:
            if isinstance(event, Eval):
                s.eval_steps.append(event.step)
                s.eval_loss.append(event.loss)
        series.append(s)
    return series


def _peak(events: list[Event]) -> tuple[str, str]:
    """(the peak MFU divides by, e.g. ``989.5 TFLOP/s (datasheet_dense_bfloat16)``, its source)
    from the last step whose MFU names it."""
    for e in reversed(events):
        mfu = e.mfu if isinstance(e, Step) else None
        if mfu is not None and mfu.peak_flops:
            kind = f" ({mfu.peak_kind})" if mfu.peak_kind else ""
            return f"{format_flops_rate(mfu.peak_flops)}{kind}", mfu.peak_source or ""
    return "the recorded peak (not named in the record)", ""


def _cell(value: Any) -> str:
    """A value as one Markdown table cell."""
    if isinstance(value, dict | list):
        value = json.dumps(value)
    return "-" if value is None else markdown_text(value)


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def _flatten(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mappings as (dotted key, value) pairs."""
    rows: list[tuple[str, Any]] = []
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            rows += _flatten(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def memory_text(s: RunSummary) -> str:
    """Measured peak, compiled program and the planner's estimate, in GB (1e9 bytes)."""
    parts = [
        ("peak", s.peak_memory_bytes, "not reported by the backend"),
        ("compiled", s.compiled_memory_bytes, NOT_RECORDED),
        ("estimate", s.memory_estimate_bytes, NOT_RECORDED),
    ]
    return ", ".join(
        f"{name} {value / 1e9:,.2f}" if value is not None else f"{name} {missing}"
        for name, value, missing in parts
    )


def summary_rows(s: RunSummary, total_steps: Any) -> list[tuple[Any, ...]]:
    """A run summary as (label, value with its unit) rows: the report's table, the console's run
    detail. ``error`` (the last ``run_end``'s, on one line; record text, to be shown inert) only
    for a run whose record holds one."""
    mfu = (
        f"{s.median_mfu:.1%} ({s.mfu_convention}, of {s.mfu_peak})"
        if s.median_mfu is not None
        else f"unknown ({s.mfu_reason or NOT_RECORDED})"
    )
    energy = (
        f"{s.energy_j:,.0f}"
        if s.energy_j is not None
        else f"unavailable ({s.energy_reason or NOT_RECORDED})"
    )
    badput = ", ".join(f"{k} {v:.1%}" for k, v in s.badput.items() if v and v >= 0.0005)
    error = s.error_text()
    return [
        ("status", f"{s.status} ({s.reason})" if s.reason else s.status),
        *([("error", error)] if error is not None else []),
        ("steps", format_number(s.steps, "d")),
        ("steps planned", total_steps),
        ("tokens", format_number(s.tokens, ",")),
        ("wall time (first run_start to last event)", format_duration(s.wall_s)),
        ("median tokens/s", format_number(s.median_tokens_per_s, ",.0f")),
        *(
            [("median images/s", format_number(s.median_images_per_s, ",.1f"))]
            if s.median_images_per_s is not None
            else []
        ),
        ("median MFU", mfu),
        ("energy (J)", energy),
        ("tokens/J", format_number(s.tokens_per_j, ",.2f", "unavailable")),
        ("device memory (GB per device)", memory_text(s)),
        ("ETTR", format_number(s.ettr, ".1%")),
        ("goodput", format_number(s.goodput, ".1%") + (f" (badput: {badput})" if badput else "")),
        ("stalls", s.stalls),
        ("restarts", s.restarts),
        ("final loss", format_number(s.final_loss, ".4f")),
        ("best loss", format_number(s.best_loss, ".4f")),
        ("best eval loss", format_number(s.best_eval_loss, ".4f")),
    ]


def _attempt_rows(events: list[Event], status: str) -> list[tuple[Any, ...]]:
    """The attempts table's rows of a run whose summary says ``status``."""
    rows = []
    for a in ettr.analyze(events, now=ettr_now(status, time.time())).attempts:
        started = format_clock(a.start, utc=True)
        compile_s = a.compile_s + a.startup_compile_s
        rows.append((a.index + 1, started, a.start_step, a.last_step, a.status, f"{compile_s:.1f}"))
    return rows


def _changes(starts: list[RunStart], key: str, title: str) -> list[str]:
    """``title`` and a list of the ``key`` entries (flattened) that differ between consecutive
    attempts' ``run_start``; nothing when none differ."""
    changes = []
    for index in range(1, len(starts)):
        before = dict(_flatten(getattr(starts[index - 1], key) or {}))
        after = dict(_flatten(getattr(starts[index], key) or {}))
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                was, now = (markdown_text(repr(v.get(name))) for v in (before, after))
                changes.append(f"- attempt {index + 1}: {markdown_text(name)}: {was} -> {now}")
    return [f"{title}:", "", *changes, ""] if changes else []


def _figure(draw: Callable[[], Path], markdown: str) -> list[str]:
    """The Markdown of a figure ``draw`` made, or a line saying why it could not be drawn (a
    record's values that matplotlib cannot scale, e.g. losses of 1e308 and -1e308: their span
    overflows); its numeric warnings are not printed."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            path = draw()
    except (ValueError, OverflowError, FloatingPointError) as err:
        why = markdown_text(str(err))
        return [f"figure not drawn: the values recorded cannot be plotted ({why}).", ""]
    return [markdown.format(path.name), ""]


def _figures(out: Path, events: list[Event], s: RunSummary) -> list[str]:
    """Draw the figures into ``out``; the Markdown of the figures section."""
    series = step_series(events)
    lines = ["## Figures", ""]
    lines += _figure(lambda: plots.plot_loss(out / "loss.png", series), "![loss vs step]({})")
    lines += _figure(
        lambda: plots.plot_throughput(out / "throughput.png", series, s.median_tokens_per_s),
        "![tokens/s vs step]({})",
    )
    if any(v is not None for x in series for vs in x.mfu.values() for v in vs):
        peak, source = _peak(events)
        lines += [
            f"MFU: model FLOPs per token (`causal`: attention halved for the causal mask, "
            f"`full`: counted in full; `titan.telemetry.mfu`) x tokens/s over "
            f"{markdown_text(peak)}"
            + (f", source: {markdown_text(source)}" if source else "")
            + ".",
            "",
            *_figure(lambda: plots.plot_mfu(out / "mfu.png", series, peak), "![MFU vs step]({})"),
        ]
    else:
        lines += [f"MFU: unknown ({markdown_text(s.mfu_reason or NOT_RECORDED)}).", ""]
    if any(e is not None for x in series for e in x.energy_j):
        lines += _figure(
            lambda: plots.plot_power(out / "power.png", series, POWER_WINDOW_S),
            "![power and cumulative energy over time]({})",
        )
    else:
        lines += [f"power: unavailable ({markdown_text(s.energy_reason or NOT_RECORDED)}).", ""]
    return lines


def _eval_lines(events: list[Event]) -> list[str]:
    """The validation section: one row per ``eval`` event; nothing when the run has none."""
    rows = [
        (
            e.step,
            format_number(e.loss, ".4f"),
            format_number(e.perplexity, ",.2f"),
            format_number(e.tokens, ","),
            format_number(e.seconds, ".2f"),
        )
        for e in events
        if isinstance(e, Eval)
    ]
    if not rows:
        return []
    header = ("after step", "eval loss (nats)", "perplexity", "tokens", "seconds")
    return ["## Validation", "", "Held-out loss (`eval` events).", "", *_table(header, rows)]


def _profile_lines(run_dir: Path, out: Path, events: list[Event]) -> list[str]:
    profiles = [e for e in events if isinstance(e, Profile)]
    asked = [
        e.config["profile_steps"]
        for e in events
        if isinstance(e, RunStart) and e.config and e.config.get("profile_steps")
    ]
    if not profiles and asked:
        return [
            "## Profile",
            "",
            f"A trace of steps {asked[-1]} was asked for and none was recorded: the run ended "
            "before that range or inside it without stopping cleanly (a kill or a watchdog "
            "abort loses an open trace).",
            "",
        ]
    if not profiles and not (run_dir / "profile").is_dir():
        return []
    lines = ["## Profile", ""]
    for p in profiles:
        link = quote(os.path.relpath(run_dir / (p.dir or "profile"), out))
        steps: Sequence[int | str] = p.steps or ["-", "-"]
        note = f", error: {markdown_text(p.error)}" if p.error else ""
        lines.append(
            f"- steps {steps[0]} to {steps[-1]} (asked {markdown_text(p.requested)}): "
            f"[{markdown_text(p.dir)}]({link}), profiler overhead "
            f"{format_number(p.seconds, '.2f')} s{note}"
        )
    if not profiles:
        lines.append(f"- [profile/]({quote(os.path.relpath(run_dir / 'profile', out))})")
    lines += ["", "Open with TensorBoard's or XProf's profile plugin, or Perfetto.", ""]
    for p in profiles:
        lines += _operation_time_lines(run_dir, p)
    return lines


def _operation_time_lines(run_dir: Path, profile: Profile) -> list[str]:
    """Operation time by kind of a profile event's trace (:mod:`.trace_summary`)."""
    traces = [f for f in profile.files or [] if f.endswith(".trace.json.gz")]
    steps = profile.steps or []
    if not traces or len(steps) != 2:
        return []
    try:
        summary = summarize_trace(run_dir / traces[0])
    except TitanError as err:
        return [f"Operation time: unavailable ({markdown_text(err)}).", ""]
    n = steps[1] - steps[0] + 1
    total = summary.total_us or 1.0
    rows = [
        (kind, format_number(us / n / 1e3, ".2f"), f"{us / total:.1%}")
        for kind, us in sorted(summary.by_kind.items(), key=lambda item: -item[1])
    ]
    top = [
        (op, kind, format_number(us / n / 1e3, ".3f"), count // n)
        for op, kind, us, count in summary.top
    ]
    return [
        f"### Operation time, steps {steps[0]} to {steps[1]} ({summary.source})",
        "",
        f"Summed {summary.source} operation time per step: "
        f"{format_number(summary.total_us / n / 1e3, '.1f')} ms (overlapping kernels count "
        "twice).",
        "",
        *_table(("kind", "ms per step", "share"), rows),
        "",
        *_table(("operation", "kind", "ms per step", "runs per step"), top),
        "",
    ]


def _sample_lines(run_dir: Path, out: Path, last: RunStart) -> list[str]:
    """A diffusion run's sample grid at its newest checkpoint (``titan sample`` in a child
    process), or why there is none; nothing for a language model."""
    if (last.model or {}).get("family") != "dit":
        return []
    command = cli_command("sample", str(run_dir))
    try:
        done = subprocess.run(
            [*command, "--out", str(out / "samples.png")],
            capture_output=True,
            text=True,
            timeout=SAMPLES_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return ["## Samples", "", f"none: titan sample took over {SAMPLES_TIMEOUT_S} s", ""]
    if done.returncode:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return ["## Samples", "", f"none: {markdown_text(said)}", ""]
    said = done.stdout.strip().splitlines()[-1]  # titan sample: step N: PATH
    step = said.removeprefix("titan sample: ").split(":")[0]
    return [
        "## Samples",
        "",
        f"One row per class, from {markdown_text(step)} (Euler "
        "steps for flow "
        "matching, DDIM for DDPM; 50 steps, seed 0, no guidance).",
        "",
        "![samples](samples.png)",
        "",
    ]


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write ``report.md`` and its figures for ``run_dir`` into ``out`` (default
    ``run_dir/report``). Returns the report's path.

    Raises:
        TitanError: a bad ``run_dir`` (see :func:`read_run`), or ``out`` that is a file or lies
            in the run's ``checkpoints/``; nothing is written then.
    """
    run_dir = Path(run_dir)
    events, bad_lines, torn = read_run(run_dir)
    out = Path(out) if out is not None else run_dir / REPORT_DIR
    if out.exists() and not out.is_dir():
        raise TitanError(f"--out {out} is not a directory")
    check_outside_run(out, run_dir)  # not inside its checkpoints/
    summary = summarize_run_dir(run_dir)
    starts = [e for e in events if isinstance(e, RunStart)]
    last = starts[-1]
    with _staged_in(out) as staging:  # a stop or a failure leaves out as it was
        skipped = f"{bad_lines} line(s) that are not events skipped" + (
            f", a torn last line ({torn} bytes) ignored" if torn else ""
        )
        lines = [
            f"# Run report: {markdown_text(summary.run_id)}",
            "",
            f"From {markdown_text(run_dir / EVENTS_FILE)}: {len(events)} events, "
            f"{len(starts)} attempt(s), {skipped}.",
            "",
            "## Summary",
            "",
            *_table(("field", "value"), summary_rows(summary, last.total_steps)),
            "## Attempts",
            "",
            *_table(
                ("attempt", "started (UTC)", "start step", "last step", "status", "compile (s)"),
                _attempt_rows(events, summary.status),
            ),
            *_figures(staging, events, summary),
            *_eval_lines(events),
            *_sample_lines(run_dir, staging, last),
            *_profile_lines(run_dir, out, events),
            "## Configuration",
            "",
            *_table(("option", "value"), list(_flatten(last.config or {}))),
            *_changes(starts, "config", "Changed on resume"),
            "## Model and layout",
            "",
            *_table(
                ("", "value"),
                [
                    ("parameters", format_number(last.param_count, ",.0f")),
                    *_flatten({"model": last.model or {}, "layout": last.layout or {}}),
                    ("compute dtype", last.compute_dtype),
                    *_flatten({"ops": last.ops or {}, "tokenizer": last.tokenizer or {}}),
                    *_flatten({"data": last.data or {}}),
                ],
            ),
            "## Environment",
            "",
            "Of the last attempt's `run_start`.",
            "",
            *_table(("field", "value"), list(_flatten(last.env or {}))),
            *_changes(starts, "env", "Changed between attempts"),
        ]
        # Every line goes out inert: record strings never carry a terminal escape into a viewer.
        text = "\n".join(map(inert, lines)).rstrip() + "\n"
        (staging / REPORT_FILE).write_text(text, encoding="utf-8")
    return out / REPORT_FILE


@contextmanager
def _staged_in(out: Path) -> Iterator[Path]:
    """A new hidden folder in ``out`` (made with its parents), ``.report.tmp<pid>``, that the
    block writes the report into; when the block succeeds its files replace those of ``out``
    (and a figure of an earlier report that this one has not goes). The folder is removed
    either way, and ``out`` too when it was made here and the block failed: a stopped report
    leaves ``out`` as it was. The stagings of reports that were killed are removed first.

    Raises:
        TitanError: ``out`` cannot be created (names it and the OS's reason).
    """
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TitanError(f"--out {out}: cannot create it ({err.strerror})") from None
    remove_orphaned_stagings(out, STAGING_PREFIX)
    staging = out / f"{STAGING_PREFIX}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # an earlier process's of this pid
    try:
        staging.mkdir()
        yield staging
        for name in FIGURES:
            if not (staging / name).exists():
                (out / name).unlink(missing_ok=True)
        for made in staging.iterdir():
            os.replace(made, out / made.name)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
