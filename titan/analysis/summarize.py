"""Run records into DuckDB: incremental ingest of ``events.jsonl`` files and per-run summaries.

The database is ``<runs root>/titan.duckdb`` (:func:`database_path`); when the runs root cannot
be written (a read-only mount, another user's shared directory of records), it is kept in the
cache instead, ``$TITAN_CACHE/databases/<digest>.duckdb`` (default ``~/.cache/titan``;
``<digest>``: of the runs root's resolved path), and the records are only read. DuckDB allows
one read-write process at a time, so the trainer never opens it: it appends JSON lines, and
``titan summarize`` (or the console) is the one writer. Tables:

- ``files(run_id, path, offset, seq, bad_lines, device, inode, head_len, head_digest, size,
  mtime_ns)``: how far each run's ``events.jsonl`` was read (keyed by run id, the run dir's
  name, so a moved runs root is not read twice) and which file it was. A file whose ``stat``
  (device, inode, size, ``st_mtime_ns``) is the one recorded when it was last read is not
  opened again: an ingest of unchanged run dirs costs one ``stat`` per run. Only complete lines
  are consumed (a torn last line waits for the next ingest, as in
  :class:`titan.telemetry.records.EventTail`); a complete line that is not a JSON object
  is skipped and counted. A file that is not the one
  read before (another device or inode, shorter than the offset read, or other first bytes:
  ``head_digest`` is the SHA-256 of the first ``head_len`` bytes) was replaced: its run is read
  again from the start. A run dir that is gone (or lost its ``events.jsonl``) is dropped from
  every table. A run whose file cannot be read (unreadable, a directory) gets the status
  :data:`UNREADABLE` with the error as its reason, the other runs are ingested as usual, and it
  is tried again at the next ingest.
- ``events(run_id, seq, type, time, step, <fields>, payload)``: one row per event; ``seq`` is the
  line number in the file; the fields of :data:`EVENT_FIELDS` copied into typed columns (NULL when
  absent, of another type, or not finite); ``payload`` the whole event as JSON, unknown types and
  fields included. A line without a finite ``time`` is a bad line, as in every reader.
- ``meta``: the tables' version; tables of another version are dropped and rebuilt from the
  records.

Parsing happens inside DuckDB (one ``read_text`` of the new complete lines of a batch's files,
staged in temporary files, ``json_transform`` of each line once, one ``INSERT`` per batch):
Python never decodes the events one by one (only
a line with more opening brackets than :data:`~titan.reading.MAX_JSON_DEPTH` is,
to refuse one nested deeper, as every reader does: it counts as a bad line).
- ``runs``: one row per run, recomputed for the runs that got new events (:class:`RunSummary`),
  with ``tokens_per_j`` and the first ``run_start``'s time, preset, layout, pipeline stages and
  devices, so that the History screen sorts, filters and pages in SQL over this table alone.
- ``perf``: measured step times, see :mod:`titan.analysis.perfdb`.

The files that changed are ingested in transactions of up to :data:`BATCH_FILES` files (events
and the new offsets together, then their summaries, each in a few queries for the whole batch:
:func:`refresh_runs`), so an interrupted ingest leaves no half, and a reader sees each batch
once it is committed (``ingest``'s ``progress`` says when); a second ingest of unchanged files
adds nothing.

DuckDB lets one process at a time open the database (:func:`connect`); a process that finds it
held waits, retrying with exponential backoff for up to :data:`LOCK_WAIT_S` seconds, so that
``titan summarize`` and the console, each holding it for one short ingest or query, take turns
instead of failing. Every query takes its
values as parameters: run ids and paths are never put into SQL text.

Summary fields: ``steps``, ``tokens`` and ``best_loss`` count the steps that survive: each
step number's newest ``step`` event, up to the step of the newest ``step`` event (a step that a
resume from an earlier checkpoint threw away, and did not redo yet, is not counted);
``wall_s`` is the first ``run_start`` to the last event (gaps between attempts
included); ``median_tokens_per_s``, ``median_images_per_s`` (None unless the rows are images) and
``median_mfu`` are medians over step events that trained (a step skipped for a non-finite loss
or gradient norm, ``skipped``, applied no update: its rates are left out; MFU under
:data:`titan.telemetry.events.MFU_CONVENTION`, ``causal``);
``energy_j`` sums step events' ``energy_j`` (the step's energy) and ``tokens_per_j`` is the tokens
of those steps over it (else 1 / median ``joules_per_token``); ``mfu_reason`` (the last step's)
and ``energy_reason`` (``run_start``'s ``power.reason``) say why one is missing; ``status`` is
the run's liveness (:func:`titan.analysis.liveness.judge`: the last attempt's ``run_end``
status, else ``running``, ``stalled``, ``unresponsive`` or ``dead`` from its recorded processes
and heartbeats;
runs not ended are worked out again at each ingest, and ``reason`` says why a run is dead);
``unreadable`` (:data:`UNREADABLE`, ``reason`` says why) for
a run whose file or events could not be read; ``error`` is the last attempt's ``run_end``
``error`` (what failed, as the record wrote it: show it inert); ETTR and goodput come from
:mod:`titan.analysis.ettr`.

Readers here go through :mod:`titan.telemetry.events`: the typed columns are named after
event fields, and whole events (for ETTR, the performance database and the summary's reasons)
are parsed with :func:`~titan.telemetry.events.parse_event`.

This module imports DuckDB but not JAX or Textual.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from titan.analysis import ettr, liveness, perfdb
from titan.analysis.sql import insert_rows
from titan.data.cache import cache_dir
from titan.errors import TitanError, error_line, first_line
from titan.formatting import peak_label
from titan.inert import inert
from titan.progress_bar import progress_bar
from titan.reading import MAX_JSON_DEPTH, open_regular, parse_json, without_lone_surrogates
from titan.telemetry.events import (
    EVENT_TYPES,
    MFU_CONVENTION,
    Compile,
    Event,
    EventError,
    RunEnd,
    RunStart,
    Stall,
    Step,
    parse_event,
)
from titan.telemetry.heartbeat import HEARTBEAT_TIMEOUT_S, ProcessId
from titan.telemetry.records import EVENTS_FILE, check_runs_root

DB_FILE = "titan.duckdb"
# Where the database of a runs root that cannot be written is kept, under the cache dir.
CACHE_DATABASES = "databases"
READ_CHUNK_BYTES = 32 << 20
# Bytes at the start of an events file whose digest tells a replaced file from a grown one.
HEAD_BYTES = 4096
# The status of a run whose events file could not be read (its reason says why).
UNREADABLE = "unreadable"

# Bump when a table changes: the database is a cache of the JSONL records, rebuilt on mismatch.
DB_VERSION = 12
# Changed files ingested per transaction: one commit (a few ms of fsync) per batch, not per run.
BATCH_FILES = 256
# A run's summary is computed from all its events: about 16 ns per byte of record (2.9 s for a
# 181 MB record of 300k steps, on 2 shared cores). Within one process, a run is summarised
# again at most every REFRESH_THROTTLE times that long (its new lines are left unread until
# then), so that a reader following a long live run (History, every 5 s) spends at most about
# a tenth of a core on it; a new process (``titan summarize``) reads every run up to date.
SUMMARY_S_PER_BYTE = 16e-9
REFRESH_THROTTLE = 10
# (runs root, run id) -> time.monotonic() of the run's last summary in this process.
_SUMMARISED_AT: dict[tuple[str, str], float] = {}
# How long connect() waits for another process to release the database, and its backoff: the
# first retry after LOCK_FIRST_WAIT_S, doubling up to LOCK_MAX_WAIT_S, each with +-50% jitter so
# that two waiting processes do not retry in step.
LOCK_WAIT_S = 30.0
LOCK_FIRST_WAIT_S = 0.01
LOCK_MAX_WAIT_S = 0.5
# Fields of the events (titan.telemetry.events) copied into typed columns (NULL when absent,
# of another type, or a NaN or infinite number, as titan.telemetry.events reads them), so that
# summaries do not parse the JSON payload again; every field stays in the payload too.
TYPED_COLUMNS = (
    "type",
    "time",
    "step",
    "step_time_s",
    "loss",
    "tokens",
    "tokens_seen",
    "tokens_per_s",
    "data_wait_s",
    "energy_j",
    "joules_per_token",
    "seconds",
    "mfu",
)
_SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}  # anything else: JSON


def event_column_type(name: str) -> str:
    """The DuckDB type of the typed column of event field ``name``, from the field's annotation
    in :mod:`titan.telemetry.events` (one declaration of the schema): ``int`` BIGINT, ``float``
    DOUBLE, ``str`` VARCHAR, anything else (``Mfu``, a dict) JSON; ``type``, every event's kind
    (a class attribute), VARCHAR.

    Raises:
        TypeError: no event has the field, or two events declare it with different types.
    """
    if name == "type":
        return "VARCHAR"
    classes: tuple[type[Event], ...] = (Event, *EVENT_TYPES)
    declared = {f.type for cls in classes for f in dataclasses.fields(cls) if f.name == name}
    bases = {str(t).removesuffix(" | None") for t in declared}
    if len(bases) != 1:
        raise TypeError(f"event field {name!r}: declared as {sorted(map(str, declared))}")
    return _SQL_TYPES.get(bases.pop(), "JSON")


EVENT_FIELDS = {name: event_column_type(name) for name in TYPED_COLUMNS}
_TABLES = ("files", "events", "runs", "perf")
# The states of a run that has not ended: judged again at each ingest.
_NOT_ENDED = (liveness.STARTING, liveness.RUNNING, liveness.STALLED, liveness.UNRESPONSIVE)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS files (run_id VARCHAR PRIMARY KEY, path VARCHAR,
    "offset" BIGINT, seq BIGINT, bad_lines BIGINT, device BIGINT, inode BIGINT,
    head_len BIGINT, head_digest VARCHAR, size BIGINT, mtime_ns BIGINT)""",
    "CREATE TABLE IF NOT EXISTS events (run_id VARCHAR, seq BIGINT, "
    + ", ".join(f"{name} {kind}" for name, kind in EVENT_FIELDS.items())
    + ", payload JSON)",
    # Every summary query reads one run's events: an index on run_id spares a full scan each.
    "CREATE INDEX IF NOT EXISTS events_run ON events (run_id)",
    """CREATE TABLE IF NOT EXISTS runs (run_id VARCHAR PRIMARY KEY, status VARCHAR,
    steps BIGINT, tokens BIGINT, wall_s DOUBLE, median_tokens_per_s DOUBLE, median_mfu DOUBLE,
    ettr DOUBLE, goodput DOUBLE, stalls BIGINT, restarts BIGINT, final_loss DOUBLE,
    best_loss DOUBLE, summary JSON, tokens_per_j DOUBLE, started_at DOUBLE, preset VARCHAR,
    layout VARCHAR, pp BIGINT, devices BIGINT, best_eval_loss DOUBLE)""",
)
# The typed columns that may be negative: times, losses, and the durations that ETTR judges
# (a negative one makes its ETTR unknown, as in every reader: titan.analysis.ettr). Every other
# count and rate below 0 is a value no run records, read as missing (as NaN and infinities are).
_SIGNED_COLUMNS = ("time", "loss", "step_time_s", "data_wait_s")
# JSON types of a number: a field of another type (a string "0.5", true) is missing, as
# titan.telemetry.events reads it, never converted.
_JSON_NUMBERS = "('BIGINT', 'UBIGINT', 'DOUBLE')"


