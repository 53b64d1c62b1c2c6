"""Benchmark: time to first step, cold and with a warm compilation cache (``bench/startup.py``).

Runs ``titan train`` (default ``--model llama3-1b --batch-size 8 --seq-len 2048 --steps 3``,
plus any options after ``--``) ``--starts`` times in a row, each in its own process, with one
``$TITAN_CACHE`` (``--cache``; its ``xla`` folder, the compilation cache, is emptied before the
first start, so that start compiles cold and the next ones find the cache warm), reads each
run's record and deletes its checkpoints:

- ``time_to_first_step_s``: the first ``step`` event's time less the moment the process was
  started (imports, tokenizer, tracing, compiling and the first step itself);
- ``compile_s`` and ``cache_hits``: the train step's ``compile`` event's ``seconds`` and the
  programs it loaded from the cache (:mod:`titan.trainer.compilation`), of the ``--remat``
  candidate the run ran; ``passed_over_compile_s``: the seconds of the candidates compiled
  before it and passed over (over the usable memory);
- ``recompiles``: the ``compile`` events of functions compiled again during the run, those
  with a ``reason`` (their ``what`` and ``reason``);
- ``step_time_s``: the median ``step_time_s`` of the steps after the first;
- ``pinned_host_s``: the seconds of the run's reservation of pinned host memory for its
  checkpoints, after its first step (``pinned_host`` event; None without one: ``--
  --checkpoint-every 2`` gives a 3-step run a save before its last, and a reservation).

Writes the results to ``--out`` (JSON) and prints them. ``--model tiny --seq-len 32
--batch-size 8 --out /tmp/s.json`` runs on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from titan.telemetry.records import read_events


def _start(args: argparse.Namespace, runs: Path, index: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "titan.cli", "train", "--model", args.model]
    command += ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    command += ["--steps", str(args.steps), "--checkpoint-every", str(args.steps + 1)]
    command += ["--runs-root", str(runs), "--run-id", f"start-{index}", *args.extra]
    env = {**os.environ, "TITAN_CACHE": str(args.cache)}
    launched = time.time()
    subprocess.run(command, check=True, env=env)
    events = read_events(runs / f"start-{index}")
    shutil.rmtree(runs / f"start-{index}" / "checkpoints", ignore_errors=True)  # disk for the next
    steps = [e for e in events if e["type"] == "step"]
    compiles = [e for e in events if e["type"] == "compile" and not e.get("passed_over")]
    passed_over = [e["seconds"] for e in events if e["type"] == "compile" and e.get("passed_over")]
    later = [e["step_time_s"] for e in steps[1:] if e.get("step_time_s")]
    return {
        "time_to_first_step_s": steps[0]["time"] - launched,
        "compile_s": compiles[0]["seconds"],
        "cache_dir": compiles[0].get("cache_dir"),
        "cache_hits": compiles[0].get("cache_hits"),
        "passed_over_compile_s": sum(passed_over),
        "recompiles": [
            {"what": e["what"], "reason": e["reason"]} for e in compiles if "reason" in e
        ],
        "step_time_s": statistics.median(later) if later else None,
        "pinned_host_s": next((e["seconds"] for e in events if e["type"] == "pinned_host"), None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-1b", help="a preset or a custom shape")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--starts", type=int, default=2, help="1: cold only")
    parser.add_argument("--cache", type=Path, help="TITAN_CACHE (default: a temporary one)")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("extra", nargs="*", help="more titan train options (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="titan-bench-startup-") as tmp:
        args.cache = args.cache or Path(tmp, "cache")
        shutil.rmtree(args.cache / "xla", ignore_errors=True)
        starts = [_start(args, Path(tmp, "runs"), i) for i in range(args.starts)]
    result = {
        "command": shlex.join(["python", "bench/startup.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "starts": starts,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
