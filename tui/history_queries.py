"""Run history from the runs root's DuckDB database, for the History screens.

The console is the database's one writer: :class:`HistoryStore` ingests the run records with
:func:`titan.analysis.summarize.ingest` (the same code as ``titan summarize``) and reads the
``runs`` and ``events`` tables. Every method opens the database, runs its queries and closes
it (a page asked for with ``hold_s`` keeps its connection open that long for the next key:
:data:`READ_HOLD_S`); call them from a thread worker, never from the UI thread. A lock
serialises the ingests;
reads run beside an ingest (the connections of one process share the database, and a read sees
what the ingest has committed), so that a page never waits for a 100k-run ingest.
History is read a page at a time (:class:`HistoryQuery`): sorting, filtering and counting happen
in SQL, so a runs root of 100k runs costs the same page of rows as one of ten.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from titan.analysis import summarize
from titan.analysis.summarize import IngestReport, RunSummary
from titan.errors import TitanError
from titan.reading import parse_json
from titan.telemetry.events import RunStart, Stall, parse_events

# Points of a loss curve at most (nvitop-like restraint: more than a terminal can draw is waste).
MAX_CURVE_POINTS = 2000
EXPORT_FORMATS = ("csv", "parquet")
# Options that say where a run was placed, not how it trained: every two runs differ there.
NOT_COMPARED = ("run_id", "runs_root")
# Rows of History fetched at a time: the table holds one page, never every run (a page fills
# the tallest terminal; Textual's DataTable adds rows at about a millisecond each).
PAGE_ROWS = 100

# Seconds a read connection asked to be held stays open after its last page, and at most in
# all (then it is closed and opened again, so that another process, whose connect retries for
# LOCK_WAIT_S, finds the file free between the keys of someone paging on and on). Opening the
# database costs about 15 ms of CPU whatever its size (DuckDB's connection setup: the same for
# ':memory:'), the most of a sorted page at 100k runs (bench/console.py --scale); the keys of
# someone browsing History come in bursts (typing a filter takes a second or two).
READ_HOLD_S = 2.0
READ_HOLD_MAX_S = 10.0

# The sortable History fields (HistoryRow's names) and their SQL over the ``runs`` table
# (:mod:`titan.analysis.summarize` stores the first run_start's config there). Only these
# names are put into SQL text.
_LAYOUT = "CASE WHEN layout = 'mpmd' AND pp > 0 THEN 'mpmd pp' || pp ELSE layout END"
SORT_FIELDS = {
    "run_id": "run_id",
    "status": "status",
    "preset": "preset",
    "layout": _LAYOUT,
    "devices": "devices",
    "steps": "steps",
    "tokens_per_s": "median_tokens_per_s",
    "mfu": "median_mfu",
    "tokens_per_j": "tokens_per_j",
    "ettr": "ettr",
    "best_loss": "best_loss",
    "started_at": "started_at",
}
# The columns a filter looks in, each by itself: a text matches a run when one of them holds it.
FILTER_FIELDS = ("run_id", "status", "preset", "layout")
# The columns of a page (no payload: a page reads only what its rows show). Format field: the
# WHERE clause.
_SELECT = (
    "SELECT "
    + ", ".join(f"{sql} AS {name}" for name, sql in SORT_FIELDS.items())
    + " FROM runs{where}"
)
# The runs holding a text (lower-case; parameters: the text once per FILTER_FIELDS name): each
# column lower-cased and searched on its own, which DuckDB scans at about 15 ms per 100k runs
# where one concatenated string per run costs twice that (bench/console.py --scale).
_WHERE = " WHERE " + " OR ".join(f"contains(lower({SORT_FIELDS[f]}), ?)" for f in FILTER_FIELDS)
_ORDER = " ORDER BY {column} {direction} NULLS LAST, run_id"
# Min-max decimation of a loss curve: the steps cut into ? buckets of equal width, each giving
# its lowest and highest point (one when they are the same step), so that spikes and dips
# survive the downsampling (M4 without first/last: Jugel et al. 2014, "M4: A
# Visualization-Oriented Time Series Data Aggregation", VLDB). Parameters: run id, buckets.
_LOSS_CURVE = """
WITH s AS (SELECT step, loss FROM events
    WHERE run_id = ? AND type = 'step' AND loss IS NOT NULL AND isfinite(loss)),
    m AS (SELECT min(step) AS first, max(step) AS last FROM s),
    b AS (SELECT floor((step - m.first) * ?::DOUBLE / (m.last - m.first + 1)) AS bucket,
        arg_min(step, loss) AS low_step, min(loss) AS low,
        arg_max(step, loss) AS high_step, max(loss) AS high
    FROM s, m GROUP BY bucket)
