"""Whether ``--remat`` saves the same memory with the layer loop rolled (``--layer-unroll 1``,
as the planner's accuracy draws run) and fully unrolled (``0``, the default): one configuration
of a draw under each remat policy and both loops, each in its own process by
``bench/planner_accuracy.py``'s child (its compiled program's peak, then 5 steps, the median of
the last 3); a run that does not finish within the timeout keeps its compiled peak.

    python bench/planner_unroll.py --draw 1 --index 17
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import planner_accuracy  # noqa: E402
import planner_space  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "planner_unroll.json"
REMATS = ("none", "dots", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draw", type=int, default=1, help="seed of the draw")
    parser.add_argument("--count", type=int, default=30, help="configurations in the draw")
    parser.add_argument("--index", type=int, required=True, help="the configuration")
    parser.add_argument("--timeout", type=int, default=70, help="seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    base = dict(planner_space.draw(args.draw, args.count)[args.index])
    base.pop("microbatches", None)
    command = "python bench/planner_unroll.py " + " ".join(sys.argv[1:])
    result = {"command": command, "config": base, "runs": []}
    for unroll in (1, 0):
        for remat in REMATS:
            config = {**base, "remat": remat, "layer_unroll": unroll}
            suite = {"suite": f"draw{args.draw}", **config}
            measured = planner_accuracy.run_child(suite, 5, 2, args.timeout)
            result["runs"].append(
                {
                    "remat": remat,
                    "layer_unroll": unroll,
                    "step_s": measured.get("step_s"),
                    "peak_bytes": (measured.get("compiled_memory") or {}).get("peak"),
                    "compile_s": measured.get("compile_s"),
                    "error": measured.get("error"),
                }
            )
            args.out.write_text(json.dumps(result, indent=1) + "\n")  # each run as it ends
            print(result["runs"][-1], flush=True)


if __name__ == "__main__":
    main()
