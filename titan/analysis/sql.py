"""Writing rows to DuckDB in one statement, for the runs root's database
(:mod:`titan.analysis.summarize`, :mod:`titan.analysis.perfdb`).

This module imports nothing of DuckDB: it works on the connection it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def insert_rows(con: Any, insert: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run ``insert`` (``INSERT [OR REPLACE] INTO table [(columns)]``) for every row of ``rows``
    (all of one length) in one statement, one parameter per value: DuckDB's ``executemany``
    runs one statement per row, about 100 times slower for a batch of a few hundred rows
    (bench/console.py, ``ingest_first_s``). Nothing is run when ``rows`` is empty."""
    if rows:
        row = "(" + ", ".join("?" * len(rows[0])) + ")"
        values = ", ".join([row] * len(rows))
        con.execute(f"{insert} VALUES {values}", [value for r in rows for value in r])
