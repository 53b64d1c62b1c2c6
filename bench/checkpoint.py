"""Benchmark: synchronous against asynchronous checkpoints (``python bench/checkpoint.py``).

Runs ``titan train`` with the same options once per variant, each in its own process:
``sync`` (``--no-checkpoint-async``) and ``async`` (``--checkpoint-async``); by default
``--preset llama3-1b``, 200 steps, a save every 50 steps and at the end. It reads each run's
record:

- ``blocking_s``: median ``seconds`` of the ``checkpoint`` events (what the loop waited for a
  save), ``commit_s`` their median time to commit (``commits_s``: each save's), and the final
  save's ``seconds`` (the run's last save is waited for before ``run_end``);
- ``step_time_s``: median ``step_time_s`` of the steps that ran while no save was in flight,
  and ``saving_step_time_s`` of the steps that did: the step after each save (it holds the
  blocking part) and, for an async save, every step reported before its commit;
  ``loop_cost_s``: per save, what its steps took beyond ``step_time_s`` each, summed (the
  loop's time lost to that save, its blocking part included; the run's last save, waited for
  at the end, loses its ``final_save_s`` instead);
- ``ettr``: the run's ETTR (:func:`titan.analysis.ettr.analyze`: productive step time over
  the attempt's wall time, so every blocking second of a save is badput), and ``badput_s``, the
  seconds of each kind of badput;
- ``pinned_host``: the run's reservation of pinned host memory for the saves' copies, after
  its first step (:mod:`titan.trainer.loop_hooks.pin_host_hook`; GPUs only): its ``bytes``,
  ``seconds`` and ``error``, or None;
- ``checkpoint_bytes``: the bytes of the last checkpoint on disk;
- ``memory_estimate_bytes``: the memory check's estimate (``run_start``), and
  ``peak_memory_bytes`` the largest measured peak of the steps (where the backend reports it);

and writes them with the ratios async / sync (``--variants async``: the async run alone),
``slowdown_while_saving``, ``saving_step_time_s / step_time_s`` of each run (medians, which a
few slow steps leave alone), and ``mean_slowdown_while_saving``, the mean time of the steps in
flight over ``step_time_s`` (the run's last save left out, as in ``loop_cost_s``), to
``bench/results/checkpoint-<device>.json`` (or ``--out``). ``--preset tiny --steps 20
--checkpoint-every 5 --out /tmp/c.json`` is a smoke test that runs on CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from titan.analysis.ettr import analyze
from titan.checkpoint.checkpointer import CHECKPOINT_DIR
from titan.telemetry.events import parse_events
from titan.telemetry.records import read_events

RESULTS = Path(__file__).parent / "results"
VARIANTS = {"sync": "--no-checkpoint-async", "async": "--checkpoint-async"}


def _train(args: argparse.Namespace, runs: Path, variant: str) -> Path:
    command = [sys.executable, "-m", "titan.cli", "train", "--preset", args.preset]
    command += ["--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every)]
    command += ["--runs-root", str(runs), "--run-id", variant, VARIANTS[variant], *args.extra]
    subprocess.run(command, check=True)
    return runs / variant


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _in_flight(events: list[dict[str, Any]], save: dict[str, Any]) -> set[int]:
    """The steps that ran while ``save`` (a ``checkpoint`` event) was in flight: the one after
    it, and those reported before its event (its commit)."""
    later = (e for e in events if e["type"] == "step" and e["step"] > save["step"])
    return {save["step"] + 1} | {e["step"] for e in later if e["time"] < save["time"]}


def _saving_steps(events: list[dict[str, Any]]) -> set[int]:
    """Steps that ran while any save was in flight (:func:`_in_flight`)."""
    saves = (e for e in events if e["type"] == "checkpoint")
    return set().union(*(_in_flight(events, save) for save in saves))


def _in_flight_times(events: list[dict[str, Any]]) -> list[list[float]]:
    """Per save, the ``step_time_s`` of its steps in flight (:func:`_in_flight`)."""
    steps = {e["step"]: e["step_time_s"] for e in events if e["type"] == "step"}
    saves = [e for e in events if e["type"] == "checkpoint"]
    return [[steps[s] for s in _in_flight(events, save) if s in steps] for save in saves]


def _loop_costs(events: list[dict[str, Any]], normal: float | None) -> list[float]:
    """Per save, the time its steps in flight (:func:`_in_flight`) took beyond ``normal``
    (saves never overlap: a save first waits for the one before)."""
    return [sum(t - (normal or 0.0) for t in times) for times in _in_flight_times(events)]


def _mean_saving_step(events: list[dict[str, Any]]) -> float | None:
    """Mean ``step_time_s`` of the steps in flight (:func:`_in_flight`) of every save but the
    run's last (waited for at the end, with no step after it)."""
    times = [t for per_save in _in_flight_times(events)[:-1] for t in per_save]
    return statistics.fmean(times) if times else None


