"""A runs root of many small runs and its database, made in bulk, for History at scale.

``titan summarize`` ingests a new run in a few milliseconds (a transaction, a summary); making
100k runs that way takes hours on a shared machine. :func:`synthesize` writes real run dirs
(``run_start``, ``steps`` step events, ``run_end`` per run, JSON lines as the trainer writes
them) and fills the tables in bulk as an ingest would leave them: ``events`` parsed by DuckDB
from the files (the typed columns of :data:`titan.analysis.summarize.EVENT_FIELDS`),
``files`` with each file's offset, digest and ``stat`` key (so the next ingest skips it),
``runs`` with the summary's figures aggregated in SQL (ETTR, goodput and MFU left unknown).
Used by ``bench/console.py --scale`` and ``tests/console/test_console_scale.py``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path

from titan.analysis import summarize
from titan.telemetry.records import EVENTS_FILE

PRESETS = ("tiny", "small", "llama3-1b")
STATUSES = ("completed", "failed", "stopped", "completed")
T0 = 1.7e9  # unix seconds of the first run's start; run i starts i minutes later


def run_id(i: int) -> str:
    return f"run-{i:06d}"


def _lines(i: int, steps: int) -> str:
    """The events of run ``i``: its start, ``steps`` steps, its end."""
    start = T0 + 60.0 * i
    pp = 1 + i % 2
    events = [
        {
            "type": "run_start",
            "time": start,
            "run_id": run_id(i),
            "config": {"preset": PRESETS[i % 3], "layout": "mpmd" if pp > 1 else "spmd", "pp": pp},
            "layout": {"devices": 1 + i % 8},
            "total_steps": steps,
        }
    ]
    for step in range(1, steps + 1):
        events.append(
            {
                "type": "step",
                "time": start + step,
                "run_id": run_id(i),
                "step": step,
                "loss": 10.0 / step + (i % 97) / 100,
                "tokens": 4096,
                "tokens_seen": 4096 * step,
                "tokens_per_s": 1000.0 + i % 1000,
                "step_time_s": 1.0,
            }
        )
    end = {"type": "run_end", "time": start + steps + 1, "run_id": run_id(i), "step": steps}
    events.append({**end, "status": STATUSES[i % 4]})
    return "".join(json.dumps(e) + "\n" for e in events)


def write_runs(root: Path, first: int, count: int, steps: int) -> None:
    """Write the run dirs ``first`` .. ``first + count - 1`` under ``root``."""
    for i in range(first, first + count):
        run_dir = root / run_id(i)
        run_dir.mkdir(parents=True)
        (run_dir / EVENTS_FILE).write_text(_lines(i, steps))


_FIELDS = json.dumps(summarize.EVENT_FIELDS).replace("'", "''")
_EVENTS = (
    "INSERT INTO events SELECT regexp_extract(filename, '([^/]+)/[^/]+$', 1), i - 1, "
    + ", ".join(f"e.{name}" for name in summarize.EVENT_FIELDS)
    + f", lines[i]::JSON FROM (SELECT filename, lines, i, json_transform(lines[i], '{_FIELDS}')"
    """ AS e FROM (SELECT filename, string_split(content, chr(10)) AS lines FROM read_text(?)),
    generate_series(1, len(lines) - 1) AS g(i))"""
)
_RUNS = """
INSERT INTO runs SELECT run_id, status, steps, tokens, wall_s, tps, NULL, NULL, NULL, 0, 0,
    final_loss, best_loss,
    json_object('run_id', run_id, 'status', status, 'reason', NULL, 'steps', steps,
        'tokens', tokens, 'wall_s', wall_s, 'median_tokens_per_s', tps, 'median_mfu', NULL,
        'mfu_convention', NULL, 'mfu_reason', NULL, 'mfu_peak', NULL, 'energy_j', NULL,
        'energy_reason', NULL,
        'tokens_per_j', NULL, 'ettr', NULL, 'goodput', NULL, 'badput', json('{}'),
        'stalls', 0, 'restarts', 0, 'final_loss', final_loss, 'best_loss', best_loss,
        'bad_lines', 0, 'best_eval_loss', NULL),
    NULL, started_at, p->>'$.config.preset', p->>'$.config.layout',
    TRY_CAST(p->>'$.config.pp' AS BIGINT), TRY_CAST(p->>'$.layout.devices' AS BIGINT), NULL
FROM (SELECT run_id,
    arg_max(payload->>'$.status', seq) FILTER (type = 'run_end') AS status,
    max(step) FILTER (type = 'step') AS steps,
    max(tokens_seen) FILTER (type = 'step') AS tokens,
    max(time) - min(time) AS wall_s,
    median(tokens_per_s) FILTER (type = 'step') AS tps,
    arg_max(loss, seq) FILTER (type = 'step') AS final_loss,
    min(loss) FILTER (type = 'step') AS best_loss,
    min(time) FILTER (type = 'run_start') AS started_at,
    arg_min(payload, seq) FILTER (type = 'run_start') AS p
    FROM events WHERE list_contains(?, run_id) GROUP BY run_id)
"""


def ingest_in_bulk(root: Path, first: int, count: int) -> None:
    """Fill the database of ``root`` with the runs ``first`` .. ``first + count - 1`` (written
    by :func:`write_runs`) as an ingest would, in three bulk statements."""
    ids = [run_id(i) for i in range(first, first + count)]
    files = root / "files.csv"
    with files.open("w", newline="") as f:
        out = csv.writer(f)
        for rid in ids:
            path = root / rid / EVENTS_FILE
            data = path.read_bytes()
            info = os.stat(path)
            head = min(len(data), summarize.HEAD_BYTES)
            digest = hashlib.sha256(data[:head]).hexdigest()
            lines = data.count(b"\n")
            row = [rid, path, len(data), lines, 0, info.st_dev, info.st_ino, head, digest]
            out.writerow([*row, info.st_size, info.st_mtime_ns])
    con = summarize.connect(root)
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute(f"COPY files FROM '{files}' (HEADER false)")
        con.execute(_EVENTS, [[str(root / rid / EVENTS_FILE) for rid in ids]])
        con.execute(_RUNS, [ids])
    finally:
        con.close()
        files.unlink()


def synthesize(root: Path, runs: int, steps: int = 8) -> None:
    """``runs`` run dirs of ``steps`` steps each under ``root``, and their database."""
    write_runs(root, 0, runs, steps)
    ingest_in_bulk(root, 0, runs)