def _number_sql(json_kind: str, number: str, kind: str, signed: bool) -> str:
    """SQL of a number read as :mod:`titan.telemetry.events` reads one, from its JSON type
    ``json_kind`` and its value as a DOUBLE ``number`` (SQL expressions): NULL when it is not a
    JSON number (a string, a bool), not finite, not whole (``kind`` ``BIGINT``), or, unless
    ``signed``, below 0."""
    sane = [f"{json_kind} IN {_JSON_NUMBERS}", f"isfinite({number})"]
    if kind == "BIGINT":
        sane.append(f"{number} = floor({number})")
    if not signed:
        sane.append(f"{number} >= 0")
    return f"CASE WHEN {' AND '.join(sane)} THEN TRY_CAST({number} AS {kind}) END"


def _json_number(value: str, kind: str = "DOUBLE", signed: bool = False) -> str:
    """SQL of the JSON value ``value`` (an SQL expression of type JSON) as a ``kind``
    (``DOUBLE`` or ``BIGINT``), by :func:`_number_sql`."""
    return _number_sql(f"json_type({value})", f"TRY_CAST({value} AS DOUBLE)", kind, signed)


_NUMBER_FIELDS = [name for name, kind in EVENT_FIELDS.items() if kind in ("DOUBLE", "BIGINT")]


def _staged_column(name: str, kind: str) -> str:
    """The SQL of one typed column of :data:`_STAGE_EVENTS`: a number field by
    :func:`_number_sql` (negative only where :data:`_SIGNED_COLUMNS` allows it), from its JSON
    type in ``k`` and its value in ``e``."""
    if name not in _NUMBER_FIELDS:
        return f"e.{name}"
    json_kind = f"k[{_NUMBER_FIELDS.index(name) + 1}]"
    return f"{_number_sql(json_kind, f'e.{name}', kind, name in _SIGNED_COLUMNS)} AS {name}"


# The shape given to json_transform: every number field as a DOUBLE, typed by _staged_column.
_TRANSFORM = {
    name: "DOUBLE" if name in _NUMBER_FIELDS else kind for name, kind in EVENT_FIELDS.items()
}


