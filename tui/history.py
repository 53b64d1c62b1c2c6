"""Run history from the runs root's DuckDB database, for the History screens.

The console is the database's one writer: :class:`HistoryStore` ingests the run records with
:func:`titan.observability.summarize.ingest` (the same code as ``titan summarize``) and reads the
``runs`` and ``events`` tables. Every method opens the database, runs its queries and closes
it: call them from a thread worker, never from the UI thread. A lock serialises the workers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from titan.observability import summarize
from titan.observability.events import RunStart, Stall, parse_events
from titan.observability.records import parse_json
from titan.observability.summarize import IngestReport, RunSummary

# Points of a loss curve at most (nvitop-like restraint: more than a terminal can draw is waste).
MAX_CURVE_POINTS = 2000
EXPORT_FORMATS = ("csv", "parquet")
# Options that say where a run was placed, not how it trained: every two runs differ there.
NOT_COMPARED = ("run_id", "runs_root")

# One row per run: the stored summary joined with its first run_start (preset, layout, devices,
# start time). Parameter: the run ids to keep, or NULL for all.
_ROWS = """
WITH starts AS (
    SELECT run_id, min(time) AS started_at, arg_min(payload, seq) AS payload
    FROM events WHERE type = 'run_start' GROUP BY run_id)
SELECT r.run_id, r.status, s.payload->>'$.config.preset' AS preset,
    s.payload->>'$.config.layout' AS layout,
    TRY_CAST(s.payload->>'$.config.pp' AS BIGINT) AS pp,
    TRY_CAST(s.payload->>'$.layout.devices' AS BIGINT) AS devices,
    r.steps, r.median_tokens_per_s AS tokens_per_s, r.median_mfu AS mfu,
    TRY_CAST(r.summary->>'$.tokens_per_j' AS DOUBLE) AS tokens_per_j,
    r.ettr, r.best_loss, s.started_at
FROM runs r LEFT JOIN starts s USING (run_id)
WHERE ?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], r.run_id)
ORDER BY s.started_at DESC NULLS LAST, r.run_id
"""
# Mean loss per bucket of steps, at most ? buckets. Parameters: run id, buckets.
_LOSS_CURVE = """
WITH s AS (SELECT step, loss FROM events
    WHERE run_id = ? AND type = 'step' AND loss IS NOT NULL AND isfinite(loss)),
    m AS (SELECT max(step) AS last FROM s)
SELECT min(step) AS step, avg(loss) AS loss FROM s, m
GROUP BY floor(step * ?::DOUBLE / (m.last + 1)) ORDER BY step
"""


@dataclass(frozen=True)
class HistoryRow:
    """One run of the History table (None where the records do not say).

    Attributes:
        run_id: the run dir's name. status: the run's state at the last ingest
            (:func:`titan.observability.liveness.judge`).
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
    database at that moment.
    """

    def __init__(self, runs_root: Path) -> None:
        self.runs_root = Path(runs_root)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._lock:
            con = summarize.connect(self.runs_root)
            try:
                yield con
            finally:
                con.close()

    def ingest(self) -> IngestReport:
        """Ingest the new complete lines of every run record.

        Raises:
            TitanError: the runs root does not exist or another process holds the database.
        """
        with self._connection() as con:
            return summarize.ingest(con, self.runs_root)

    def rows(self, run_ids: Sequence[str] | None = None) -> list[HistoryRow]:
        """Every ingested run (or those of ``run_ids``), newest first."""
        ids = None if run_ids is None else list(run_ids)
        with self._connection() as con:
            found = con.execute(_ROWS, [ids, ids]).fetchall()
        return [_history_row(*row) for row in found]

    def loss_curve(
        self, run_id: str, max_points: int = MAX_CURVE_POINTS
    ) -> list[tuple[int, float]]:
        """``(step, loss)`` of a run, downsampled to at most ``max_points`` bucket means."""
        with self._connection() as con:
            return con.execute(_LOSS_CURVE, [run_id, max_points]).fetchall()

    def detail(self, run_id: str) -> RunDetail:
        """Summary, config, environment, attempts and stalls of one run."""
        with self._connection() as con:
            (summary,) = summarize.summaries(con, run_id)
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
            attempts=[(s.time, s.start_step, s.resumed_from_step) for s in starts],
            stalls=[e for e in events if isinstance(e, Stall)],
        )

    def export(self, path: Path, run_ids: Sequence[str]) -> int:
        """Write the rows of ``run_ids`` (as :meth:`rows` gives them) to ``path``, CSV or Parquet
        by its suffix. Returns the rows written.

        Raises:
            ValueError: a suffix other than ``.csv`` or ``.parquet``.
        """
        kind = path.suffix.lstrip(".")
        if kind not in EXPORT_FORMATS:
            raise ValueError(f"export to .csv or .parquet, not {path.name!r}")
        ids = list(run_ids)
        with self._connection() as con:
            relation = con.sql(_ROWS, params=[ids, ids])
            if kind == "csv":
                relation.write_csv(str(path))
            else:
                relation.write_parquet(str(path))
        return len(ids)


def _history_row(run_id, status, preset, layout, pp, devices, *figures) -> HistoryRow:
    if layout == "mpmd" and pp:
        layout = f"mpmd pp{pp}"
    return HistoryRow(run_id, status, preset, layout, devices, *figures)


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, value in a, value in b)`` for each option recorded by both runs whose values
    differ, sorted by key. Where each run was placed (:data:`NOT_COMPARED`) and options one
    record does not hold (it predates them: its value is unknown, not None) are left out."""
    keys = sorted((a.keys() & b.keys()) - set(NOT_COMPARED))
    return [(k, a[k], b[k]) for k in keys if a[k] != b[k]]
