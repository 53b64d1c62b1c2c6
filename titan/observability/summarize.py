"""Run records into DuckDB: incremental ingest of ``events.jsonl`` files and per-run summaries.

The database is ``<runs root>/titan.duckdb``. DuckDB allows one read-write process at a time, so
the trainer never opens it: it appends JSON lines, and ``titan summarize`` (or the console) is the
one writer. Tables:

- ``files(run_id, path, offset, seq, bad_lines)``: how far each run's ``events.jsonl`` was read
  (keyed by run id, the run dir's name, so a moved runs root is not read twice). Only
  complete lines are consumed (a torn last line waits for the next ingest, as in
  :class:`titan.observability.records.EventTail`); a complete line that is not a JSON object is
  skipped and counted. A file shorter than its recorded offset was replaced: its run is re-read.
- ``events(run_id, seq, type, time, step, <fields>, payload)``: one row per event; ``seq`` is the
  line number in the file; the fields of :data:`EVENT_FIELDS` copied into typed columns (NULL when
  absent or of another type); ``payload`` the whole event as JSON, unknown types and fields
  included.
- ``meta``: the tables' version; tables of another version are dropped and rebuilt from the
  records.

Parsing happens inside DuckDB (``read_text`` of the new complete lines staged in a temporary
file, ``json_transform`` of each line once): Python never decodes the events one by one.
- ``runs``: one row per run, recomputed for the runs that got new events (:class:`RunSummary`).
- ``perf``: measured step times, see :mod:`titan.observability.perfdb`.

Each file is ingested in one transaction (events and the new offset together), so an interrupted
ingest leaves no half; a second ingest of unchanged files adds nothing. Every query takes its
values as parameters: run ids and paths are never put into SQL text.

Summary fields: ``wall_s`` is the first ``run_start`` to the last event (gaps between attempts
included); ``median_tokens_per_s`` and ``median_mfu`` are medians over step events (MFU under
:data:`titan.observability.events.MFU_CONVENTION`, ``causal``);
``energy_j`` sums step events' ``energy_j`` (the step's energy) and ``tokens_per_j`` is the tokens
of those steps over it (else 1 / median ``joules_per_token``); ``mfu_reason`` (the last step's)
and ``energy_reason`` (``run_start``'s ``power.reason``) say why one is missing; ``status`` is
the last attempt's ``run_end`` status; without one, ``running`` when its last event is recent
(:data:`titan.observability.ettr.RUNNING_WINDOW_S`; such runs are worked out again at each
ingest) and ``crashed`` otherwise; ETTR and goodput come from :mod:`titan.observability.ettr`.

Readers here go through :mod:`titan.observability.events`: the typed columns are named after
event fields, and whole events (for ETTR, the performance database and the summary's reasons)
are parsed with :func:`~titan.observability.events.parse_event`.

This module imports DuckDB but not JAX or Textual.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from titan.errors import TitanError
from titan.observability import ettr, perfdb
from titan.observability.events import (
    MFU_CONVENTION,
    Event,
    EventError,
    RunEnd,
    RunStart,
    Step,
    parse_event,
)
from titan.observability.records import EVENTS_FILE

DB_FILE = "titan.duckdb"
READ_CHUNK_BYTES = 32 << 20

# Bump when a table changes: the database is a cache of the JSONL records, rebuilt on mismatch.
DB_VERSION = 2
# Fields of the events (titan.observability.events) copied into typed columns (NULL when absent
# or of another type), so that summaries do not parse the JSON payload again.
EVENT_FIELDS = {
    "type": "VARCHAR",
    "time": "DOUBLE",
    "step": "BIGINT",
    "step_time_s": "DOUBLE",
    "loss": "DOUBLE",
    "tokens": "BIGINT",
    "tokens_seen": "BIGINT",
    "tokens_per_s": "DOUBLE",
    "data_wait_s": "DOUBLE",
    "energy_j": "DOUBLE",
    "joules_per_token": "DOUBLE",
    "seconds": "DOUBLE",
    "mfu": "JSON",
}
_TABLES = ("files", "events", "runs", "perf")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS files (run_id VARCHAR PRIMARY KEY, path VARCHAR,
    "offset" BIGINT, seq BIGINT, bad_lines BIGINT)""",
    "CREATE TABLE IF NOT EXISTS events (run_id VARCHAR, seq BIGINT, "
    + ", ".join(f"{name} {kind}" for name, kind in EVENT_FIELDS.items())
    + ", payload JSON)",
    """CREATE TABLE IF NOT EXISTS runs (run_id VARCHAR PRIMARY KEY, status VARCHAR,
    steps BIGINT, tokens BIGINT, wall_s DOUBLE, median_tokens_per_s DOUBLE, median_mfu DOUBLE,
    ettr DOUBLE, goodput DOUBLE, stalls BIGINT, restarts BIGINT, final_loss DOUBLE,
    best_loss DOUBLE, summary JSON)""",
)
# The complete lines of a staged file, numbered from a parameter, the JSON objects among them
# transformed to the typed columns in one parse each (json_transform gives NULL for a field of
# another type). Parameters: run id, first seq, staged file.
_INSERT_EVENTS = (
    "INSERT INTO events SELECT ?, seq, "
    + ", ".join(f"e.{name}" for name in EVENT_FIELDS)
    + ", line::JSON FROM (SELECT seq, line, json_transform(line, '"
    + json.dumps(EVENT_FIELDS)
    + """') AS e FROM (SELECT ? + i - 1 AS seq, lines[i] AS line
    FROM (SELECT string_split(content, chr(10)) AS lines FROM read_text(?)),
    generate_series(1, len(lines) - 1) AS g(i))
    WHERE json_valid(line) AND json_type(line) = 'OBJECT')"""
)


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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class IngestReport:
    """What one :func:`ingest` did: events added, runs recomputed, bad lines skipped (by this
    ingest; ``RunSummary.bad_lines`` counts all of a run's)."""

    events: int = 0
    runs: tuple[str, ...] = ()
    bad_lines: int = 0


