"""Where SPMD gradient accumulation's time goes: each microbatched configuration of a draw
measured as drawn (``--microbatches M``), as one batch (M = 1), and as one microbatch's batch
(M = 1, batch / M), each in its own process by ``bench/planner_accuracy.py``'s child (5 steps,
the median of the last 3, and the compiled program's peak). When M x the last equals the
first, the accumulation's own cost is small and what microbatching loses is the smaller
kernels' efficiency.

    python bench/planner_microbatch.py --draw 1 --index 0 17 29
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import planner_accuracy  # noqa: E402
import planner_space  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "planner_microbatch.json"


def variants(config: dict) -> dict[str, dict]:
    """The three runs of one microbatched configuration (module docstring)."""
    base = dict(config)
    m = base.pop("microbatches")
    return {
        f"m{m}": {**base, "microbatches": m},
        "m1": base,
        f"m1_batch_over_{m}": {**base, "batch_size": base["batch_size"] // m},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draw", type=int, default=1, help="seed of the draw")
    parser.add_argument("--count", type=int, default=30, help="configurations in the draw")
    parser.add_argument("--index", type=int, nargs="+", required=True, help="microbatched ones")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    configs = planner_space.draw(args.draw, args.count)
    runs = {}
    for index in args.index:
        for name, config in variants(configs[index]).items():
            measured = planner_accuracy.run_child({"suite": f"draw{args.draw}", **config}, 5, 2, 60)
            memory = measured.get("compiled_memory") or {}
            runs[f"{index}:{name}"] = {
                "config": config,
                "label": planner_accuracy._label({"suite": f"draw{args.draw}", **config}),
                "step_s": measured.get("step_s"),
                "peak_bytes": memory.get("peak"),
                "error": measured.get("error"),
            }
            print(index, name, runs[f"{index}:{name}"], flush=True)
    command = "python bench/planner_microbatch.py " + " ".join(sys.argv[1:])
    args.out.write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
