"""Performance database: measured step times keyed by what determines them, and regressions.

The ``perf`` table (in the runs root's ``titan.duckdb``, filled by
:func:`titan.analysis.summarize.ingest`) holds one row per run:

- key: ``model`` (the model shape, JSON), ``layout`` (JSON: the trainer's layout description, the
  mesh/pipeline options, batch size, sequence length, dtypes, recomputation and the provider of
  each operator: everything of the run's options that changes the step's work), ``device_kind``,
  ``device_count``, ``jax_version``, ``jaxlib_version``;
- value: ``median_step_s``, the median ``step_time_s`` of the run's steps, leaving out the first
  :data:`WARMUP_STEPS` steps of each attempt (the first one holds the rest of the compilation and
  the allocator's warm-up), steps with a checkpoint save inside them and the steps of a
  ``--profile-steps`` trace (with the step before it, which starts the trace); ``steps`` measured;
  ``run_id``; ``time`` (the run's first ``run_start``).

A run is flagged when its median step time is more than :data:`REGRESSION_THRESHOLD` (5%) above
the best (lowest) median of the *earlier* runs (smaller ``time``) of the same key.

This module imports DuckDB only through the connection it is given, and no JAX.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from titan.analysis.ettr import attempt_start, split_attempts
from titan.analysis.sql import insert_rows
from titan.config import perf_key_options
from titan.errors import TitanError
from titan.gpus import gpu_for_device_kind, on_one_host
from titan.planning.memory import Layout, Precision
from titan.planning.step import Measurement
from titan.shapes import ModelConfig
from titan.telemetry.events import Checkpoint, Compile, Event, Profile, RunStart, Step
from titan.telemetry.records import load_events

WARMUP_STEPS = 3
REGRESSION_THRESHOLD = 0.05
KEY_COLUMNS = ("model", "layout", "device_kind", "device_count", "jax_version", "jaxlib_version")
# Options of the run's config in the key: those marked ``perf`` in titan.config's sections.
LAYOUT_OPTIONS = perf_key_options()

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS perf (run_id VARCHAR PRIMARY KEY, model JSON, layout JSON,
    device_kind VARCHAR, device_count BIGINT, jax_version VARCHAR, jaxlib_version VARCHAR,
    median_step_s DOUBLE, steps BIGINT, time DOUBLE)""",
)


@dataclass(frozen=True)
class PerfRow:
    """One run's measured step time and its key (see the module docstring)."""

    run_id: str
    model: dict[str, Any]
    layout: dict[str, Any]
    device_kind: str
    device_count: int
    jax_version: str
    jaxlib_version: str
    median_step_s: float
    steps: int
    time: float


@dataclass(frozen=True)
class PerfCheck:
    """A run against the best earlier run of its key; ``slower`` is the relative excess."""

    run_id: str
    median_step_s: float
    best_earlier_s: float | None
    best_earlier_run: str | None
    slower: float | None
    flagged: bool

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON values: a ratio beyond the float range (``slower`` of times
        1e300 apart) is None, never ``Infinity``, which JSON lacks."""
        return {k: None if v in (math.inf, -math.inf) else v for k, v in asdict(self).items()}


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping (a JSON object of a record), else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def perf_key(run_start: RunStart) -> dict[str, Any]:
    """The key columns of a run from its first ``run_start`` event (missing parts: None)."""
    env = run_start.env or {}
    config = run_start.config or {}
    packages = _mapping(env.get("packages"))
    kinds = env.get("device_kinds")
    model = run_start.model or {}
    layout = {name: config.get(name) for name in LAYOUT_OPTIONS}
    layout.update(
        described=run_start.layout,
        compute_dtype=run_start.compute_dtype or config.get("compute_dtype"),
        ops=run_start.ops,
    )
    return {
        "model": {k: v for k, v in model.items() if k != "name"},
        "layout": layout,
        "device_kind": ",".join(map(str, kinds)) if isinstance(kinds, list) else str(kinds),
        "device_count": env.get("device_count"),
        "jax_version": packages.get("jax"),
        "jaxlib_version": packages.get("jaxlib"),
    }


def _profiled_steps(events: Sequence[Event]) -> set[int]:
    """Steps whose times the profiler changed: each traced range of a ``profile`` event, and
    the step before it (which holds the start of the trace)."""
    steps: set[int] = set()
    for event in events:
        if isinstance(event, Profile) and event.steps and len(event.steps) == 2:
            steps.update(range(event.steps[0] - 1, event.steps[1] + 1))
    return steps


def steady_step_times(events: Sequence[Event]) -> list[float]:
    """``step_time_s`` of the steps after the first :data:`WARMUP_STEPS` of each attempt,
    leaving out steps with a checkpoint save inside them, profiled steps, skipped steps (a
    non-finite loss or gradient norm: no update applied), and times that no step takes: zero,
    negative or infinite (a damaged record)."""
    times: list[float] = []
    profiled = _profiled_steps(events)
    seen_in_attempt, saved = 0, False
    for event in events:
        if isinstance(event, RunStart):
            seen_in_attempt, saved = 0, False
        elif isinstance(event, Checkpoint):
            saved = True
        elif isinstance(event, Step):
            seen_in_attempt += 1
            steady = seen_in_attempt > WARMUP_STEPS and not saved
            seconds = event.step_time_s
            trained = not event.skipped  # a skipped step applied no update: no step time
            if steady and trained and event.step not in profiled and _a_duration(seconds):
                times.append(seconds)
            saved = False
    return times


def _a_duration(seconds: float | None) -> TypeGuard[float]:
    """Whether ``seconds`` is a time a step can take: finite and above zero."""
    return seconds is not None and 0 < seconds < math.inf


def _median(values: Sequence[float]) -> float:
    """The median of ``values`` (not empty), which stays finite where the values are: the mean
    of the two middle ones is taken as ``low + (high - low) / 2`` (``statistics.median`` adds
    them first, and two times of 1e308 s made ``inf``)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return low + (high - low) / 2