# The complete lines of the staged files of a batch, each file's lines numbered from its first
# seq, the JSON objects among them transformed to the typed columns (``e``, every number as a
# DOUBLE) and the JSON types of the number fields (``k``, one parse for all of them), typed by
# _staged_column, into a temporary table. A staged file ends with a newline, so its last split
# piece is empty and never valid JSON. Parameters: the staged files, then the same files, their
# run ids and first seqs (lists of one length).
_STAGE_EVENTS = (
    "CREATE OR REPLACE TEMP TABLE staged_events AS SELECT run_id, seq, "
    + ", ".join(_staged_column(name, kind) for name, kind in EVENT_FIELDS.items())
    + ", line::JSON AS payload FROM (SELECT m.run_id, m.seq0 + t.i - 1 AS seq, t.line, "
    + "json_transform(t.line, '"
    + json.dumps(_TRANSFORM)
    + "') AS e, json_type(t.line, "
    + repr([f"$.{name}" for name in _NUMBER_FIELDS])
    + """) AS k FROM (SELECT filename, unnest(string_split(content, chr(10))) AS line,
        generate_subscripts(string_split(content, chr(10)), 1) AS i FROM read_text(?)) t
    JOIN (SELECT unnest(?::VARCHAR[]) AS filename, unnest(?::VARCHAR[]) AS run_id,
        unnest(?::BIGINT[]) AS seq0) m USING (filename)
    WHERE json_valid(t.line) AND json_type(t.line) = 'OBJECT') WHERE """
    + _staged_column("time", "DOUBLE").removesuffix(" AS time")
    + " IS NOT NULL"
)
# The step an attempt starts after, from its run_start (ETTR's start_step: titan.analysis.ettr).
_START_STEP = (
    "COALESCE("
    + _json_number("payload->'$.start_step'", "BIGINT")
    + ", "
    + _json_number("payload->'$.resumed_from_step'", "BIGINT")
    + ", 0)"
)
# A step event whose update was applied: a step skipped for a non-finite loss or gradient norm
# (its `skipped`) trained nothing, and its rates would spoil a median.
_TRAINED = "type = 'step' AND (payload->>'$.skipped') IS DISTINCT FROM 'true'"
# What a batch of summaries needs from the events, one row per run asked for (NULLs for a run
# without events; parameters: the run ids, three times). The steps that survive end at the
# newest step event's step, or at the newest run_start's start step when that came after it (a
# resume that has not stepped yet).
_SUMMARY_FACTS = f"""SELECT run_id, steps, tokens, t0, t1, tps, best, energy, energy_tokens, jpt,
    best_eval, mfu, peak_memory, ips, final, last_start, last_end, last_type,
    first_start->>'$.config.preset', first_start->>'$.config.layout',
    {_json_number("first_start->'$.config.pp'", "BIGINT")},
    {_json_number("first_start->'$.layout.devices'", "BIGINT")}
FROM (SELECT unnest(?::VARCHAR[]) AS run_id) LEFT JOIN (SELECT run_id,
    max(step) AS steps, max(tokens_seen) AS tokens, min(loss) FILTER (isfinite(loss)) AS best,
    arg_max(payload, seq) AS final
    FROM (SELECT run_id, seq, type, step, tokens_seen, loss, payload,
        row_number() OVER (PARTITION BY run_id, type, step ORDER BY seq DESC) AS newest,
        arg_max(CASE WHEN type = 'step' THEN step ELSE {_START_STEP} END, seq)
            OVER (PARTITION BY run_id) AS last_step
        FROM events WHERE type IN ('step', 'run_start') AND list_contains(?, run_id))
    WHERE type = 'step' AND newest = 1 AND step <= last_step GROUP BY run_id) USING (run_id)
LEFT JOIN (SELECT run_id,
    min(time) FILTER (type = 'run_start') AS t0, max(time) AS t1,
    median(tokens_per_s) FILTER ({_TRAINED}) AS tps,
    sum(energy_j) FILTER (type = 'step') AS energy,
    sum(tokens) FILTER (type = 'step' AND energy_j IS NOT NULL) AS energy_tokens,
    median(joules_per_token) FILTER (type = 'step') AS jpt,
    min(loss) FILTER (type = 'eval' AND isfinite(loss)) AS best_eval,
    median({_json_number(f"json_extract(mfu, '$.{MFU_CONVENTION}')")})
        FILTER ({_TRAINED} AND mfu IS NOT NULL) AS mfu,
    max({_json_number("payload->'$.peak_memory_bytes'")}) FILTER (type = 'step') AS peak_memory,
    median({_json_number("payload->'$.images_per_s'")}) FILTER ({_TRAINED}) AS ips,
    arg_max(payload, seq) FILTER (type = 'run_start') AS last_start,
    arg_max(payload, seq) FILTER (type IN ('run_start', 'run_end')) AS last_end,
    arg_max(type, seq) AS last_type,
    arg_min(payload, seq) FILTER (type = 'run_start') AS first_start
    FROM events WHERE list_contains(?, run_id) GROUP BY run_id) USING (run_id)"""


# The characters of a run's error that a summary's text shows: a traceback's last lines.
ERROR_TEXT_CHARS = 2000


@dataclass
class RunSummary:
    """One run's summary (seconds, tokens, joules; None where the records do not say)."""

    run_id: str
    status: str
    reason: str | None
    steps: int | None
    tokens: int | None
    wall_s: float | None
    median_tokens_per_s: float | None
    median_mfu: float | None
    mfu_convention: str | None
    mfu_reason: str | None
    # what the MFU divides by, per device (titan.formatting.peak_label); None without an MFU
    mfu_peak: str | None
    energy_j: float | None
    energy_reason: str | None
    tokens_per_j: float | None
    ettr: float | None
    goodput: float | None
    badput: dict[str, float | None]
    stalls: int
    restarts: int
    final_loss: float | None
    best_loss: float | None
    bad_lines: int = 0
    peak_memory_bytes: float | None = None
    compiled_memory_bytes: float | None = None
    memory_estimate_bytes: float | None = None
    best_eval_loss: float | None = None  # the lowest finite loss of the run's eval events
    # images per second (median of step events' images_per_s): a run whose rows are images
    median_images_per_s: float | None = None
    error: str | None = None  # the last attempt's run_end error (``Type: message``), verbatim

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def error_text(self) -> str | None:
        """:attr:`error` on one line (each run of whitespace, newlines included, one space), cut
        to :data:`ERROR_TEXT_CHARS` characters with the count left out (the whole error is in
        ``--json`` and the record), as record text: to be shown inert
        (:func:`titan.inert.inert`); None without one."""
        if self.error is None:
            return None
        text = " ".join(self.error.split())
        if len(text) <= ERROR_TEXT_CHARS:
            return text
        left = len(text) - ERROR_TEXT_CHARS
        return f"{text[:ERROR_TEXT_CHARS]}… ({left:,} more characters in the run's {EVENTS_FILE})"