SELECT DISTINCT * FROM (SELECT low_step, low FROM b UNION ALL SELECT high_step, high FROM b)
ORDER BY 1
"""


@dataclass(frozen=True)
class HistoryQuery:
    """Which runs History shows and in which order.

    Attributes:
        sort: a :data:`SORT_FIELDS` name. descending: the order (runs without a value last).
        text: keep the runs with this text (case-insensitive) in their run id, status, preset
            or layout; '' keeps all.
        offset: the first row (0-based) of the page. limit: rows of the page.
    """

    sort: str = "started_at"
    descending: bool = True
    text: str = ""
    offset: int = 0
    limit: int = PAGE_ROWS

    def where(self) -> tuple[str, list[Any]]:
        """The WHERE clause of the filter ('' without one) and its parameters."""
        text = self.text.strip().lower()
        return (_WHERE, [text] * len(FILTER_FIELDS)) if text else ("", [])

    def sql(self) -> tuple[str, list[Any]]:
        """The SELECT of every matching row in order (no page) and its parameters."""
        where, params = self.where()
        order = _ORDER.format(
            column=SORT_FIELDS[self.sort], direction="DESC" if self.descending else "ASC"
        )
        return _SELECT.format(where=where) + order, params


@dataclass(frozen=True)
class HistoryPage:
    """One page of History: the query asked, its rows, where they start, the runs matching
    and all runs."""

    query: HistoryQuery
    rows: list[HistoryRow]
    offset: int
    matched: int
    total: int


@dataclass(frozen=True)
class HistoryRow:
    """One run of the History table (None where the records do not say); the fields are the
    keys of :data:`SORT_FIELDS`, in its order.

    Attributes:
        run_id: the run dir's name. status: the run's state at the last ingest
            (:func:`titan.analysis.liveness.judge`).
        preset, layout: from ``run_start``'s config (layout ``mpmd pp2`` for a pipeline).
        devices: devices the layout uses. steps: the last step.
        tokens_per_s, mfu: medians over step events. tokens_per_j: tokens per joule.
        ettr: effective training time ratio. best_loss: lowest finite loss.
        started_at: unix seconds of the first ``run_start``.
    """

    run_id: str
    status: str
    preset: str | None
    layout: str | None
    devices: int | None
    steps: int | None
    tokens_per_s: float | None
    mfu: float | None
    tokens_per_j: float | None
    ettr: float | None
    best_loss: float | None
    started_at: float | None


@dataclass(frozen=True)
class RunDetail:
    """What the detail screen shows about one run.

    Attributes:
        summary: the stored :class:`RunSummary`.
        config: ``run_start``'s config (the latest attempt's).
        environment: ``run_start``'s ``env`` (versions, devices, host, git).
        attempts: ``(time, start_step, resumed_from_step)`` of each ``run_start``.
        stalls: the ``stall`` events.
    """

    summary: RunSummary
    config: dict[str, Any]
    environment: dict[str, Any]
    attempts: list[tuple[float, int | None, int | None]]
    stalls: list[Stall]


class HistoryStore:
    """The console's access to ``<runs root>/titan.duckdb``. DuckDB admits one writing process
    at a time, so each operation opens the database and closes it when done: between them,
    ``titan summarize`` or ``titan perf check`` in another terminal can use it.

    Args:
        runs_root: the runs root whose records are ingested.

    Every method raises :class:`~titan.errors.TitanError` when another process holds the
    database at that moment, or DuckDB fails on it (a corrupt file:
    :func:`titan.analysis.summarize.guarded`).
    """

    def __init__(self, runs_root: Path) -> None:
        self.runs_root = Path(runs_root)
        self._lock = threading.Lock()
        self._held: duckdb.DuckDBPyConnection | None = None  # the held read connection
        self._held_lock = threading.Lock()
        self._held_users = 0
        self._held_opened = 0.0  # time.monotonic() when it was opened
        self._held_until = 0.0  # time.monotonic() after which it is closed when unused
        # Called (from the thread that connects) with one line when another process holds the
        # database: the connect waits for it meanwhile.
        self.on_held: Callable[[str], None] | None = None

    def _connect(self) -> duckdb.DuckDBPyConnection:
        """:func:`titan.analysis.summarize.connect`, telling :attr:`on_held` at once when
        another process holds the database (the connect then waits for it)."""
        with summarize.waits_told(self._tell_held):
            return summarize.connect(self.runs_root)

    def _tell_held(self, line: str) -> None:
        if self.on_held is not None:
            self.on_held(line)

    @contextlib.contextmanager
    def _connection(self, writing: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection; ``writing`` (or while there is no database yet: its first connection
        makes the tables), under the lock."""
        lock = self._lock if writing or not self.exists() else contextlib.nullcontext()
        with lock:
            con = self._connect()
            try:
                with summarize.guarded(summarize.database_path(self.runs_root)):
                    yield con
            finally:
                con.close()

    @contextlib.contextmanager
    def _reader(self, hold_s: float = 0.0) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read connection: a cursor of the held connection when one is open (``hold_s``
        opens it, once the database exists, and keeps it open for ``hold_s`` after this use,
        :data:`READ_HOLD_MAX_S` at most in all), else a connection of its own
        (:meth:`_connection`)."""
        with self._held_lock:
            if self._held is None and hold_s > 0 and self.exists():
                self._held = self._connect()
                self._held_opened = time.monotonic()
            held = self._held
            self._held_users += held is not None
        if held is None:
            with self._connection() as con:
                yield con
            return
        cursor = held.cursor()
        try:
            with summarize.guarded(summarize.database_path(self.runs_root)):
                yield cursor
        finally:
            cursor.close()
            with self._held_lock:
                self._held_users -= 1
                now = time.monotonic()
                if hold_s > 0:
                    until = max(self._held_until, now + hold_s)
                    self._held_until = min(until, self._held_opened + READ_HOLD_MAX_S)
                timer = threading.Timer(max(0.0, self._held_until - now), self._release_held)
                timer.daemon = True
                timer.start()

    def _release_held(self) -> None:
        """Close the held connection when unused and its time is up (a timer after each use)."""
        with self._held_lock:
            if self._held is not None and not self._held_users:
                if time.monotonic() >= self._held_until:
                    self._held.close()
                    self._held = None

    def exists(self) -> bool:
        """Whether the runs root has a database already (a first ingest makes it)."""
        return summarize.database_path(self.runs_root).is_file()

    def ingest(self, progress: Callable[[int, int], None] | None = None) -> IngestReport:
        """Ingest the new complete lines of every run record; ``progress`` is called with (run
        dirs read, run dirs to read) after each batch is committed (a page shows it from then
        on).

        Raises:
            TitanError: the runs root does not exist or another process holds the database.
        """
        scanned = summarize.scan_runs_root(self.runs_root)  # unlocked: pages meanwhile
        with self._connection(writing=True) as con:
            return summarize.ingest(con, self.runs_root, scanned, progress)

    def page(self, query: HistoryQuery, hold_s: float = 0.0) -> HistoryPage:
        """One page of the runs matching ``query``, sorted, filtered and counted in SQL (an
        offset past the end gives the last ``limit`` rows); ``hold_s``: keep the connection
        open that long after it, for the next page (:data:`READ_HOLD_S`)."""
        select, params = query.sql()
        where, where_params = query.where()
        with self._reader(hold_s) as con:
            total = summarize.run_count(con)
            matched = total
            if where:  # counted without sorting or building the page's columns
                counted = con.execute(f"SELECT count(*) FROM runs{where}", where_params).fetchone()
                assert counted is not None  # count(*) returns one row
                matched = counted[0]
            offset = query.offset if query.offset < matched else max(0, matched - query.limit)
            found = con.execute(
                f"{select} LIMIT ? OFFSET ?", [*params, query.limit, offset]
            ).fetchall()
        return HistoryPage(query, [HistoryRow(*row) for row in found], offset, matched, total)

    def loss_curve(
        self, run_id: str, max_points: int = MAX_CURVE_POINTS
    ) -> list[tuple[int, float]]:
        """``(step, loss)`` of a run, in step order: every point when there are at most
        ``max_points // 2`` steps, else the lowest and highest point of each of
        ``max_points // 2`` buckets of steps (at most ``max_points`` points)."""
        with self._connection() as con:
            return con.execute(_LOSS_CURVE, [run_id, max(1, max_points // 2)]).fetchall()

    def detail(self, run_id: str) -> RunDetail:
        """Summary, config, environment, attempts and stalls of one run.

        Raises:
            TitanError: the run is no longer in the database (its dir was removed since it was
                listed), or as :func:`titan.analysis.summarize.connect`.
        """
        with self._connection() as con:
            found = summarize.summaries(con, run_id)
            if not found:
                raise TitanError(f"run {run_id} is gone: its dir was removed from the runs root")
            (summary,) = found
            rows = con.execute(
                "SELECT time, payload FROM events WHERE run_id = ? "
                "AND type IN ('run_start', 'stall') ORDER BY seq",
                [run_id],
            ).fetchall()
        lines = ((t, parse_json(p)) for t, p in rows)
        events, _ = parse_events({**line, "time": t} for t, line in lines if isinstance(line, dict))
        starts = [e for e in events if isinstance(e, RunStart)]
        last = starts[-1] if starts else RunStart()
        return RunDetail(
            summary=summary,
            config=last.config or {},
            environment=last.env or {},
            attempts=[(s.written_time, s.start_step, s.resumed_from_step) for s in starts],
            stalls=[e for e in events if isinstance(e, Stall)],
        )

    def export(self, path: Path, query: HistoryQuery) -> int:
        """Write every run matching ``query`` (all pages, in its order, the columns of
        :class:`HistoryRow`) to ``path``, CSV or Parquet by its suffix. Returns the rows written.

        Raises:
            ValueError: a suffix other than ``.csv`` or ``.parquet``.
            TitanError: ``path`` cannot be written (a read-only runs root, a full disk), in
                one line naming it.
        """
        kind = path.suffix.lstrip(".")
        if kind not in EXPORT_FORMATS:
            raise ValueError(f"export to .csv or .parquet, not {path.name!r}")
        select, params = query.sql()
        with self._connection() as con:
            (count,) = con.execute(f"SELECT count(*) FROM ({select})", params).fetchall()[0]
            relation = con.sql(select, params=params)
            try:
                if kind == "csv":
                    relation.write_csv(str(path))
                else:
                    relation.write_parquet(str(path))
            except (duckdb.Error, OSError) as err:
                reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise TitanError(f"history not exported: cannot write {path} ({reason})") from None
        return count


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, value in a, value in b)`` for each option recorded by both runs whose values
    differ, sorted by key. Where each run was placed (:data:`NOT_COMPARED`) and options one
    record does not hold (it predates them: its value is unknown, not None) are left out."""
    keys = sorted((a.keys() & b.keys()) - set(NOT_COMPARED))
    return [(k, a[k], b[k]) for k in keys if a[k] != b[k]]