def _last_layout(attempts: list[list[Event]]) -> tuple[dict[str, Any], list[list[Event]]]:
    """The key of the last attempt (:func:`perf_key`) and the attempts that share it: a run
    resumed with another layout (``--resume`` allows it) is measured by its last layout."""
    key = perf_key(attempt_start(attempts[-1]))
    same = [a for a in attempts if _canonical(perf_key(attempt_start(a))) == _canonical(key)]
    return key, same


def _row(run_id: str, key: dict[str, Any], same: list[list[Event]]) -> PerfRow:
    """The ``perf`` row of the attempts ``same`` of one key; ``time`` is the first one's start,
    the median NaN when they have no steady step."""
    times = steady_step_times([e for a in same for e in a])
    return PerfRow(
        run_id=run_id,
        median_step_s=_median(times) if times else math.nan,
        steps=len(times),
        time=same[0][0].written_time,
        **key,
    )


def measure(run_id: str, events: Sequence[Event]) -> PerfRow | None:
    """The run's ``perf`` row, of its last layout's attempts (:func:`_last_layout`); None when
    it has no run_start or no steady steps."""
    attempts = split_attempts(events)
    if not attempts:
        return None
    row = _row(run_id, *_last_layout(attempts))
    return row if row.steps else None


def store(con: Any, run_ids: Sequence[str], rows: Sequence[PerfRow]) -> None:
    """Replace the ``perf`` rows of ``run_ids`` with ``rows`` (a run without one has none), in
    one statement (:func:`~titan.analysis.sql.insert_rows`)."""
    con.execute("DELETE FROM perf WHERE list_contains(?, run_id)", [list(run_ids)])
    insert_rows(
        con,
        "INSERT INTO perf",
        [
            [
                row.run_id,
                _canonical(row.model),
                _canonical(row.layout),
                row.device_kind,
                row.device_count,
                row.jax_version,
                row.jaxlib_version,
                row.median_step_s,
                row.steps,
                row.time,
            ]
            for row in rows
        ],
    )


def measurements(con: Any) -> list[PerfRow]:
    """Every stored measurement, oldest first."""
    rows = con.execute(
        "SELECT run_id, model, layout, device_kind, device_count, jax_version, jaxlib_version, "
        "median_step_s, steps, time FROM perf ORDER BY time, run_id"
    ).fetchall()
    return [PerfRow(r[0], json.loads(r[1]), json.loads(r[2]), *r[3:]) for r in rows]


def unmeasured(con: Any) -> list[str]:
    """The runs of the database's ``files`` (every record ingested) that have no ``perf`` row:
    no ``run_start``, or no steady step (:func:`steady_step_times`); sorted."""
    rows = con.execute(
        "SELECT run_id FROM files WHERE run_id NOT IN (SELECT run_id FROM perf) ORDER BY run_id"
    ).fetchall()
    return [row[0] for row in rows]


