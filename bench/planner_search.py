"""How long ``titan plan --search`` takes against one fixed layout's plan, at cluster sizes
from one node to a thousand GPUs: each command run in this process through ``titan``'s own
parser (imports already paid), the median of ``--repeats`` runs.

    python bench/planner_search.py

The fixed plan (``--tp 8``, FSDP over the rest, one sequence per microbatch: a layout that
fits, so that its plan does not search for a better one) is the baseline: the ratio is how
many layouts' worth of work the search costs. Results: ``bench/results/planner_search.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import statistics
import time
from pathlib import Path

from titan.cli import build_parser
from titan.cpus import usable_cpus

RESULTS = Path(__file__).resolve().parent / "results" / "planner_search.json"
CASES = (  # model, GPUs, tokens
    ("llama3-8b", 8, "1e11"),
    ("llama3-70b", 64, "1e12"),
    ("llama3-70b", 256, "1e12"),
    ("llama3-405b", 1024, "1.5e13"),
)


def fixed_layout(gpus: int) -> list[str]:
    """``--tp 8``, FSDP over the other GPUs, and one sequence of the default 512-sequence batch
    (llama3's 4M tokens at sequence 8192) per microbatch."""
    fsdp = gpus // 8
    return ["--tp", "8", "--fsdp", str(fsdp), "--microbatches", str(512 // fsdp)]


def timed_plan(argv: list[str], repeats: int) -> float:
    """Median wall seconds of ``titan plan ARGV`` in this process (its output discarded).

    Raises:
        RuntimeError: the command exits non-zero.
    """
    parser = build_parser()
    times = []
    for _ in range(repeats):
        args = parser.parse_args(["plan", *argv])
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = args.run(args)
        times.append(time.perf_counter() - start)
        if code != 0:
            raise RuntimeError(f"titan plan {' '.join(argv)} exited {code}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (the median)")
    parser.add_argument("--gpu", default="h200", help="GPU of the catalog to plan for")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    rows = []
    for model, gpus, tokens in CASES:
        base = ["--model", model, "--gpu", args.gpu, "--gpus", str(gpus), "--tokens", tokens]
        fixed_s = timed_plan([*base, *fixed_layout(gpus)], args.repeats)
        search_s = timed_plan([*base, "--search"], args.repeats)
        row = {"model": model, "gpus": gpus, "tokens": tokens, "fixed_s": fixed_s}
        rows.append({**row, "search_s": search_s, "ratio": search_s / fixed_s})
        print(
            f"{model:12} {gpus:5} GPUs  fixed {fixed_s:.4f} s  search {search_s:.3f} s  "
            f"({search_s / fixed_s:.1f}x)",
            flush=True,
        )
    result = {
        "command": "python bench/planner_search.py",
        "machine": f"{usable_cpus()} usable CPUs, {platform.machine()}",
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