@dataclass
class IngestReport:
    """What one :func:`ingest` did: events added, runs recomputed, bad lines skipped (by this
    ingest; ``RunSummary.bad_lines`` counts all of a run's), runs left for a later ingest
    (:data:`REFRESH_THROTTLE`)."""

    events: int = 0
    runs: tuple[str, ...] = ()
    bad_lines: int = 0
    deferred: tuple[str, ...] = ()  # runs whose new lines wait for a later ingest (throttled)


def database_path(runs_root: Path) -> Path:
    """The runs root's database: ``<runs root>/titan.duckdb`` when the runs root does not exist
    or can be written (the directory, and the database and its WAL where they exist), else
    :func:`cached_database_path` (a read-only runs root: only its records are read)."""
    root = Path(runs_root)
    path = root / DB_FILE
    wal = root / f"{DB_FILE}.wal"
    writable = all(os.access(p, os.W_OK) for p in (root, path, wal) if os.path.lexists(p))
    return path if writable or not root.is_dir() else cached_database_path(root)


def cached_database_path(runs_root: Path) -> Path:
    """Where the database of a runs root that cannot be written is kept:
    ``<cache dir>/databases/<digest>.duckdb`` (:func:`titan.data.cache.cache_dir`; ``<digest>``:
    the first 16 hex digits of the SHA-256 of the runs root's resolved path), one per runs
    root."""
    digest = hashlib.sha256(os.fsencode(Path(runs_root).resolve())).hexdigest()[:16]
    return cache_dir() / CACHE_DATABASES / f"{digest}.duckdb"


def check_holds_runs(runs_root: Path) -> Path:
    """``runs_root`` after checking that, where it is a directory, it is empty or holds runs
    (``<run id>/events.jsonl``) or their database: no database is written into a directory of
    something else (a corpus named by mistake).

    Raises:
        TitanError: a directory holding other things only, in one line.
    """
    root = Path(runs_root)
    if root.is_dir() and not os.path.lexists(database_path(root)):
        found, unreadable = scan_runs_root(root)
        if not (found or unreadable) and any(root.iterdir()):  # an empty one awaits its runs
            raise TitanError(
                f"runs root {root} holds no runs (no <run id>/{EVENTS_FILE}); nothing written"
            )
    return root