def _reserved(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's ``pinned_host`` event's figures, or None."""
    reserved = next((e for e in events if e["type"] == "pinned_host"), None)
    if reserved is None:
        return None
    return {k: reserved.get(k) for k in ("bytes", "seconds", "error")}


def _bytes_under(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def measure(run_dir: Path) -> dict[str, Any]:
    """The figures of one run (module docstring)."""
    events = read_events(run_dir)
    saves = [e for e in events if e["type"] == "checkpoint"]
    steps = [e for e in events if e["type"] == "step" and e["step"] > 1]  # 1 waits to compile
    saving = _saving_steps(events)
    start = next(e for e in events if e["type"] == "run_start")
    device = start["env"].get("device_kinds", [])
    peaks = [e["peak_memory_bytes"] for e in steps if e.get("peak_memory_bytes")]
    commits = [e["seconds"] if e.get("commit_s") is None else e["commit_s"] for e in saves]
    normal = _median([e["step_time_s"] for e in steps if e["step"] not in saving])
    goodput = analyze(parse_events(events)[0])
    newest = run_dir / CHECKPOINT_DIR / str(saves[-1]["step"]) if saves else None
    return {
        "device": ", ".join(device),
        "saves": len(saves),
        "failed_saves": sum(e["type"] == "checkpoint_failed" for e in events),
        "blocking_s": _median([e["seconds"] for e in saves[:-1]]),
        "commit_s": _median(commits[:-1]),
        "commits_s": commits,
        "final_save_s": saves[-1]["seconds"] if saves else None,
        "step_time_s": normal,
        "saving_step_time_s": _median([e["step_time_s"] for e in steps if e["step"] in saving]),
        "loop_cost_s": _loop_costs(events, normal),
        "saving_step_time_mean_s": _mean_saving_step(events),
        "pinned_host": _reserved(events),
        "ettr": goodput.ettr,
        "badput_s": goodput.badput_s,
        "checkpoint_bytes": _bytes_under(newest) if newest and newest.is_dir() else None,
        "memory_estimate_bytes": start.get("memory_check", {}).get("estimate_bytes"),
        "peak_memory_bytes": max(peaks, default=None),
    }


def _measured(run_dir: Path) -> dict[str, Any]:
    """:func:`measure` of a run, whose checkpoints are then removed (the next run may need the
    disk: a llama3-1b checkpoint is about 15 GB)."""
    figures = measure(run_dir)
    shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)
    return figures


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-1b")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument(
        "--variants", default="sync,async", help="which runs, of: sync, async (comma-separated)"
    )
    parser.add_argument(
        "--runs-root",
        type=Path,
        help="keep the runs' records here (default: a temporary directory); their checkpoints "
        "are removed once measured",
    )
    parser.add_argument("extra", nargs="*", help="more titan train options (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="titan-bench-checkpoint-") as runs:
        root = args.runs_root or Path(runs)
        chosen = [v for v in VARIANTS if v in args.variants.split(",")]
        variants = {v: _measured(_train(args, root, v)) for v in chosen}
    sync, asynchronous = variants.get("sync", {}), variants.get("async", {})
    result = {
        "command": shlex.join(["python", "bench/checkpoint.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "preset": args.preset,
        "steps": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "variants": variants,
        "ratios_async_over_sync": {
            key: _ratio(asynchronous.get(key), sync.get(key))
            for key in ("blocking_s", "saving_step_time_s", "ettr")
        },
        "slowdown_while_saving": {
            name: _ratio(v["saving_step_time_s"], v["step_time_s"]) for name, v in variants.items()
        },
        "mean_slowdown_while_saving": {
            name: _ratio(v["saving_step_time_mean_s"], v["step_time_s"])
            for name, v in variants.items()
        },
    }
    device = next(iter(variants.values()))["device"]
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"
    out = args.out or RESULTS / f"checkpoint-{slug}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