def database_path(runs_root: Path) -> Path:
    return Path(runs_root) / DB_FILE


def connect(runs_root: Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the runs root's database with its tables.

    Raises:
        TitanError: the runs root does not exist, or another process holds the database.
    """
    root = Path(runs_root)
    if not root.is_dir():
        raise TitanError(f"runs root {root} does not exist (give RUNS_ROOT or set $TITAN_RUNS)")
    try:
        con = duckdb.connect(str(database_path(root)), read_only=read_only)
    except duckdb.Error as err:
        raise TitanError(f"{database_path(root)}: {str(err).splitlines()[0]}") from None
    if not read_only:
        _create_tables(con)
    return con


def _create_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables; drop and recreate them when they were made by another version."""
    con.execute(_SCHEMA[0])
    version = con.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
    if version is not None and version[0] != str(DB_VERSION):
        for table in _TABLES:
            con.execute(f"DROP TABLE IF EXISTS {table}")
    for statement in (*_SCHEMA[1:], *perfdb.SCHEMA):
        con.execute(statement)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", [str(DB_VERSION)])


def _ingest_file(
    con: duckdb.DuckDBPyConnection, path: Path, run_id: str, tmp: Path
) -> tuple[int, int, bool]:
    """Add the new complete lines of one events file. Returns the events added, the bad lines
    skipped and whether the file had been replaced (its run's events were read again)."""
    known = con.execute(
        'SELECT "offset", seq, bad_lines FROM files WHERE run_id = ?', [run_id]
    ).fetchone()
    offset, seq, bad = known if known else (0, 0, 0)
    size = path.stat().st_size
    con.execute("BEGIN TRANSACTION")
    try:
        replaced = size < offset
        if replaced:
            con.execute("DELETE FROM events WHERE run_id = ?", [run_id])
            offset, seq, bad = 0, 0, 0
        added, bad_before = 0, bad
        with open(path, "rb") as f:
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
                lines = chunk.count(b"\n", 0, end + 1)
                staged = tmp / "batch.jsonl"
                # read_text needs UTF-8: undecodable bytes become U+FFFD.
                staged.write_bytes(chunk[: end + 1].decode("utf-8", "replace").encode("utf-8"))
                count = con.execute(_INSERT_EVENTS, [run_id, seq, str(staged)]).fetchone()[0]
                seq += lines
                bad += lines - count
                added += count
        con.execute(
            'INSERT OR REPLACE INTO files (run_id, path, "offset", seq, bad_lines) '
            "VALUES (?, ?, ?, ?, ?)",
            [run_id, str(path), offset, seq, bad],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return added, bad - bad_before, replaced


def ingest(con: duckdb.DuckDBPyConnection, runs_root: Path) -> IngestReport:
    """Ingest every ``<runs root>/<run id>/events.jsonl`` (new complete lines only) and
    recompute the summaries of the runs that got events. A run's id is its directory's name."""
    report = IngestReport()
    changed = []
    with tempfile.TemporaryDirectory(prefix="titan-ingest-") as tmp:
        for path in sorted(Path(runs_root).glob(f"*/{EVENTS_FILE}")):
            added, bad, replaced = _ingest_file(con, path, path.parent.name, Path(tmp))
            report.events += added
            report.bad_lines += bad
            if added or bad or replaced:
                changed.append(path.parent.name)
    # A run seen running and silent since may have died: its status is worked out again.
    running = con.execute("SELECT run_id FROM runs WHERE status = ?", [ettr.RUNNING]).fetchall()
    for run_id in dict.fromkeys([*changed, *(r[0] for r in running)]):
        refresh_run(con, run_id)
    report.runs = tuple(changed)
    return report


def _accounting_events(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Event]:
    """The run's events as :func:`ettr.analyze` and :func:`perfdb.record` need them: step events
    built from the typed columns with the fields they read, the others parsed whole (with the
    ``time`` of their row). Rows that are not events are left out."""
    rows = con.execute(
        """SELECT type, time, step, CASE WHEN type = 'step' THEN NULL ELSE payload END,
        step_time_s, data_wait_s FROM events WHERE run_id = ? ORDER BY seq""",
        [run_id],
    ).fetchall()
    events: list[Event] = []
    for kind, at, step, payload, step_time, wait in rows:
        if kind == Step.type:
            if at is not None and step is not None:
                events.append(
                    Step(time=at, run_id=run_id, step=step, step_time_s=step_time, data_wait_s=wait)
                )
            continue
        event = _parse({**json.loads(payload), "time": at})
        if event is not None:
            events.append(event)
    return events


def _parse(line: Any) -> Event | None:
    """The event of one stored payload; None when it is not one."""
    try:
        return parse_event(line)
    except EventError:
        return None


def _last_event(con: duckdb.DuckDBPyConnection, run_id: str, types: tuple[str, ...]) -> Any:
    """The run's last event of one of ``types`` (None when there is none)."""
    row = con.execute(
        """SELECT payload FROM events WHERE run_id = ? AND list_contains(?, type)
        ORDER BY seq DESC LIMIT 1""",
        [run_id, list(types)],
    ).fetchone()
    return _parse(json.loads(row[0])) if row else None


def _mfu(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[float | None, str | None]:
    """Median MFU over step events, under :data:`MFU_CONVENTION`, and that convention (None,
    None when no step recorded one)."""
    median = con.execute(
        """SELECT median(TRY_CAST(json_extract_string(mfu, ?) AS DOUBLE)) FROM events
        WHERE run_id = ? AND type = 'step' AND mfu IS NOT NULL""",
        ["$." + MFU_CONVENTION, run_id],
    ).fetchone()[0]
    return (median, MFU_CONVENTION) if median is not None else (None, None)


def _optional(value: Any) -> float | None:
    return value if isinstance(value, int | float) and math.isfinite(value) else None


def compute_summary(
    con: duckdb.DuckDBPyConnection, run_id: str, events: list[dict[str, Any]] | None = None
) -> RunSummary:
    """The summary of one ingested run, from the ``events`` table (``events``: the run's
    accounting events when the caller already fetched them)."""
    (steps, tokens, t0, t1, tps, best, energy, energy_tokens, jpt) = con.execute(
        """SELECT max(step) FILTER (type = 'step'),
        max(tokens_seen) FILTER (type = 'step'),
        min(time) FILTER (type = 'run_start'), max(time),
        median(tokens_per_s) FILTER (type = 'step'),
        min(loss) FILTER (type = 'step' AND isfinite(loss)),
        sum(energy_j) FILTER (type = 'step'),
        sum(tokens) FILTER (type = 'step' AND energy_j IS NOT NULL),
        median(joules_per_token) FILTER (type = 'step')
        FROM events WHERE run_id = ?""",
        [run_id],
    ).fetchone()
    final = _last_event(con, run_id, (Step.type,))
    start = _last_event(con, run_id, (RunStart.type,))
    end = _last_event(con, run_id, (RunStart.type, RunEnd.type))
    bad = con.execute(
        "SELECT coalesce(sum(bad_lines), 0) FROM files WHERE run_id = ?", [run_id]
    ).fetchone()[0]
    goodput = ettr.analyze(
        _accounting_events(con, run_id) if events is None else events, now=time.time()
    )
    mfu, convention = _mfu(con, run_id)
    if energy_tokens and energy:
        tokens_per_j = energy_tokens / energy
    elif jpt:
        tokens_per_j = 1 / jpt
    else:
        tokens_per_j = None
    ended = isinstance(end, RunEnd)
    power = (start.power if isinstance(start, RunStart) else None) or {}
    return RunSummary(
        run_id=run_id,
        status=end.status if ended else _unended_status(goodput),
        reason=end.reason if ended else None,
        steps=steps,
        tokens=tokens,
        wall_s=(t1 - t0) if t0 is not None and t1 is not None else None,
        median_tokens_per_s=tps,
        median_mfu=mfu,
        mfu_convention=convention,
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
        bad_lines=int(bad),
    )


def refresh_run(con: duckdb.DuckDBPyConnection, run_id: str) -> RunSummary:
    """Recompute and store one run's rows of ``runs`` and ``perf``."""
    events = _accounting_events(con, run_id)
    perfdb.record(con, run_id, events)
    s = compute_summary(con, run_id, events)
    con.execute(
        """INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        [
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
        ],
    )
    return s


def _unended_status(goodput: ettr.Goodput) -> str:
    """``running`` or ``crashed`` for a run whose last attempt has no ``run_end``."""
    return goodput.attempts[-1].status if goodput.attempts else ettr.CRASHED


def summaries(con: duckdb.DuckDBPyConnection, run_id: str | None = None) -> list[RunSummary]:
    """The stored summaries, by run id (one run's when ``run_id`` is given)."""
    rows = con.execute(
        "SELECT summary FROM runs WHERE ? IS NULL OR run_id = ? ORDER BY run_id",
        [run_id, run_id],
    ).fetchall()
    known = {f.name for f in dataclasses.fields(RunSummary)}
    return [RunSummary(**{k: v for k, v in json.loads(r[0]).items() if k in known}) for r in rows]


def summarize_run_dir(run_dir: Path) -> RunSummary:
    """The summary of one run dir, computed as :func:`summarize` does but in an in-memory
    database: nothing is written next to the run. The run id is the dir's name."""
    run_dir = Path(run_dir)
    con = duckdb.connect(":memory:")
    try:
        _create_tables(con)
        with tempfile.TemporaryDirectory(prefix="titan-ingest-") as tmp:
            _ingest_file(con, run_dir / EVENTS_FILE, run_dir.name, Path(tmp))
        return compute_summary(con, run_dir.name)
    finally:
        con.close()


def summarize(runs_root: Path) -> list[RunSummary]:
    """Ingest ``runs_root`` into its database and return every run's summary.

    Raises:
        TitanError: the runs root does not exist or its database is held by another writer.
    """
    con = connect(runs_root)
    try:
        ingest(con, runs_root)
        return summaries(con)
    finally:
        con.close()