def _same_key(a: PerfRow, b: PerfRow) -> bool:
    return all(_canonical(getattr(a, c)) == _canonical(getattr(b, c)) for c in KEY_COLUMNS)


def check(rows: Sequence[PerfRow], threshold: float = REGRESSION_THRESHOLD) -> list[PerfCheck]:
    """Each run against the best median of the earlier runs of its key."""
    results = []
    for row in rows:
        earlier = [r for r in rows if r.time < row.time and _same_key(r, row)]
        best = min(earlier, key=lambda r: r.median_step_s, default=None)
        slower = row.median_step_s / best.median_step_s - 1 if best else None
        results.append(
            PerfCheck(
                run_id=row.run_id,
                median_step_s=row.median_step_s,
                best_earlier_s=best.median_step_s if best else None,
                best_earlier_run=best.run_id if best else None,
                slower=slower,
                flagged=slower is not None and slower > threshold,
            )
        )
    return results


def planner_measurements(rows: Sequence[PerfRow]) -> list[Measurement]:
    """The rows as :class:`titan.planning.step.Measurement` for :func:`~titan.planning.step.
    calibrate`: only rows whose device kind is in the accelerator catalog and whose key is
    complete."""
    result = []
    for row in rows:
        gpu = gpu_for_device_kind(row.device_kind.split(",")[0])
        lay = row.layout
        if gpu is None or not row.device_count or not lay.get("batch_size"):
            continue
        described = _mapping(lay.get("described"))
        mesh = _mapping(described.get("mesh"))
        try:
            model = ModelConfig(name="measured", **row.model)
            layout = Layout(
                dp=int(mesh.get("data") or lay.get("dp") or 1),
                fsdp=int(lay.get("fsdp") or 1),
                tp=int(lay.get("tp") or 1),
                pp=int(lay.get("pp") or 1),
                microbatches=int(lay.get("microbatches") or 1),
                schedule=str(lay.get("schedule") or "1f1b"),
                virtual_stages=int(lay.get("virtual_stages") or 1),
                remat=str(lay.get("remat") or "none"),
            )
        except (TypeError, ValueError):
            continue
        ops = _mapping(lay.get("ops"))
        precision = Precision.of_providers(
            str(lay.get("param_dtype") or "float32"),
            str(lay.get("compute_dtype") or gpu.compute_dtype),
            {str(op): str(provider) for op, provider in ops.items()},
        )
        precision = replace(precision, matmul=str(lay.get("matmul_dtype") or "compute"))
        per_node = min(int(row.device_count), gpu.gpus_per_node)
        result.append(
            Measurement(
                model=model,
                layout=layout,
                gpu=on_one_host(gpu, per_node),
                gpus_per_node=per_node,
                seq_len=int(lay.get("seq_len") or 0),
                batch_sequences=int(lay["batch_size"]),
                precision=precision,
                step_s=row.median_step_s,
            )
        )
    return result


def run_measurement(run_dir: Path) -> tuple[Measurement, float | None]:
    """A run dir's configuration and measurements as the planner sees them, of the attempts
    of its last layout (:func:`_last_layout`, as ``titan perf check`` measures it): their
    ``run_start`` (the model, its name, layout, batch, dtypes and providers), the median of
    their steady step times (:func:`steady_step_times`; NaN when they have none) and the
    largest compiled program's bytes of their ``compile`` events (None when none recorded them).

    Raises:
        TitanError: no such directory, no events, no ``run_start``, or a device the GPU
            catalog does not list.
    """
    if not Path(run_dir).is_dir():
        state = "not a directory" if Path(run_dir).exists() else "no such directory"
        raise TitanError(f"--from {run_dir}: {state}")
    attempts = split_attempts(load_events(run_dir))
    if not attempts:
        raise TitanError(f"--from {run_dir}: no run_start record (not a run dir?)")
    key, same = _last_layout(attempts)
    start = attempt_start(same[-1])
    found = planner_measurements([_row(start.run_id or run_dir.name, key, same)])
    if not found:
        raise TitanError(
            f"--from {run_dir}: device {key['device_kind']!r} is not in the accelerator catalog or "
            "the run_start record is incomplete"
        )
    name = (start.model or {}).get("name")
    measurement = found[0]
    if isinstance(name, str) and name:
        measurement = replace(measurement, model=replace(measurement.model, name=name))
    programs = [e.run_program_bytes for a in same for e in a if isinstance(e, Compile)]
    peaks = [b for b in programs if b is not None]
    return measurement, max(peaks) if peaks else None
