"""Metric sinks: a run's ``events.jsonl`` written as TensorBoard event files, a CSV, or a
Weights & Biases offline run (``titan export tensorboard|csv|wandb-offline RUN_DIR``), and a live
TensorBoard writer that follows a run's record while it trains (``titan train --metrics
tensorboard``).

``events.jsonl`` stays the source of truth: a sink is derived from it and can be written again at
any time. The scalars (:func:`metric_rows`) are the numeric fields of the events in
:data:`SCALAR_EVENTS`, nested objects flattened (``mfu.mfu``), tagged ``<group>/<field>``
(``train/loss``, ``eval/loss``, ``checkpoint/save_s``) at the event's step; ``train/skipped`` is
1 for a step whose update was not applied (a non-finite loss or gradient norm), whose rates
(:data:`SKIPPED_STEP_RATES`) are left out, and 0 for the others. A step recorded more
than once (steps replayed after a resume from an earlier checkpoint) is exported once, as its
last record, the one the run went on from. The libraries (``tensorboardX``, ``wandb``: the
``[sinks]`` extra) are imported by the sink that needs them, never by the trainer otherwise.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import importlib.util
import math
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan.errors import TitanError
from titan.out_paths import check_dir, check_file, check_outside_run, removed_on_failure
from titan.progress_bar import progress_bar, tracked
from titan.telemetry.events import INT64_MAX
from titan.telemetry.records import EVENTS_FILE, EventTail, run_record_tail

SCALAR_EVENTS = {"step": "train", "eval": "eval", "checkpoint": "checkpoint"}
"""Event types exported as scalars, and the group (tag prefix) of each."""
SKIPPED_FIELDS = frozenset({"schema", "step", "time"})
# The rates of a step whose update was not applied (``skipped``: a non-finite loss or gradient
# norm): it trained nothing, so they are left out, and ``train/skipped`` (1, else 0) marks it.
SKIPPED_STEP_RATES = frozenset({"step_time_s", "tokens_per_s", "images_per_s", "mfu"})
SINKS = ("tensorboard", "csv", "wandb-offline")
LIVE_SINKS = ("none", "tensorboard")
LIVE_POLL_S = 1.0
EXPORT_SUFFIX = ".titan-export"
LIVE_SUFFIX = ".titan-live"
"""Suffixes of the TensorBoard event files written by ``titan export`` and by the live writer
(an export replaces its own earlier file, never the live one)."""
EXPORT_EVENTS = f"events.out.tfevents.*{EXPORT_SUFFIX}"  # the event files titan export writes


def _numbers(prefix: str, value: Any) -> Iterator[tuple[str, float]]:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        if math.isfinite(value):
            yield prefix, float(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _numbers(f"{prefix}.{key}", inner)


def event_scalars(event: dict[str, Any]) -> list[tuple[str, float]]:
    """``(tag, value)`` of each finite numeric field of an event of :data:`SCALAR_EVENTS` (none
    for other events, or one without an integer ``step`` from 0 to
    :data:`titan.telemetry.events.INT64_MAX`, or without a finite ``time``)."""
    group = SCALAR_EVENTS.get(event.get("type", ""))
    step, at = event.get("step"), event.get("time")
    if group is None or isinstance(step, bool) or not isinstance(step, int):
        return []
    if not 0 <= step <= INT64_MAX or not (isinstance(at, int | float) and math.isfinite(at)):
        return []
    skipped = group == "train" and event.get("skipped") is True
    left_out = SKIPPED_FIELDS | (SKIPPED_STEP_RATES if skipped else frozenset())
    marked = [("train/skipped", float(skipped))] if group == "train" else []
    return marked + [
        (f"{group}/{tag}", value)
        for key, inner in event.items()
        if key not in left_out
        for tag, value in _numbers(key, inner)
    ]


@dataclass
class MetricRow:
    """The scalars of one step: ``time`` (unix seconds of its latest event) and ``values`` by
    tag."""

    step: int
    time: float
    values: dict[str, float] = field(default_factory=dict)


def metric_rows(events: Iterable[dict[str, Any]]) -> list[MetricRow]:
    """One row per step that has scalars, in step order; for each (event type, step) the last
    event recorded wins."""
    # (time, scalars) of each (type, step): the events themselves are not kept, so that a
    # stream of them (EventTail.iter_to_end) is held a slice at a time
    latest: dict[tuple[str, int], tuple[float, list[tuple[str, float]]]] = {}
    for event in events:
        if scalars := event_scalars(event):
            latest.pop((event["type"], event["step"]), None)  # re-inserted last: file order
            latest[(event["type"], event["step"])] = (float(event["time"]), scalars)
    rows: dict[int, MetricRow] = {}
    for (_, step), (time, scalars) in latest.items():
        row = rows.setdefault(step, MetricRow(step, time))
        row.time = max(row.time, time)
        row.values.update(scalars)
    return [rows[step] for step in sorted(rows)]


def check_library(sink: str) -> None:
    """Raise unless the library of ``sink`` (a :data:`SINKS` or :data:`LIVE_SINKS` name) is
    installed (found, not imported).

    Raises:
        TitanError: it is not (names the extra that installs it).
    """
    module = {"tensorboard": "tensorboardX", "wandb-offline": "wandb"}.get(sink)
    if module and importlib.util.find_spec(module) is None:
        raise TitanError(f"{sink} needs {module}: pip install 'titan-jax[sinks]'")


def _tensorboard_writer(out: Path, suffix: str) -> Any:
    check_library("tensorboard")
    from tensorboardX import SummaryWriter

    return SummaryWriter(logdir=str(out), filename_suffix=suffix)


def write_tensorboard(rows: list[MetricRow], out: Path) -> Path:
    """TensorBoard event files of ``rows`` in ``out`` (replacing an earlier export's file there);
    returns ``out``. A write that fails or is stopped leaves no file of its own (nor ``out``,
    when it made it).

    Raises:
        TitanError: ``out`` is not a directory or cannot be written
            (:func:`titan.out_paths.check_dir`).
    """
    check_dir(out)
    with removed_on_failure(out, lambda name: fnmatch.fnmatch(name, EXPORT_EVENTS)):
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(EXPORT_EVENTS):
            old.unlink()
        check_library("tensorboard")
        from tensorboardX import FileWriter
        from tensorboardX.proto.summary_pb2 import Summary

        writer = FileWriter(str(out), filename_suffix=EXPORT_SUFFIX)
        try:
            for row in tracked(rows, "writing TensorBoard events: steps"):
                # one event per step with all its scalars (as a merged TF summary), not one per
                # scalar: about 10x faster to write, half the size, the same scalars to TensorBoard
                values = [Summary.Value(tag=t, simple_value=v) for t, v in row.values.items()]
                writer.add_summary(Summary(value=values), row.step, row.time)
        finally:
            writer.close()
    return out


def write_csv(rows: list[MetricRow], out: Path, force: bool = False) -> Path:
    """A CSV of ``rows``: columns ``step``, ``time`` and each tag (in first-seen order), one
    line per step, empty where a step has no value of a tag; returns its path. It is written to
    ``<out>.tmp`` and renamed, so a failed write leaves neither file.

    Args:
        force: replace an existing file ``out`` (else it is refused).

    Raises:
        TitanError: ``out`` is a directory, an existing file (without ``force``), or cannot be
            written (names ``--out``).
    """
    check_file(out)
    if out.exists() and not force:
        raise TitanError(f"--out {out} exists already; give a new path or --force to replace it")
    tags = list(dict.fromkeys(tag for row in rows for tag in row.values))
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "time", *tags])
            for row in tracked(rows, "writing the CSV: steps"):
                writer.writerow([row.step, row.time, *(row.values.get(t, "") for t in tags)])
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise TitanError(f"--out {out}: cannot write ({e.strerror or e})") from None
    return out


def write_wandb_offline(
    rows: list[MetricRow], out: Path, run_id: str, config: dict[str, Any]
) -> Path:
    """A W&B offline run of ``rows`` under ``out`` (``wandb/offline-run-*``, for ``wandb
    sync``), written by the ``wandb`` library in offline mode (no network); returns the run's
    directory.

    Raises:
        TitanError: wandb is not installed, or ``out`` is not a directory that can be written
            (:func:`titan.out_paths.check_dir`).
    """
    check_library("wandb-offline")
    check_dir(out)  # else wandb falls back to a temporary directory with only a warning
    import wandb

    out.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)
    run = wandb.init(
        mode="offline", dir=str(out), project="titan", id=run_id, name=run_id,
        config=config, settings=settings,
    )  # fmt: skip
    try:
        for row in tracked(rows, "writing the W&B offline run: steps"):
            run.log(row.values, step=row.step)
    finally:
        run.finish()
        wandb.teardown()  # waits for the wandb service to write the run's file out
    return Path(run.dir).parent


def default_out(run_dir: Path, sink: str) -> Path:
    """Where ``titan export`` writes by default: ``<run dir>/tensorboard``, ``metrics.csv``, or
    the run dir for ``wandb-offline`` (wandb puts its runs in ``<dir>/wandb/offline-run-*``)."""
    return run_dir / {"tensorboard": "tensorboard", "csv": "metrics.csv"}.get(sink, "")


def export_run(run_dir: Path, sink: str, out: Path | None = None, force: bool = False) -> Path:
    """Write a run's metrics to ``sink`` (a :data:`SINKS` name); returns what was written.

    Args:
        out: where to write; default :func:`default_out` (a CSV there is the export's own,
            replaced by the next export).
        force: ``csv``: replace an existing file ``out`` given here.

    Raises:
        TitanError: ``run_dir`` has no readable ``events.jsonl``, or one without a single
            event (nothing is written then), the sink's library is missing, or ``out`` is
            refused (:func:`write_csv`, :func:`write_wandb_offline`, or a file of the run
            itself).
    """
    tail, seen = run_record_tail(run_dir), _Seen()
    with progress_bar(f"reading {EVENTS_FILE}: MiB") as update:
        rows = metric_rows(seen.through(tail.iter_to_end(update)))
    tail.check_read()
    if not seen.events:
        raise TitanError(
            f"RUN_DIR {run_dir}: {EVENTS_FILE} holds no event ({tail.bad_lines} lines that are "
            "not events): not a run record"
        )
    if out is not None:  # its default may be replaced: a csv's, by the next export
        check_outside_run(out, run_dir, default_out(run_dir, sink))
    force = force or out is None
    out = out or default_out(run_dir, sink)
    if sink == "tensorboard":
        return write_tensorboard(rows, out)
    if sink == "csv":
        return write_csv(rows, out, force)
    start = seen.run_start
    config = start.get("config")
    run_id = wandb_run_id(str(start.get("run_id", run_dir.name)))
    return write_wandb_offline(rows, out, run_id, config if isinstance(config, dict) else {})


@dataclass
class _Seen:
    """What an export needs of a record beside its rows, noted as the events stream past: how
    many there were, and the first ``run_start`` (empty: none)."""

    events: int = 0
    run_start: dict[str, Any] = field(default_factory=dict)

    def through(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for event in events:
            self.events += 1
            if not self.run_start and event.get("type") == "run_start":
                self.run_start = event
            yield event


def wandb_run_id(run_id: str) -> str:
    """``run_id`` as a W&B run id: characters other than letters, digits, ``.``, ``_`` and
    ``-`` become ``-``. wandb refuses ids with ``:;,#?/'``, spaces at either end, or empty
    (``wandb.Settings``' run id validator), and names a folder after the id, so one longer
    than :data:`WANDB_ID_CHARS` is cut there and ends in 8 hex digits of its sha256 (a name
    has 255 bytes at most on common file systems); a foreign record's id may hold anything."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", run_id) or "run"
    if len(clean) <= WANDB_ID_CHARS:
        return clean
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{clean[: WANDB_ID_CHARS - 9]}-{digest}"


# The longest W&B run id an export gives: its folder (offline-run-<date>_<time>-<id>) stays
# far below 255 bytes.
WANDB_ID_CHARS = 128


class LiveTensorBoard:
    """Follows a run's ``events.jsonl`` from its current end and writes the scalars of each new
    event to ``<run dir>/tensorboard`` (a thread polling every :data:`LIVE_POLL_S` s; what the
    trainer wrote before :meth:`stop` is written before it returns).

    Raises:
        TitanError: tensorboardX is not installed (from the constructor).
    """

    def __init__(self, run_dir: Path, poll_s: float = LIVE_POLL_S) -> None:
        path = run_dir / EVENTS_FILE
        self._tail = EventTail(path, path.stat().st_size if path.is_file() else 0)
        self._writer = _tensorboard_writer(default_out(run_dir, "tensorboard"), LIVE_SUFFIX)
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="titan-tensorboard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _drain(self) -> None:
        for event in self._tail.read_new():
            for tag, value in event_scalars(event):
                self._writer.add_scalar(tag, value, event["step"], float(event["time"]))
        self._writer.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._drain()

    def stop(self) -> None:
        """Write what is left and close the event file."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._drain()
        self._writer.close()


def live_sink(kind: str, run_dir: Path) -> LiveTensorBoard | None:
    """The live writer ``--metrics`` names (:data:`LIVE_SINKS`), started; None for ``none``."""
    if kind == "none":
        return None
    sink = LiveTensorBoard(run_dir)
    sink.start()
    return sink
