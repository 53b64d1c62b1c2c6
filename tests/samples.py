"""The sample records under ``sample_runs/``, copied for tests that read or write a runs root.

Following the README (``titan summarize sample_runs``, ``titan-console --runs-root
sample_runs``) leaves ``titan.duckdb`` (and exports) in ``sample_runs/``; a copy takes only the
run dirs, so that a test sees the records and never a database made elsewhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from titan.telemetry.records import EVENTS_FILE

SAMPLE_RUNS = Path(__file__).resolve().parents[1] / "sample_runs"


def sample_run_dirs() -> list[Path]:
    """The run dirs of ``sample_runs/`` (folders with ``events.jsonl``), by name."""
    return sorted(path.parent for path in SAMPLE_RUNS.glob(f"*/{EVENTS_FILE}"))


def copy_sample_runs(root: Path) -> Path:
    """Copy the run dirs of ``sample_runs/`` into ``root`` (created); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for run_dir in sample_run_dirs():
        shutil.copytree(run_dir, root / run_dir.name)
    return root