def connect(runs_root: Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the runs root's database (:func:`database_path`) with its
    tables.

    Raises:
        TitanError: the runs root is no directory, the database cannot be opened (neither the
            runs root nor the cache can be written), or another process held it for longer
            than :data:`LOCK_WAIT_S`.
    """
    root = check_runs_root(Path(runs_root))
    path = database_path(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # the cache's folder
        con = _connect_waiting(path, read_only)
    except OSError as err:  # only the cache's folder can be missing: the runs root is read-only
        raise TitanError(
            f"{root} cannot be written, nor its database's folder {path.parent} created "
            f"({err.strerror or err}); set $TITAN_CACHE to a folder you can write"
        ) from None
    except duckdb.Error as err:
        if read_only or "Could not set lock" in str(err) or not path.is_file():
            raise database_error(path, err) from None
        con = _built_again(path, err)
    if not read_only:
        with guarded(path, con):
            _create_tables(con)
    return con


def _built_again(path: Path, err: duckdb.Error) -> duckdb.DuckDBPyConnection:
    """A new database in place of the file ``path`` that DuckDB could not open (``err``: junk,
    a file of another DuckDB storage version, a damaged header): the file (and its write-ahead
    log) set aside as ``<name>.unreadable`` (``.unreadable.2``, ... beside earlier ones, which
    are kept), said in one line on stderr. The database only summarises the run records, from
    which the caller fills it again.

    Raises:
        TitanError: the file cannot be set aside, or the new database cannot be opened.
    """
    aside = path.with_name(path.name + ".unreadable")
    copies = 1
    while aside.exists():
        copies += 1
        aside = path.with_name(f"{path.name}.unreadable.{copies}")
    try:
        path.replace(aside)
        wal = path.with_name(path.name + ".wal")
        if wal.exists():
            wal.replace(aside.with_name(aside.name + ".wal"))
        con = _connect_waiting(path, read_only=False)
    except OSError as moved:
        raise TitanError(
            f"{path}: {first_line(err)}; it cannot be set aside to be built again "
            f"({moved.strerror or moved})"
        ) from None
    except duckdb.Error as again:
        raise database_error(path, again) from None
    print(
        inert(
            f"titan: {path} could not be read ({first_line(err)}): set aside as {aside.name}; "
            "built again from the run records"
        ),
        file=sys.stderr,
        flush=True,
    )
    return con


def database_error(path: Path, err: duckdb.Error) -> TitanError:
    """One line for DuckDB's error ``err`` on the database ``path``; a corrupt file is named
    with its remedy (the database holds only what the run records hold)."""
    line = first_line(err)
    if "Could not set lock" in line:
        return TitanError(f"{held_line(path, err)} (for more than {LOCK_WAIT_S:.0f} s)")
    if "corrupt" in line.lower():
        line += "; it only summarises the run records: remove it and it is built again"
    return TitanError(f"{path}: {line}")


@contextlib.contextmanager
def guarded(path: Path, con: duckdb.DuckDBPyConnection | None = None) -> Iterator[None]:
    """A block that uses the database ``path``: DuckDB's errors in it (a block of the file found
    corrupt by a query) become one line (:func:`database_error`); ``con`` is closed then.

    Raises:
        TitanError: DuckDB raised in the block.
    """
    try:
        yield
    except duckdb.Error as err:
        if con is not None:
            con.close()
        raise database_error(path, err) from None


# Who is told, once per connect, that the database is held and the connect waits (None: nobody).
_TELL_WAIT: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "tell_wait", default=None
)
# DuckDB's lock error names the holder: "Conflicting lock is held in /usr/bin/python3 (PID 123)".
_HOLDER_PID = re.compile(r"\(PID (\d+)\)")


@contextlib.contextmanager
def waits_told(tell: Callable[[str], None]) -> Iterator[None]:
    """Within the block (this thread, or task), a :func:`connect` that finds the database held
    by another process calls ``tell`` at once with one line naming the file and the holder's
    pid (:func:`held_line`), then waits as it does (up to :data:`LOCK_WAIT_S`)."""
    token = _TELL_WAIT.set(tell)
    try:
        yield
    finally:
        _TELL_WAIT.reset(token)


def held_line(path: Path, err: duckdb.Error) -> str:
    """``another process (pid N) holds <path>``: DuckDB's lock error ``err`` in one line, the
    holder first (its pid where DuckDB's message gives it), so that a narrow line that cuts the
    path still names it."""
    found = _HOLDER_PID.search(str(err))
    return f"another process{f' (pid {found[1]})' if found else ''} holds {path}"


def _connect_waiting(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``, retried while another process holds the file's lock (DuckDB's
    ``Could not set lock`` error) with exponential backoff and jitter, for up to
    :data:`LOCK_WAIT_S` seconds (said at once to :func:`waits_told`'s listener); other errors,
    and the lock error after that, are raised."""
    deadline = time.monotonic() + LOCK_WAIT_S
    wait = LOCK_FIRST_WAIT_S
    told = False
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as err:
            if "Could not set lock" not in str(err) or time.monotonic() + wait > deadline:
                raise
            tell = _TELL_WAIT.get()
            if tell is not None and not told:
                tell(f"{held_line(path, err)}: waiting up to {LOCK_WAIT_S:.0f} s for it...")
                told = True
        time.sleep(wait * random.uniform(0.5, 1.5))
        wait = min(wait * 2, LOCK_MAX_WAIT_S)


def _create_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables; drop and recreate them when they were made by another version."""
    con.execute(_SCHEMA[0])
    version = con.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
    if version is not None and version[0] == str(DB_VERSION):
        return  # made by this version: nothing to write (a reader's connect stays cheap)
    for table in _TABLES:
        con.execute(f"DROP TABLE IF EXISTS {table}")
    for statement in (*_SCHEMA[1:], *perfdb.SCHEMA):
        con.execute(statement)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", [str(DB_VERSION)])


def _head_digest(f: Any, length: int) -> str:
    """SHA-256 (hex) of the first ``length`` bytes of the open file ``f``."""
    f.seek(0)
    return hashlib.sha256(f.read(length)).hexdigest()


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """One transaction: committed when the block ends, rolled back when it raises."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


# A file's row of ``files``: how far it was read, and which file it was.
_FileRow = tuple[int, int, int, int | None, int | None, int | None, str | None]


@dataclass
class _Staged:
    """One events file's new complete lines, staged for a batch's insert.

    Attributes:
        run_id, path: the run and its events file.
        row: its new row of ``files`` (the columns after run id and path).
        lines: complete lines read (each becomes an event or a bad line).
        chunks: ``(staged file, first seq)`` of each staged part.
        replaced: the file is not the one read before: its run's events are read again.
        bad_before: the bad lines counted before this ingest (0 when replaced).
    """

    run_id: str
    path: Path
    row: list[Any]
    lines: int
    chunks: list[tuple[str, int]]
    replaced: bool
    bad_before: int


def _stage_file(path: Path, run_id: str, known: _FileRow | None, staged_stem: Path) -> _Staged:
    """Read the new complete lines of one events file (a torn last line waits for the next
    ingest) into staged files ``<staged_stem>-<n>.jsonl``, the whole file when it was
    replaced; ``known``: its row of ``files`` (None: never read).

    Raises:
        OSError: the file cannot be read (the caller marks the run unreadable).
    """
    offset, seq, bad, device, inode, head_len, digest = known or (0, 0, 0, None, None, None, None)
    chunks: list[tuple[str, int]] = []
    lines = 0
    with open_regular(path) as f:
        info = os.fstat(f.fileno())
        replaced = known is not None and (
            (device, inode) != (info.st_dev, info.st_ino)
            or info.st_size < offset
            or head_len is None
            or _head_digest(f, head_len) != digest
        )
        if replaced:
            offset, seq, bad = 0, 0, 0
        f.seek(offset)
        while True:
            chunk = f.read(READ_CHUNK_BYTES)
            while b"\n" not in chunk and len(chunk) % READ_CHUNK_BYTES == 0:
                more = f.read(READ_CHUNK_BYTES)  # one line longer than a chunk
                if not more:
                    break
                chunk += more
            end = chunk.rfind(b"\n")
            if end < 0:
                break
            offset += end + 1
            f.seek(offset)
            count = chunk.count(b"\n", 0, end + 1)
            staged = Path(f"{staged_stem}-{len(chunks)}.jsonl")
            # read_text needs UTF-8: undecodable bytes, and lone surrogates, become U+FFFD.
            text = _without_deep_lines(chunk[: end + 1]).decode("utf-8", "replace")
            staged.write_bytes(without_lone_surrogates(text).encode("utf-8"))
            chunks.append((str(staged), seq + lines))
            lines += count
        head_len = min(offset, HEAD_BYTES)
        row: list[Any] = [offset, seq + lines, bad, info.st_dev, info.st_ino, head_len]
        row += [_head_digest(f, head_len), info.st_size, info.st_mtime_ns]
    return _Staged(run_id, path, row, lines, chunks, replaced, bad)


def _insert_staged(con: duckdb.DuckDBPyConnection, staged: list[_Staged]) -> dict[str, int]:
    """Insert the staged lines of a batch (inside the caller's transaction) in one parse of
    all its staged files, and the files' new rows; returns the events added per run."""
    for item in staged:
        if item.replaced:
            con.execute("DELETE FROM events WHERE run_id = ?", [item.run_id])
    parts = [(name, item.run_id, first) for item in staged for name, first in item.chunks]
    added: dict[str, int] = {}
    if parts:
        names, run_ids, firsts = (list(column) for column in zip(*parts, strict=True))
        con.execute(_STAGE_EVENTS, [names, names, run_ids, firsts])
        con.execute("INSERT INTO events SELECT * FROM staged_events")
        added = dict(
            con.execute("SELECT run_id, count(*) FROM staged_events GROUP BY run_id").fetchall()
        )
        con.execute("DROP TABLE staged_events")
    rows = []
    for item in staged:
        item.row[2] += item.lines - added.get(item.run_id, 0)  # bad lines
        rows.append([item.run_id, str(item.path), *item.row])
    insert_rows(
        con,
        'INSERT OR REPLACE INTO files (run_id, path, "offset", seq, bad_lines, device, inode, '
        "head_len, head_digest, size, mtime_ns)",
        rows,
    )
    return added


def _without_deep_lines(data: bytes) -> bytes:
    """``data`` (complete lines) with each line that :func:`~titan.telemetry.records.
    parse_json` refuses for its nesting emptied (so it counts as a bad line, as in every other
    reader, and the lines keep their numbers). Only a line with more than
    :data:`~titan.reading.MAX_JSON_DEPTH` opening brackets can be that deep, so
    the others are not decoded here."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return data
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and parse_json(line) is None:
            lines[i] = b""
    return b"\n".join(lines)


def _ids(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None) -> list[str]:
    return [row[0] for row in con.execute(query, params or []).fetchall()]


RunFiles = tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]


def scan_runs_root(runs_root: Path) -> RunFiles:
    """The ``<run id>/events.jsonl`` of the runs root (paths as strings: one ``stat`` each and
    no more, as this runs over every run dir at each ingest) with their ``stat`` key (device,
    inode, size, ``st_mtime_ns``), and the runs that cannot be keyed, with the reason. Needs no
    database: a caller can scan before it opens one, so that the scan does not hold the lock
    (nothing when ``runs_root`` is not a directory)."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    unreadable: dict[str, str] = {}
    if not os.path.isdir(runs_root):
        return found, unreadable
    with os.scandir(runs_root) as entries:
        for entry in entries:
            path = os.path.join(entry.path, EVENTS_FILE)
            key: tuple[int, ...]
            try:
                info = os.stat(path)
                key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            except OSError:
                if not os.path.lexists(path):
                    continue  # not a run dir
                key = ()  # a dangling link: read (and found unreadable) at each ingest
            # A name that is not UTF-8 (its bytes decoded with surrogates) cannot be a key: the
            # run is listed under its bytes written out, as unreadable.
            run_id = os.fsencode(entry.name).decode("utf-8", "backslashreplace")
            if run_id != entry.name:
                unreadable[run_id] = "the run dir's name is not UTF-8; rename the dir"
            else:
                found[run_id] = (path, key)
    return dict(sorted(found.items())), unreadable


def ingest(
    con: duckdb.DuckDBPyConnection,
    runs_root: Path,
    scanned: RunFiles | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> IngestReport:
    """Ingest every ``<runs root>/<run id>/events.jsonl`` whose ``stat`` changed since it was
    last read (new complete lines only; a replaced file from the start) and recompute the
    summaries of the runs that got events; drop the runs whose dir is gone; give a run whose
    file cannot be read the status :data:`UNREADABLE`. A run's id is its directory's name.
    ``scanned``: the :func:`scan_runs_root` of ``runs_root`` when the caller made it.
    ``progress``: called with (run dirs done, run dirs to read) after each batch committed (a
    reader sees the batch from then on)."""
    report = IngestReport()
    found, unreadable = scanned if scanned is not None else scan_runs_root(Path(runs_root))
    unreadable = dict(unreadable)
    known: dict[str, tuple[Any, ...]] = {
        row[0]: tuple(row[1:])
        for row in con.execute(
            'SELECT run_id, device, inode, size, mtime_ns, "offset", seq, bad_lines, device, '
            "inode, head_len, head_digest FROM files"
        ).fetchall()
    }
    gone = [
        run_id
        for run_id in _ids(con, "SELECT run_id FROM files UNION SELECT run_id FROM runs")
        if run_id not in found and run_id not in unreadable
    ]
    with _transaction(con):
        for run_id in gone:
            _forget(con, run_id)
    root = str(runs_root)
    due = functools.partial(_due, root, {run_id: row[4] for run_id, row in known.items()})
    todo = [
        (run_id, Path(path))
        for run_id, (path, key) in found.items()
        if run_id not in known or known[run_id][:4] != key
    ]
    report.deferred = tuple(run_id for run_id, _ in todo if not due(run_id))
    todo = [(run_id, path) for run_id, path in todo if due(run_id)]
    changed: list[str] = []
    if progress is not None and todo:
        progress(0, len(todo))
    with tempfile.TemporaryDirectory(prefix="titan-ingest-") as tmp:
        for start in range(0, len(todo), BATCH_FILES):
            batch = todo[start : start + BATCH_FILES]
            staged, failed = _stage_batch(batch, known, Path(tmp))
            unreadable.update(failed)
            with _transaction(con):
                added = _insert_staged(con, staged)
            new = [i.run_id for i in staged if i.lines or i.replaced]
            report.events += sum(added.values())
            report.bad_lines += sum(i.lines - added.get(i.run_id, 0) for i in staged)
            _refresh_batch(con, new, root)
            changed += new
            if progress is not None:
                progress(start + len(batch), len(todo))
    # A run seen running and silent since may have died: its status is worked out again. So is
    # a run that was unreadable, or that has no summary (an ingest stopped before making it).
    stale = _ids(
        con,
        "SELECT run_id FROM runs WHERE list_contains(?, status) UNION "
        "SELECT run_id FROM files WHERE run_id NOT IN (SELECT run_id FROM runs)",
        [[*_NOT_ENDED, UNREADABLE]],
    )
    done = set(changed)
    refresh = [r for r in sorted(stale) if r not in unreadable and r not in done and due(r)]
    for start in range(0, len(refresh), BATCH_FILES):
        _refresh_batch(con, refresh[start : start + BATCH_FILES], root)
    with _transaction(con):
        for run_id, reason in unreadable.items():
            _store_summary(con, _unreadable_summary(run_id, reason), None)
    report.runs = tuple(changed)
    return report


def _stage_batch(
    batch: list[tuple[str, Path]], known: dict[str, tuple[Any, ...]], tmp: Path
) -> tuple[list[_Staged], dict[str, str]]:
    """:func:`_stage_file` for each ``(run id, path)`` of ``batch``; returns the staged files
    and the runs that could not be read, with the error."""
    staged, failed = [], {}
    for index, (run_id, path) in enumerate(batch):
        row = known.get(run_id)
        try:
            staged.append(_stage_file(path, run_id, row[4:] if row else None, tmp / str(index)))
        except OSError as err:
            failed[run_id] = error_line(err)
    return staged, failed


def _due(root: str, ingested: dict[str, int], run_id: str) -> bool:
    """Whether the run's summary may be computed again in this process: never computed here,
    or :data:`REFRESH_THROTTLE` times its cost (:data:`SUMMARY_S_PER_BYTE` x the bytes of
    record ingested) ago."""
    last = _SUMMARISED_AT.get((root, run_id))
    wait_s = REFRESH_THROTTLE * SUMMARY_S_PER_BYTE * (ingested.get(run_id) or 0)
    return last is None or time.monotonic() - last >= wait_s


def _refresh_batch(con: duckdb.DuckDBPyConnection, run_ids: list[str], root: str) -> None:
    """:func:`refresh_runs` in one transaction; when one of them cannot be summarised (which
    aborts the transaction), each run on its own with :func:`_refresh_or_mark`. Notes when
    each was summarised (:func:`_due`)."""
    if not run_ids:
        return
    now = time.monotonic()
    _SUMMARISED_AT.update(((root, run_id), now) for run_id in run_ids)
    try:
        with _transaction(con):
            refresh_runs(con, run_ids)
    except _SUMMARY_ERRORS:
        for run_id in run_ids:
            _refresh_or_mark(con, run_id)


def _forget(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Drop every row of a run whose dir is gone."""
    for table in ("files", "events", "runs", "perf"):
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


# What summarising a run's stored events can raise on a record no reader foresaw.
_SUMMARY_ERRORS = (ValueError, TypeError, LookupError, AttributeError, RecursionError, duckdb.Error)


def _refresh_or_mark(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """:func:`refresh_runs` of one run; a run whose stored events cannot be summarised (a line
    no reader foresaw) is stored as :data:`UNREADABLE` with the error, and the ingest goes
    on."""
    try:
        with _transaction(con):
            refresh_runs(con, [run_id])
    except _SUMMARY_ERRORS as err:
        _store_summary(con, _unreadable_summary(run_id, error_line(err)), None)


def _unreadable_summary(run_id: str, reason: str) -> RunSummary:
    """The summary of a run that could not be read: nothing known but why."""
    unknown: dict[str, Any] = {f.name: None for f in dataclasses.fields(RunSummary)}
    known = {"run_id": run_id, "status": UNREADABLE, "reason": reason, "badput": {}}
    return RunSummary(**{**unknown, **known, "stalls": 0, "restarts": 0, "bad_lines": 0})


def _accounting_events(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, list]:
    """The events of each run as :func:`ettr.analyze` and :func:`perfdb.measure` need them, in
    file order: step events built from the typed columns with the fields they read, the others
    parsed whole (with the ``time`` of their row). Rows that are not events are left out."""
    rows = con.execute(
        """SELECT run_id, type, time, step, CASE WHEN type = 'step' THEN NULL ELSE payload END,
        step_time_s, data_wait_s FROM events WHERE list_contains(?, run_id) ORDER BY run_id, seq""",
        [run_ids],
    ).fetchall()
    events: dict[str, list[Event]] = {run_id: [] for run_id in run_ids}
    for run_id, kind, at, step, payload, step_time, wait in rows:
        if kind == Step.type:
            if at is not None and step is not None:
                events[run_id].append(
                    Step(time=at, run_id=run_id, step=step, step_time_s=step_time, data_wait_s=wait)
                )
            continue
        line = parse_json(payload)
        event = _parse({**line, "time": at}) if isinstance(line, dict) else None
        if event is not None:
            events[run_id].append(event)
    return events


def _parse(line: Any) -> Event | None:
    """The event of one stored payload; None when it is not one."""
    try:
        return parse_event(line)
    except EventError:
        return None


def _payload_event(payload: str | None) -> Event | None:
    """The event of one stored payload (None: no payload, or not an event)."""
    line = parse_json(payload) if payload is not None else None
    return _parse(line) if isinstance(line, dict) else None


def _mfu_peak(final: Event | None, start: Event | None) -> str:
    """What the run's MFU divides by (:func:`titan.formatting.peak_label`): its last step's
    MFU peak over its last ``run_start``'s devices (``peak unknown`` when that step names
    none)."""
    mfu = final.mfu if isinstance(final, Step) else None
    env = (start.env if isinstance(start, RunStart) else None) or {}
    kinds = env.get("device_kinds")
    names = [k for k in kinds if isinstance(k, str)] if isinstance(kinds, list) else []
    count = env.get("device_count")
    count = count if isinstance(count, int) and not isinstance(count, bool) else None
    flops, kind = (mfu.peak_flops, mfu.peak_kind) if mfu is not None else (None, None)
    return peak_label(flops, kind, names, count)


def _optional(value: Any) -> float | None:
    return value if isinstance(value, int | float) and math.isfinite(value) else None


def compute_summaries(
    con: duckdb.DuckDBPyConnection, run_ids: list[str], events: dict[str, list] | None = None
) -> list[tuple[RunSummary, tuple[Any, ...]]]:
    """The summaries of ingested runs, from the ``events`` table, in a few queries for all of
    them (``events``: their accounting events when the caller already fetched them), each
    with its ``runs`` columns from the first ``run_start``: ``(started_at, preset, layout,
    pp, devices)``, in the order of ``run_ids``."""
    events = _accounting_events(con, run_ids) if events is None else events
    files = {
        run_id: (path, bad)
        for run_id, path, bad in con.execute(
            "SELECT run_id, path, bad_lines FROM files WHERE list_contains(?, run_id)", [run_ids]
        ).fetchall()
    }
    rows = con.execute(_SUMMARY_FACTS, [run_ids, run_ids, run_ids]).fetchall()
    now = time.time()
    result = []
    order = {run_id: i for i, run_id in enumerate(run_ids)}
    for row in sorted(rows, key=lambda r: order[r[0]]):
        run_id, path_bad = row[0], files.get(row[0], (None, 0))
        summary = _summary(run_id, row[1:18], events.get(run_id, []), path_bad, now)
        result.append((summary, (row[3], *row[18:])))
    return result


def _summary(
    run_id: str,
    facts: tuple[Any, ...],
    events: list[Event],
    path_bad: tuple[str | None, int],
    now: float,
) -> RunSummary:
    """One run's summary from its row of :data:`_SUMMARY_FACTS` (after the run id), its
    accounting events and its ``files`` path and bad lines."""
    (steps, tokens, t0, t1, tps, best, energy, energy_tokens, jpt, best_eval, mfu, peak, ips) = (
        facts[:13]
    )
    final, start, end = (_payload_event(p) for p in facts[13:16])
    energy, tps, jpt = _optional(energy), _optional(tps), _optional(jpt)  # a sum may overflow
    if energy_tokens and energy:
        tokens_per_j = energy_tokens / energy
    elif jpt:
        tokens_per_j = 1 / jpt
    else:
        tokens_per_j = None
    judged = _liveness(run_id, path_bad[0], start, end, t1, facts[16] == Stall.type)
    goodput = ettr.analyze(events, now=ettr_now(judged.state, now))
    power = (start.power if isinstance(start, RunStart) else None) or {}
    programs = [e.run_program_bytes for e in events if isinstance(e, Compile)]
    compiled = max((b for b in programs if b is not None), default=None)
    memory_check = (start.memory_check if isinstance(start, RunStart) else None) or {}
    ended = end if isinstance(end, RunEnd) else None
    return RunSummary(
        run_id=run_id,
        status=judged.state,
        reason=ended.reason if ended is not None else judged.describe().partition(": ")[2] or None,
        steps=steps,
        tokens=tokens,
        wall_s=(t1 - t0) if t0 is not None and t1 is not None else None,
        median_tokens_per_s=tps,
        median_images_per_s=_optional(ips),
        median_mfu=_optional(mfu),
        mfu_convention=MFU_CONVENTION if _optional(mfu) is not None else None,
        mfu_peak=_mfu_peak(final, start) if _optional(mfu) is not None else None,
        mfu_reason=None if mfu is not None or not isinstance(final, Step) else final.mfu_reason,
        energy_j=energy,
        energy_reason=None if energy is not None else power.get("reason"),
        tokens_per_j=tokens_per_j,
        ettr=goodput.ettr,
        goodput=goodput.goodput,
        badput=goodput.as_dict()["badput"],
        stalls=sum(a.stalls for a in goodput.attempts),
        restarts=goodput.restarts,
        final_loss=_optional(final.loss) if isinstance(final, Step) else None,
        best_loss=_optional(best),
        bad_lines=int(path_bad[1] or 0),
        peak_memory_bytes=_optional(peak),
        compiled_memory_bytes=_optional(compiled),
        memory_estimate_bytes=_optional(memory_check.get("estimate_bytes")),
        best_eval_loss=_optional(best_eval),
        error=ended.error if ended is not None else None,
    )


def refresh_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> list[RunSummary]:
    """Recompute and store the rows of ``runs`` and ``perf`` of ``run_ids`` (a few queries for
    all of them)."""
    events = _accounting_events(con, run_ids)
    perfdb.store(
        con,
        run_ids,
        [row for r in run_ids if (row := perfdb.measure(r, events[r])) is not None],
    )
    computed = compute_summaries(con, run_ids, events)
    insert_rows(con, _STORE_SUMMARY, [_summary_row(s, first) for s, first in computed])
    return [s for s, _ in computed]


# Rows of ``runs``: the summary's columns, then its first run_start's.
_STORE_SUMMARY = "INSERT OR REPLACE INTO runs"


def _summary_row(s: RunSummary, first: tuple[Any, ...] | None) -> list[Any]:
    """The values of :data:`_STORE_SUMMARY` (``first``: started_at, preset, layout, pp and
    devices of the first ``run_start``; None when unknown)."""
    started_at, preset, layout, pp, devices = first or (None,) * 5
    return [
        s.run_id,
        s.status,
        s.steps,
        s.tokens,
        s.wall_s,
        s.median_tokens_per_s,
        s.median_mfu,
        s.ettr,
        s.goodput,
        s.stalls,
        s.restarts,
        s.final_loss,
        s.best_loss,
        json.dumps(s.as_dict()),
        s.tokens_per_j,
        started_at,
        preset,
        layout,
        pp,
        devices,
        s.best_eval_loss,
    ]


def _store_summary(
    con: duckdb.DuckDBPyConnection, s: RunSummary, first: tuple[Any, ...] | None
) -> None:
    """Write one run's row of ``runs``."""
    insert_rows(con, _STORE_SUMMARY, [_summary_row(s, first)])


def _liveness(
    run_id: str, path: str | None, start: Any, end: Any, last_at: float | None, stalled: bool
) -> liveness.Liveness:
    """The run's state by :func:`titan.analysis.liveness.judge`, from its stored events
    and its run dir (the dir of its events file ``path``)."""
    facts = liveness.RecordFacts(
        started=isinstance(start, RunStart),
        process=ProcessId.of(start.process) if isinstance(start, RunStart) else None,
        end_status=end.status if isinstance(end, RunEnd) else None,
        end_error=end.error if isinstance(end, RunEnd) else None,
        last_event_at=last_at,
        stalled=stalled,
        allowance_s=(
            liveness.run_allowance_s(start) if isinstance(start, RunStart) else HEARTBEAT_TIMEOUT_S
        ),
    )
    return liveness.judge(Path(path).parent if path else Path(run_id), facts)


def summaries(
    con: duckdb.DuckDBPyConnection, run_id: str | None = None, recent: int | None = None
) -> list[RunSummary]:
    """The stored summaries, by run id (one run's when ``run_id`` is given). ``recent``: only
    the ``recent`` runs that started last (by their first ``run_start``; runs without one count
    as the oldest), still listed by run id."""
    where = "WHERE ? IS NULL OR run_id = ?"
    params: list[str | int | None]
    if recent is None:
        query, params = f"SELECT summary FROM runs {where} ORDER BY run_id", [run_id, run_id]
    else:
        query = (
            f"SELECT summary FROM (SELECT run_id, summary FROM runs {where} "
            "ORDER BY started_at DESC NULLS LAST, run_id DESC LIMIT ?) ORDER BY run_id"
        )
        params = [run_id, run_id, max(0, recent)]
    rows = con.execute(query, params).fetchall()
    known = {f.name for f in dataclasses.fields(RunSummary)}
    return [RunSummary(**{k: v for k, v in json.loads(r[0]).items() if k in known}) for r in rows]


def run_count(con: duckdb.DuckDBPyConnection) -> int:
    """The runs of the database (every row of ``runs``)."""
    row = con.execute("SELECT count(*) FROM runs").fetchone()
    assert row is not None  # count(*) returns one row
    return row[0]


def ettr_now(state: str, now: float) -> float | None:
    """The ``now`` that :func:`titan.analysis.ettr.analyze` takes for a run judged ``state``
    (:mod:`titan.analysis.liveness`): ``now`` while the run may still be going, else None (a
    run judged dead counts its last attempt as crashed, not as running until ETTR's window
    has passed)."""
    return now if state in _NOT_ENDED else None


def summarize_run_dir(run_dir: Path) -> RunSummary:
    """The summary of one run dir, computed as :func:`summarize` does but in an in-memory
    database: nothing is written next to the run. The run id is the dir's name.

    Raises:
        TitanError: its ``events.jsonl`` cannot be read (missing, unreadable, a directory).
    """
    run_dir = Path(run_dir)
    con = duckdb.connect(":memory:")
    try:
        _create_tables(con)
        with tempfile.TemporaryDirectory(prefix="titan-ingest-") as tmp:
            try:
                staged = _stage_file(run_dir / EVENTS_FILE, run_dir.name, None, Path(tmp, "0"))
            except OSError as err:
                raise TitanError(
                    f"cannot read {run_dir / EVENTS_FILE}: {error_line(err)}"
                ) from None
            with _transaction(con):
                _insert_staged(con, [staged])
        return compute_summaries(con, [run_dir.name])[0][0]
    finally:
        con.close()


@contextlib.contextmanager
def ingested(runs_root: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """The runs root's database (:func:`connect`) with every record ingested (:func:`ingest`,
    its progress in a terminal: :func:`titan.progress_bar.progress_bar`), closed when the
    block ends.

    Raises:
        TitanError: as :func:`connect`.
    """
    with waits_told(lambda line: print(inert(f"titan: {line}"), file=sys.stderr, flush=True)):
        con = connect(runs_root)
    try:
        with guarded(database_path(Path(runs_root))):
            with progress_bar("ingesting run records: run dirs") as update:
                ingest(con, runs_root, progress=update)
            yield con
    finally:
        con.close()


def summarize(runs_root: Path) -> list[RunSummary]:
    """Ingest ``runs_root`` into its database and return every run's summary.

    Raises:
        TitanError: as :func:`connect` (no runs root, a database that cannot be opened or is
            held by another writer).
    """
    with ingested(runs_root) as con:
        return summaries(con)
