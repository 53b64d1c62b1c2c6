"""Write ``docs/benchmarks.md`` from ``bench/results/``.

``python bench/report.py`` rewrites ``docs/benchmarks.md``; ``--check`` only compares and exits 1
when it is stale (``tests/bench/test_bench_docs.py`` does the same). Every number comes from a
result file; each table names its file, the command that produced it where the file records it,
and, for MFU, the attention convention and the peak it divides by.

Result files and the scripts that write them:

- ``mfu-*.json``: ``bench/mfu.py`` (titan's train step against the plain-JAX baseline);
- ``ops-*.json``: ``titan ops check --json`` (providers against the native reference);
- ``pipeline-*.json``: ``bench/pipeline.py`` (MPMD schedules against SPMD);
- ``planner_accuracy.json``: ``bench/planner_accuracy.py --suite ...``; ``planner_draws.json``:
  ``bench/planner_accuracy.py --draw SEED`` (configurations drawn from ``bench/planner_space.py``),
  ``planner_draws_evaluation.json``: ``bench/planner_accuracy.py --evaluate`` (fit on half, score
  the other half); ``planner_search.json``: ``bench/planner_search.py``;
- ``console.json``: ``bench/console.py``; ``console-scale-<runs>.json``: ``bench/console.py
  --scale <runs>``; ``console-real-<runs>.json``: ``--real <runs>``;
  ``console-flood*.json``: ``bench/console.py --flood``; ``console-forms*.json``:
  ``bench/console.py --forms``; ``console-follow*.json``:
  ``bench/console.py --follow <rounds>``;
  ``data_loader.json``: ``bench/data_loader.py``;
- ``maxtext-*.json``: ``bench/maxtext.py`` (a MaxText llama against Titan's Llama);
- ``layer-loop-*.json``: ``titan train`` runs per ``--layer-unroll`` (the file says how);
- ``peers-*.json``: ``bench/peers.py``; ``attention-*.json``: ``bench/attention.py``;
  ``tpu-attention-*.json``: ``bench/tpu_attention.py``; other ``tpu-*.json``: ``bench/tpu.py``;
  ``fp8-*.json``: ``bench/fp8.py``;
  ``startup-*.json``: ``bench/startup.py``;
  ``roofline-*.json``: ``bench/roofline.py`` (from the ``.trace.json.gz`` and ``.txt.gz`` it names);
- ``llama3-1b-*/<run>/``: run records (``config.json``, ``events.jsonl``) of ``titan train``.

Imports no JAX (the GPU catalog only, for the peak of files that do not record it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from titan.gpus import gpu_for_device_kind  # noqa: E402

RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "benchmarks.md"

MFU_CONVENTION = (
    "MFU = tokens/s x model FLOPs per token / peak FLOP/s of the devices. Model FLOPs per token: "
    "6 N (N: the matmul parameters, without the input embedding, which is a lookup) plus "
    "attention, 12 L s d counted in full (**MFU full**: PaLM, Chowdhery et al. 2022, App. B; "
    "torchtitan) or halved for the causal mask (**MFU causal**: MaxText), from "
    "`titan.flops.model_flops_per_token`. The peak is the device's dense BF16 "
    "datasheet figure from the GPU catalog (`titan/gpus.py`); each table names it."
)


def _rel(path: Path) -> str:
    """``path`` relative to the repository (as given when it lies elsewhere)."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.as_posix()


def _link(path: Path, base: Path) -> str:
    """A Markdown link to ``path`` relative to the document in ``base``."""
    up = [".."] * len(base.relative_to(REPO).parent.parts)
    target = Path(*up, _rel(path)) if path.is_relative_to(REPO) else path
    return f"[`{_rel(path)}`]({target.as_posix()})"


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _peak_line(peak: float | None, device: str, recorded: bool) -> str:
    if peak is None:
        return f"Peak: none known for {device} (MFU unknown)."
    where = (
        "recorded in the file" if recorded else "the catalog's entry; the file does not record it"
    )
    return f"Peak: {peak / 1e12:,.1f} TFLOP/s dense BF16 per {device} ({where})."


def _catalog_peak(device_kind: str) -> float | None:
    spec = gpu_for_device_kind(device_kind)
    return spec.bf16_flops if spec is not None and spec.name != "cpu" else None


# ---------------------------------------------------------------- bench/mfu.py


def _mfu_best(data: dict[str, Any]) -> float:
    best = data.get("best") or {}
    return best.get("tok_s", 0.0)


def mfu_files(results: Path) -> list[Path]:
    """``mfu-*.json``, the one with the fastest run first, then by name."""
    files = sorted(results.glob("mfu-*.json"))
    return sorted(files, key=lambda f: -_mfu_best(json.loads(f.read_text())))


def _config_cell(key: str, run: dict[str, Any]) -> str:
    value = run["config"].get(key, "")
    served = run.get("served", {}).get(key)
    if key == "xla_flags":
        return f"`{value}`" if value else "none"
    if value == "auto" and served:
        return f"auto ({served})"
    return str(value)


def mfu_table(path: Path, base: Path, all_keys: list[str] | None = None) -> list[str]:
    """One ``bench/mfu.py`` result file: the baseline and every run of its search.

    Args:
        all_keys: the configuration fields of every file; those this file lacks are named.
    """
    data = json.loads(path.read_text())
    runs = [r for r in data["runs"] if "tok_s" in r]
    keys = list(dict.fromkeys(k for r in data["runs"] for k in r["config"]))
    varying = [k for k in keys if len({r["config"].get(k) for r in data["runs"]}) > 1]
    fixed = [k for k in keys if k not in varying]
    device = next((r["device_kind"] for r in runs), "unknown device")
    shape = data["shape"]
    lines = [
        f"### {_link(path, base)}",
        "",
        f"Model: {shape['layers']} layers, d {shape['d_model']}, {shape['heads']} heads, "
        f"{shape['kv_heads']} KV heads, ffn {shape['ffn']}, vocabulary {shape['vocab']}; batch "
        f"{shape['batch']} x {shape['seq']} random tokens; {data['steps']} timed steps after "
        f"{data['warmup']}; {device}, jax {runs[0]['jax'] if runs else '?'}.",
        "",
    ]
    if "command" in data:
        lines += [f"Command: `{data['command']}`", ""]
    else:
        levers = "; ".join(
            f"{k}: {', '.join(v or 'none' for v in vs)}" for k, vs in data["levers"].items()
        )
        lines += [f"Command: not recorded in the file. Levers searched: {levers}.", ""]
    peak = data.get("peak_flops")
    lines += [_peak_line(peak or _catalog_peak(device), device, peak is not None), ""]
    if fixed:
        same = ", ".join(f"{k} {_config_cell(k, data['runs'][0])}" for k in fixed)
        lines += [f"Same in every titan run: {same}.", ""]
    missing = [k for k in all_keys or () if k not in keys]
    if missing:
        served = {k: v for k, v in data["runs"][0].get("served", {}).items() if k in missing}
        note = "; served: " + ", ".join(f"{k} {v}" for k, v in served.items()) if served else ""
        lines += [f"Not recorded in this file: {', '.join(missing)}{note}.", ""]
    header = ["run", *varying, "tokens/s", "MFU causal", "MFU full", "peak GiB"]
    header += ["vs prev. best", "titan / baseline"]
    rows = []
    baseline = data["baseline"]
    if "tok_s" in baseline:
        label = (
            f"plain-JAX baseline (ATTN={baseline['attn']}, REMAT={1 if baseline['remat'] else 0})"
        )
        rows.append(
            [label, *["" for _ in varying], f"{baseline['tok_s']:,.0f}"]
            + [_pct(baseline.get("mfu_causal")), _pct(baseline.get("mfu_palm"))]
            + [_num(baseline.get("peak_mem_gib"), ".1f"), "", "1.00"]
        )
    best = (data.get("best") or {}).get("lever")
    for run in data["runs"]:
        cells = [run["lever"], *(_config_cell(k, run) for k in varying)]
        if "tok_s" not in run:
            rows.append(cells + [f"error: {run.get('error', '?')}", "", "", "", "", ""])
            continue
        tok_s = f"{run['tok_s']:,.0f}"
        rows.append(
            cells
            + [f"**{tok_s}**" if run["lever"] == best else tok_s]
            + [_pct(run.get("mfu_causal")), _pct(run.get("mfu_palm"))]
            + [_num(run.get("peak_mem_gib"), ".1f")]
            + [_num(run.get("vs_previous_best"), ".3f"), _num(run.get("vs_baseline"), ".3f")]
        )
    lines += _table(header, rows)
    lines += [
        "",
        "The baseline (`bench/baselines/plain_jax_llama.py`) computes its MFU with its own "
        'constant, 989 TFLOP/s, and counts the RMSNorm scales in N. "vs prev. best": tokens/s '
        "over the best run before it in the search; bold: the best run.",
        "",
    ]
    return lines + [line for note in data.get("notes", []) for line in (note, "")]


# ---------------------------------------------------------------- titan ops check --json


def ops_table(path: Path, base: Path) -> list[str]:
    """One ``titan ops check --json`` file: every (op, shape, dtype, provider) row."""
    data = json.loads(path.read_text())
    ops = list(dict.fromkeys(r["op"] for r in data["results"]))
    tolerances = "; ".join(
        f"{dtype} {t['fwd']:g} forward / {t['bwd']:g} backward"
        for dtype, t in data["tolerances"].items()
    )
    lines = [
        f"### {_link(path, base)}",
        "",
        f"`titan ops check --json` on {data['device']} (backend {data['backend']}); the options "
        f"are not recorded in the file (it holds {', '.join(ops)}). Errors are normwise, "
        f"relative to the float32 native reference; tolerances: {tolerances}. Time: forward + "
        f"backward, median of the timed runs (`titan/ops/conformance.py`). Failures: "
        f"{data['failures']}.",
        "",
    ]
    header = ["op", "shape", "dtype", "provider", "status", "fwd rel. err", "bwd rel. err"]
    header += ["ms", "vs native"]
    rows = [
        [r["op"], r["shape"], r["dtype"], r["provider"], r["status"]]
        + [_num(r["fwd_rel"], ".1e"), _num(r["bwd_rel"], ".1e")]
        + [_num(r["time_ms"], ".2f"), _num(r["time_vs_native"], ".2f")]
        for r in data["results"]
    ]
    return lines + _table(header, rows) + [""]


# ---------------------------------------------------------------- bench/pipeline.py


def _pipeline_command(data: dict[str, Any]) -> str:
    """The command: recorded, else rebuilt from the file's full argument record."""
    if "command" in data:
        return data["command"]
    parts = ["python bench/pipeline.py"]
    for key, value in data["args"].items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False or key == "one":
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts.append(f"{flag} {' '.join(str(v) for v in value)}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def _ran_todays_orders(result: dict[str, Any]) -> bool:
    """Whether a ``bench/pipeline.py`` MPMD row ran the action orders that
    :func:`titan.schedules.build_schedule` gives now: each stage's actions in the order its
    timed step started them (``timing.actions``: stage, chunk, microbatch, kind, start, end)."""
    from titan.schedules import build_schedule

    built = build_schedule(
        result["schedule"], result["pp"], result["microbatches"], result["virtual_stages"]
    )
    ran: list[list[tuple[int, int, str]]] = [[] for _ in range(result["pp"])]
    for stage, chunk, microbatch, kind, _start, _end in sorted(
        result["timing"]["actions"], key=lambda a: a[4]
    ):
        ran[stage].append((chunk, microbatch, kind))
    return ran == [[(a.chunk, a.microbatch, a.kind) for a in g] for g in built.stages]


def pipeline_table(path: Path, base: Path) -> list[str]:
    """One ``bench/pipeline.py`` file: SPMD and every schedule and microbatch count."""
    data = json.loads(path.read_text())
    results = [r for r in data["results"] if "tokens_per_s" in r]
    spmd = next((r for r in results if r["layout"] == "spmd"), None)
    args = data["args"]
    device = next((r["device_kind"] for r in results), "unknown device")
    peak = next((r.get("peak_flops_per_device") for r in results), None)
    lines = [f"### {_link(path, base)}", ""]
    lines += [
        f"`{args['preset']}` ({args['layers']} layers), global batch {args['batch_size']} x "
        f"{args['seq_len']} tokens, `{args['remat']}` remat, {args['steps']} timed steps after "
        f"{args['warmup']}, each configuration in its own process, on "
        f"{results[0]['devices'] if results else '?'} x {device}.",
        "",
        f"Command: `{_pipeline_command(data)}`",
        "",
        _peak_line(peak, device, peak is not None) + " MFU causal / full as above.",
        "",
    ]
    header = ["layout", "schedule", "M", "stage layers", "tokens/s", "vs SPMD", "MFU causal / full"]
    header += ["bubble measured (per stage)", "bubble theory", "controller overhead"]
    header += ["peak GiB per GPU"]
    rows = []
    for r in results:
        mpmd = r["layout"] == "mpmd"
        overhead = r.get("controller_overhead")
        schedule = r["schedule"] + (f", v={r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
        if mpmd and not _ran_todays_orders(r):
            schedule += " †"
        bubble = "-"
        if mpmd and "measured_bubble" in r:
            stages = ", ".join(f"{b:.0%}" for b in r["bubble_per_stage"])
            bubble = f"{r['measured_bubble']:.1%} ({stages})"
        row = [
            f"MPMD pp={r['pp']}" if mpmd else f"SPMD dp={r['devices']}",
            schedule if mpmd else "-",
            str(r["microbatches"]) if mpmd else "-",
            r["stage_layers"] or "-",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tokens_per_s'] / spmd['tokens_per_s']:.2f}" if spmd else "-",
            f"{_pct(r.get('mfu_causal'))} / {_pct(r.get('mfu_full'))}",
            bubble,
            f"{r['theoretical_bubble']:.1%}" if mpmd else "-",
            f"{overhead:+.1%}" if mpmd and overhead is not None else "-",
            ", ".join(f"{g:.1f}" for g in r["peak_gib"]),
        ]
        rows.append(row)
    lines += _table(header, rows)
    failed = [r for r in data["results"] if "tokens_per_s" not in r]
    lines += [""] + [
        f"- failed: {r.get('schedule')} M={r.get('microbatches')}: {r.get('error')}" for r in failed
    ]
    if any(r["layout"] == "mpmd" and not _ran_todays_orders(r) for r in results):
        lines += [
            "† ran other action orders than `titan.schedules` builds now (each stage's actions "
            "in the order the timed step started them): these rows are of another schedule "
            "and are to be measured again.",
            "",
        ]
    lines += [
        "Measured bubble: one step runs with a block after every action; per device group, "
        "1 - (its action times) / (normal step time - its update time), averaged over the "
        "groups (per stage in parentheses). Blocking overstates each action a little, so an "
        "almost never idle stage can come out slightly negative. Controller overhead: "
        "1 - (the schedule replayed with the blocked action times on ideal hardware, "
        "`titan.schedules.simulate`) / (normal step time); negative means the real "
        "steps are faster than that replay.",
        "",
    ]
    return lines


# ---------------------------------------------------------------- bench/planner_accuracy.py


def _planner_label(config: dict[str, Any]) -> str:
    layout = [f"{k} {config[k]}" for k in ("dp", "fsdp", "tp", "pp") if config.get(k, 1) > 1]
    if config.get("layout") == "mpmd":
        layout += [config.get("schedule", "1f1b"), f"m{config['microbatches']}"]
    return f"{config['shape']} b{config['batch_size']} s{config['seq_len']} {config['remat']}, " + (
        " ".join(layout) or "1 device"
    )


def planner_tables(path: Path, base: Path) -> list[str]:
    """``bench/planner_accuracy.py``: per suite, predicted against measured step and memory."""
    data = json.loads(path.read_text())
    lines = [
        f"Result file: {_link(path, base)}. Command: `{data['command']}`. One achievable "
        "fraction of peak is fitted per GPU kind over its runs; leave-one-out refits it "
        "without the run it predicts. Peak memory in GB (1e9 bytes); the CPU runs of MPMD "
        "record none.",
        "",
    ]
    for kind, s in data["summary"].items():
        lines.append(
            f"- {kind}: {s['runs']} runs, fitted fraction {s['achievable_fraction']:.3f}; step "
            f"time mean |error| {s['step_mean_abs_pct']:.1f}% "
            f"(worst {s['step_worst_abs_pct']:.1f}%), "
            f"leave-one-out {s['loo_step_mean_abs_pct']:.1f}% (worst "
            f"{s['loo_step_worst_abs_pct']:.1f}%); peak memory mean |error| "
            f"{s['memory_mean_abs_pct']:.1f}% (worst {s['memory_worst_abs_pct']:.1f}%)."
        )
    lines.append("")
    header = ["suite", "configuration", "device", "step s measured", "predicted", "error"]
    header += ["leave-one-out", "peak GB measured", "predicted", "error"]
    rows = []
    for run in data["runs"]:
        m, config = run["measured"], run["config"]
        if "error" in m:
            rows.append(
                [config["suite"], _planner_label(config), f"failed: {m['error'][:80]}"] + [""] * 7
            )
            continue
        p, e = run["predicted"], run["error_pct"]
        memory = ["-", "-", "-"]
        if m.get("peak_bytes"):
            memory = [
                f"{m['peak_bytes'] / 1e9:.3g}",
                f"{p['peak_bytes'] / 1e9:.3g}",
                f"{e['memory']:+.1f}%",
            ]
        rows.append(
            [config["suite"], _planner_label(config), m["device_kind"]]
            + [
                f"{m['step_s']:.4f}",
                f"{p['step_s']:.4f}",
                f"{e['step']:+.1f}%",
                f"{e['loo_step']:+.1f}%",
            ]
            + memory
        )
    return lines + _table(header, rows) + [""]


DRAWS_COMMAND = "python bench/planner_accuracy.py --evaluate"


def _errors_cell(errors: dict[str, Any]) -> str:
    if not errors.get("n"):
        return "-"
    return f"{errors['mean_abs_pct']:.1f}% / {errors['worst_abs_pct']:.1f}% ({errors['n']})"


def planner_held_out_table(path: Path, base: Path) -> list[str]:
    """The held-out figures of ``planner_draws_evaluation.json``: per draw, the fit half, the
    held-out half and leave-one-out, as mean / worst absolute error (configurations)."""
    data = json.loads(path.read_text())
    measured = _link(path.with_name("planner_draws.json"), base)
    lines = [
        f"Result file: {_link(path, base)}, from {measured}. Command: `{DRAWS_COMMAND}`. "
        "One H200; constants fitted on a random half of each draw, scored on the other half; "
        "mean / worst absolute error (configurations).",
        "",
    ]
    header = ["draw (seed)", "half", "step time", "peak memory", "false fits"]
    rows = []
    for draw in data["draws"]:
        seed, fits = str(draw["seed"]), ", ".join(map(str, draw["false_fits"])) or "none"
        rows.append([seed, "fit", _errors_cell(draw["fit"]["step"])])
        rows[-1] += [_errors_cell(draw["fit"]["memory"]), fits]
        rows.append([seed, "**held out**", _errors_cell(draw["held_out"]["step"])])
        rows[-1] += [_errors_cell(draw["held_out"]["memory"]), fits]
        if "with_first_draw_fit" in draw:
            other = draw["with_first_draw_fit"]
            rows.append([seed, "all, with draw 1's fit", _errors_cell(other["step"])])
            rows[-1] += [_errors_cell(other["memory"]), fits]
        rows.append([seed, "leave-one-out", _errors_cell(draw["leave_one_out_step"]), "-", ""])
    draws = json.loads(path.with_name("planner_draws.json").read_text())
    measured_by = [f"`{c}`" for key in sorted(draws, key=int) for c in draws[key]["commands"]]
    lines[1:1] = ["", f"Measured with {', '.join(measured_by)} (each as far as its budget went)."]
    spread = data["held_out_spread_pct"]
    note = (
        f"Held-out spread between the draws: {spread['step']:.1f} points (step time), "
        f"{spread['memory']:.1f} points (peak memory)."
    )
    return lines + _table(header, rows) + ["", note]


def planner_draw_tables(path: Path, base: Path) -> list[str]:
    """``planner_draws_evaluation.json``: the held-out table, the fitted constants and every
    configuration of every draw, predicted against measured."""
    data = json.loads(path.read_text())
    lines = planner_held_out_table(path, base) + [""]
    for draw in data["draws"]:
        c = draw["step_constants"]
        lines.append(
            f"- draw {draw['seed']} ({draw['configurations']} configurations): fitted on its fit "
            f"half {draw['fit_indices']}: matmuls at {c['matmul']:.3f} of peak, attention at "
            f"{c['attention']:.3f}, memory-bound kernels at {c['memory']:.3f} of HBM bandwidth; "
            f"the fits verdict needs a margin of {draw['margin_needed']:.1%} on its fit half."
        )
    lines.append("")
    header = ["draw", "#", "half", "configuration", "step s measured", "predicted", "error"]
    header += ["peak GB compiled", "predicted", "error", "verdict"]
    rows = []
    for draw in data["draws"]:
        for row in draw["rows"]:
            stepped = row["step_s"] is not None
            verdict = ("fits" if row["fits"] else "does not fit") + (", OOM" if row["oom"] else "")
            rows.append(
                [str(draw["seed"]), str(row["index"]), row["half"], row["label"]]
                + [
                    f"{row['step_s']:.4f}" if stepped else "OOM",
                    f"{row['predicted_step_s']:.4f}",
                    f"{row['step_error_pct']:+.1f}%" if stepped else "-",
                    f"{row['peak_gb']:.2f}",
                    f"{row['predicted_gb']:.2f}",
                    f"{row['memory_error_pct']:+.1f}%",
                    verdict,
                ]
            )
    return lines + _table(header, rows) + [""]


# ---------------------------------------------------------------- console and data loader


def planner_microbatch_table(path: Path, base: Path) -> list[str]:
    """``bench/planner_microbatch.py``: per configuration, the microbatched step against one
    batch and against M steps of one microbatch's batch."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`.", ""]
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for key, run in data["runs"].items():
        index, name = key.split(":")
        groups.setdefault(index, {})[name] = run
    rows = []
    for index, runs in groups.items():
        drawn, whole, part = runs.values()
        m = drawn["config"]["microbatches"]
        rows.append(
            [index, drawn["label"], str(m)]
            + [_num(r["step_s"], ".4f") for r in (drawn, whole, part)]
            + [_num(drawn["step_s"] / whole["step_s"], ".3f")]
            + [_num(drawn["step_s"] / (m * part["step_s"]), ".3f")]
        )
    header = ["#", "configuration", "M", "step (s)", "M = 1 (s)", "M = 1, batch / M (s)"]
    header += ["step / M = 1", "step / (M x batch / M)"]
    return lines + _table(header, rows) + [""]


def planner_unroll_table(path: Path, base: Path) -> list[str]:
    """``bench/planner_unroll.py``: one configuration's compiled peak and step time under each
    remat policy, the layer loop rolled and fully unrolled."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`.", ""]
    machine = data.get("machine", "machine not recorded")
    lines += [f"Configuration: {data['label']} ({machine}).", ""]
    rows = [
        [
            r["remat"],
            str(r["layer_unroll"]),
            _num(r["peak_bytes"] and r["peak_bytes"] / 1e9, ".2f"),
            _num(r["step_s"], ".4f") if r["step_s"] else (r["error"] or "-"),
        ]
        for r in data["runs"]
    ]
    header = ["remat", "--layer-unroll", "compiled peak (GB)", "step (s)"]
    return lines + _table(header, rows) + [""]


def planner_search_table(path: Path, base: Path) -> list[str]:
    """``bench/planner_search.py``: ``titan plan --search``'s time against one fixed layout's
    plan, per cluster size."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`.", ""]
    lines += [f"Machine: {data['machine']}; each time the median of {data['repeats']} runs.", ""]
    rows = [
        [
            r["model"],
            f"{r['gpus']:,}",
            r["tokens"],
            f"{r['fixed_s']:.4f}",
            f"{r['search_s']:.4f}",
            f"{r['ratio']:.1f}",
        ]
        for r in data["rows"]
    ]
    header = ["model", "GPUs", "tokens", "one layout (s)", "--search (s)", "search / one"]
    return lines + _table(header, rows) + [""]


def _figure(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, bool | str):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 or isinstance(value, int) else f"{value:.4g}"


def console_table(path: Path, base: Path) -> list[str]:
    data = json.loads(path.read_text())
    command = f"`{data['command']}`" if "command" in data else "not recorded (`bench/console.py`)"
    lines = [
        f"Result file: {_link(path, base)}; command: {command}; machine: {data['machine']}.",
        "",
    ]
    rows = [
        [name, _figure(value), _figure(data["targets"][name]) if name in data["targets"] else ""]
        + [("met" if data["met"][name] else "**missed**") if name in data["met"] else ""]
        for name, value in data["figures"].items()
    ]
    return lines + _table(["figure", "value", "target", ""], rows) + [""]


def data_loader_table(path: Path, base: Path) -> list[str]:
    """``bench/data_loader.py``: tokenizer training, tokenization with one worker and with all,
    peak RSS, batch assembly, against the training throughput they feed."""
    data = json.loads(path.read_text())
    corpus, train = data["corpus"], data["train"]
    lines = [
        f"Result file: {_link(path, base)}; command: `{data['command']}`. Corpus: "
        f"{corpus['shards']} `.jsonl.zst` shards, {corpus['text_bytes'] / 1e9:.2f} GB of text "
        f"({corpus['bytes_on_disk'] / 1e9:.2f} GB on disk); {data['cpu_count']} CPU cores, load "
        f"average "
        f"{data['load_average'][0]:.1f} at the end (shared machine). Training to feed: "
        f"{train['what']}, {train['tokens_per_s']:,.0f} tokens/s "
        f"({_link(REPO / train['record'], base)}).",
        "",
    ]
    rows = [["tokenizer training (sample streamed + sentencepiece)", "", "", "", "", ""]]
    rows[0][1] = f"{data['tokenizer']['train_s']:.1f} s"
    for key in ("tokenize_one_worker", "tokenize_all_workers"):
        t = data[key]
        peaks = [t[f"peak_rss_{who}_bytes"] / 2**20 for who in ("parent", "worker")]
        rows.append(
            [
                f"tokenize, {t['workers']} worker(s), {t['files']} shard(s)",
                f"{t['seconds']:.1f} s ({t['share_read']:.0%} read, {t['tokens']:,} tokens)",
                f"{t['tokens_per_s']:,.0f}",
                f"{t['tokens_per_s_per_worker']:,.0f}",
                f"{peaks[0]:,.0f} / {peaks[1]:,.0f}",
                f"{t['tokens_per_s'] / train['tokens_per_s']:.2f}",
            ]
        )
    assembly = data["batch_assembly"]
    rows.append(
        [
            f"batch assembly ({assembly['batch_size']} x {assembly['seq_len']})",
            "",
            f"{assembly['tokens_per_s']:,.0f}",
            "",
            "",
            f"{data['assembly_over_train']:,.0f}",
        ]
    )
    header = ["stage", "time", "tokens/s", "tokens/s per worker", "peak RSS MiB (parent / worker)"]
    header.append("over training")
    footer = [
        "",
        f"Workers needed to feed the training run at one worker's rate: "
        f"{data['workers_to_feed_training']}.",
        "",
    ]
    return lines + _table(header, rows) + footer


def _reserved(reserved: dict[str, Any] | None) -> str:
    """A run's reservation of pinned host memory (``bench/checkpoint.py``'s ``pinned_host``)."""
    if reserved is None:
        return "-"
    if reserved.get("error"):
        return "failed: " + str(reserved["error"]).replace("|", "/")
    return f"{_giga(reserved['bytes']):.2f}, {_num(reserved.get('seconds'), '.1f')}"


def checkpoint_table(path: Path, base: Path) -> list[str]:
    """``bench/checkpoint.py``: synchronous against asynchronous saves, one row per variant."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`.", ""]
    rows = []
    for name, v in data["variants"].items():
        rows.append(
            [name, v["device"], str(v["saves"]), str(v["failed_saves"])]
            + [_num(v["blocking_s"], ".3f"), _each(v.get("commits_s"), ".1f")]
            + [_each(v.get("loop_cost_s"), ".2f"), _num(v["final_save_s"], ".2f")]
            + [_num(v[k], ".3f") for k in ("step_time_s", "saving_step_time_s")]
            + [_num(_giga(v.get("checkpoint_bytes")), ".2f"), _reserved(v.get("pinned_host"))]
            + [_pct(v["ettr"])]
        )
    header = ["variant", "device", "saves", "failed", "blocking (s)", "commit, each save (s)"]
    header += ["loop cost, each save (s)", "final wait (s)", "step time (s)"]
    header += ["step time while saving (s)", "GB on disk", "pinned host reserved: GB, s", "ETTR"]
    notes = [
        f"Steps while a save is in flight, {name}: {_num(value, '.4f')} x the other steps' time "
        "(medians)"
        + (
            f", {_num(mean, '.4f')} x (means)."
            if (mean := data.get("mean_slowdown_while_saving", {}).get(name)) is not None
            else "."
        )
        for name, value in data.get("slowdown_while_saving", {}).items()
    ]
    ratios = data["ratios_async_over_sync"]
    if ratios["ettr"] is not None:
        notes.append(f"ETTR async / sync: {_num(ratios['ettr'], '.3f')}.")
    notes += [
        f"Badput, {name} (s): "
        + ", ".join(f"{kind} {seconds:.2f}" for kind, seconds in v["badput_s"].items() if seconds)
        + "."
        for name, v in data["variants"].items()
        if v.get("badput_s")
    ]
    notes += [data["notes"]] if data.get("notes") else []
    return lines + _table(header, rows) + [""] + [" ".join(notes), ""] * bool(notes)


def _each(values: list[float] | None, fmt: str) -> str:
    """``values`` as ``a, b, c`` (``-`` when not recorded)."""
    return "-" if values is None else ", ".join(format(v, fmt) for v in values)


def _giga(value: float | None) -> float | None:
    return None if value is None else value / 1e9


def startup_table(path: Path, base: Path) -> list[str]:
    """``bench/startup.py``: time to first step per start, cold then from the warm cache."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`.", ""]
    rows = [
        [
            str(i + 1),
            "cold" if not s["cache_hits"] else "warm",
            _num(s["time_to_first_step_s"], ".1f"),
        ]
        + [_num(s["compile_s"], ".2f"), str(s["cache_hits"]), str(len(s["recompiles"]))]
        + [_num(s["step_time_s"], ".3f"), _num(s.get("pinned_host_s"), ".1f")]
        for i, s in enumerate(data["starts"])
    ]
    header = ["start", "cache", "time to first step (s)", "compile (s)", "cache hits"]
    header += ["recompiles", "step time (s)", "pinned host reserved (s)"]
    notes = data.get("notes", [])
    return lines + _table(header, rows) + [""] + [line for n in notes for line in (n, "")]


def layer_loop_table(path: Path, base: Path) -> list[str]:
    """The layer loop rolled against unrolled: tokens/s, compile time and memory per run."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; {data['device']}, jax {data['jax']}.", ""]
    lines += [data["method"], ""]
    rows = [
        [f"`{r['command']}`", str(r["blocks_per_iteration"]), f"{r['tokens_per_s']:,}"]
        + [_num(r["compile_s"], ".1f"), _num(r["compiled_gb"], ".2f")]
        + [_num(r["peak_memory_gib"], ".1f")]
        for r in data["runs"]
    ]
    header = ["run", "blocks per iteration", "tokens/s", "compile (s)", "compiled GB"]
    return lines + _table([*header, "peak GiB"], rows) + [""]


PEER_SYSTEMS = (
    "titan-defaults",
    "titan-best",
    "titan-float8",
    "plain-jax",
    "torchtitan",
    "torchtitan-compat",
    "torchtitan-0.2.2",
    "maxtext",
    "maxtext-fp8",
)


def peers_table(path: Path, base: Path) -> list[str]:
    """``bench/peers.py``: each system on each shape, from one call per shape."""
    data = json.loads(path.read_text())
    commands = data["command"] if isinstance(data["command"], list) else [data["command"]]
    lines = [
        f"Result file: {_link(path, base)}; commands: "
        + "; ".join(f"`{c}`" for c in commands)
        + "."
    ]
    lines += [
        "",
        f"MFU: {data['mfu_convention']} ({data['peak_flops'] / 1e12:,.1f} TFLOP/s on "
        f"{data['device']}). Titan's best options: `{data['best_options']}`.",
        "",
    ]
    rows = []
    for name, systems in data["results"].items():
        shape = data["shapes"][name]
        for system in PEER_SYSTEMS:
            if system not in systems:
                continue
            r = systems[system]
            where = (
                f"{name} (B{shape['batch']} x S{shape['seq_len']}, {shape['param_dtype']} master)"
            )
            if "error" in r:
                rows.append([where, system, "failed: " + r["error"].replace("|", "/"), "", "", ""])
                continue
            rows.append(
                [where, system, f"{r['tokens_per_s']:,.0f}", _pct(r.get("mfu"))]
                + [_num(r["peak_memory_gib"], ".1f"), _num(r["time_to_first_step_s"], ".1f")]
            )
    header = ["shape", "system", "tokens/s", "MFU", "peak GiB", "time to first step (s)"]
    not_run = "; ".join(f"{k}: {v}" for k, v in data.get("not_run", {}).items())
    notes = [f"{note}" for note in data.get("notes", [])]
    notes += [f"Not run: {not_run}."] if not_run else []
    return lines + _table(header, rows) + [""] + [line for n in notes for line in (n, "")]


def fp8_table(path: Path, base: Path) -> list[str]:
    """``bench/fp8.py``: each system's tokens/s per shape against Titan's bf16 defaults, and the
    loss of the bf16 and float8 runs on the same tokens."""
    data = json.loads(path.read_text())
    lines = [
        f"Result file: {_link(path, base)}; command: `{data['command']}`.",
        "",
        f"MFU: {data['mfu_convention']}"
        + (f" ({data['peak_flops'] / 1e12:,.1f} TFLOP/s" if data["peak_flops"] else " (")
        + f" on {data['device']}).",
        "",
    ]
    rows = []
    for name, systems in data["results"].items():
        shape = data["shapes"][name]
        where = f"{name} (B{shape['batch']} x S{shape['seq_len']}, {shape['param_dtype']} master)"
        for system, r in systems.items():
            if "error" in r:
                rows.append([where, system, "failed: " + r["error"].replace("|", "/")] + [""] * 4)
                continue
            rows.append(
                [where, system, f"{r['tokens_per_s']:,.0f}", _pct(r.get("mfu"))]
                + [_num(r.get("vs_bf16"), ".3f"), _num(r.get("peak_memory_gib"), ".1f")]
                + [str(r.get("remat") or "")]
            )
    header = ["shape", "system", "tokens/s", "MFU", "vs bf16", "peak GiB", "remat"]
    lines += _table(header, rows) + [""]
    for name, check in data["loss_check"].items():
        if check is None:
            continue
        means = check["mean_loss"]
        lines += [
            f"Loss on the same tokens, {name}, {check['steps']} steps, mean of the last "
            f"{check['window']}: bf16 {means['bf16']:.4f}, float8 {means['float8']:.4f} "
            f"({check['relative_difference']:+.2%}).",
            "",
        ]
    return lines


def attention_table(path: Path, base: Path) -> list[str]:
    """``bench/attention.py``: each attention path's forward and backward time per shape and
    document distribution, with its largest error against ``native``."""
    data = json.loads(path.read_text())
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`; {data['device']}, "]
    lines[0] += f"jax {data['jax']}."
    lines += [
        "",
        "One layer's attention, forward and backward (bf16), median of the timed calls; "
        "TFLOP/s of the documents' causal attention (what the document mask computes); error: "
        "the largest normwise relative error of out, dq, dk, dv against `native` (float32 "
        "softmax). `cudnn` is the provider as served (packed documents, the dense mask behind a "
        "`lax.cond` for a batch over the bound); `cudnn-packed` is the packed path alone, which "
        "over the bound (`short`) leaves the documents past the bound out: its figures there "
        "are not results (uncovered tokens read whatever the buffer held); `cudnn-causal` "
        "ignores the documents (its error is the mask it leaves out).",
        "",
    ]
    rows = []
    for name, result in data["results"].items():
        shape, docs = result["shape"], result["documents_per_row"]
        where = (
            f"{name.split()[0]} B{shape['B']} S{shape['S']} H{shape['H']} K{shape['K']} "
            f"D{shape['D']}, {result['documents']}: {docs['min']} to {docs['max']} documents "
            f"per row (bound {result['segment_bound']})"
        )
        for variant, r in result["variants"].items():
            if "error" in r:
                rows.append([where, variant, "failed: " + r["error"].replace("|", "/"), "", ""])
                continue
            errors = list(r["relative_error"].values())
            error = math.nan if any(math.isnan(e) for e in errors) else max(errors)
            rows.append(
                [where, variant, f"{r['ms']:.3f}", f"{r['tflops_per_s']:.1f}", f"{error:.1e}"]
            )
    return lines + _table(["shape", "path", "ms", "TFLOP/s", "error"], rows) + [""]


def tpu_attention_table(path: Path, base: Path) -> list[str]:
    """``bench/tpu_attention.py``: attention's forward and backward time on a TPU chip per mask,
    for XLA (``native``) and the splash kernels at their default and other block sizes."""
    data = json.loads(path.read_text())
    blocks = data["default_blocks"]["block_q"]
    lines = [f"Result file: {_link(path, base)}; command: `{data['command']}`; {data['device']}, "]
    lines[0] += f"jax {data['jax']}; median of {data['iters']} calls after {data['warmup']}."
    lines += [
        "",
        "One layer's attention, forward and backward (bf16); TFLOP/s of the causal attention the "
        "mask computes; error: the largest normwise relative error of out, dq, dk, dv against "
        f"`native` in float32. `splash` runs its default blocks ({blocks} tokens, fitted to the "
        "sequence), `splash-N` every block at N.",
        "",
    ]
    rows = []
    for mask, result in data["results"].items():
        shape = result["shape"]
        where = f"B{shape['B']} S{shape['S']} H{shape['H']} K{shape['K']} D{shape['D']}, {mask}"
        for variant, r in result["variants"].items():
            if "error" in r:
                rows.append([where, variant, "failed: " + r["error"].replace("|", "/"), "", "", ""])
                continue
            rows.append(
                [
                    where,
                    variant,
                    f"{r['ms']:.3f}",
                    f"{r['tflops_per_s']:.1f}",
                    f"{r['speedup_vs_native']:.2f}x",
                    f"{max(r['relative_error'].values()):.1e}",
                ]
            )
    header = ["shape, mask", "variant", "ms", "TFLOP/s", "vs native", "error"]
    return lines + _table(header, rows) + [""]


def tpu_table(path: Path, base: Path) -> list[str]:
    """``bench/tpu.py``: Titan on one TPU chip: the default run, Titan's defaults against the
    plain-JAX baseline per shape (tokens/s, MFU recomputed in both conventions, the memory
    estimate against the compiled program), and ``titan ops check``."""
    data = json.loads(path.read_text())
    peak = data["peak_flops"]
    default, ops = data["default_run"], data["ops_check"]
    default_mfu = (default.get("mfu") or {}).get("causal")
    lines = [
        f"Result file: {_link(path, base)}; command: `{data['command']}`; {data['device_kind']}, "
        f"jax {data['jax']}. MFU: 6N + 12Lsd model FLOPs per token (attention halved for "
        f"causal / in full) over the dense bf16 peak, {peak / 1e12:.0f} TFLOP/s "
        f"({data['peak_source']}).",
        "",
        f"- `titan train --steps 30` with no other option: exit {default['rc']} in "
        f"{default.get('wall_s', 0):.0f} s, MFU causal {_pct(default_mfu)}.",
        f"- `titan ops check`: exit {ops['rc']} in {ops.get('wall_s', 0):.0f} s"
        + (f", {len(ops['not_passed'])} of {ops['rows']} rows not passed" if "rows" in ops else "")
        + ".",
        "",
    ]
    rows = []
    for row in data["shapes"]:
        shape, titan = row["shape"]["name"], row["titan"]
        if "baseline" not in row:
            said = (titan.get("tail") or ["-"])[-1].replace("|", "/")
            rows.append([shape, "titan defaults", "-", "-", "-", "-", "-", "-", "-", said])
            continue
        baseline = row["baseline"]
        if baseline.get("tok_s"):
            mfu = baseline["mfu_recomputed"]
            rows.append(
                [shape, "plain JAX", "dots" if baseline.get("remat") else "none", baseline["attn"]]
                + [f"{baseline['tok_s']:,.0f}", _pct(mfu["causal"]), _pct(mfu["full"])]
                + ["-", "-", "1.00"]
            )
        mfu = titan["mfu_recomputed"]
        estimate = (titan.get("memory_check") or {}).get("estimate_bytes")
        ratio = row.get("titan_over_baseline")
        rows.append(
            [shape, "titan defaults", titan["remat"], (titan.get("served") or {}).get("attention")]
            + [f"{titan['tok_s']:,.0f}", _pct(mfu["causal"]), _pct(mfu["full"])]
            + [_num(_giga(estimate), ".2f"), _num(_giga(titan.get("program_bytes")), ".2f")]
            + [_num(ratio, ".3f")]
        )
    header = ["shape", "program", "remat", "attention", "tokens/s", "MFU causal", "MFU full"]
    header += ["estimate GB", "compiled GB", "vs plain JAX"]
    return lines + _table(header, rows) + [""]


def roofline_table(path: Path, base: Path) -> list[str]:
    """``bench/roofline.py``: the profiled step's kernel time by row against its floor."""
    data = json.loads(path.read_text())
    inputs = [REPO / data["trace"], REPO / data["hlo"]]
    lines = [
        f"Result file: {_link(path, base)}, from {_link(inputs[0], base)} and "
        f"{_link(inputs[1], base)}; command: `{data['command']}`.",
        "",
    ]
    lines += [
        f"Kernel time per step {data['kernel_time_s'] * 1e3:.1f} ms; the floors add up to "
        f"{data['floor_s'] * 1e3:.1f} ms (at {data['peak_flops'] / 1e12:,.1f} TFLOP/s and "
        f"{data['hbm_bytes_per_s'] / 1e12:.1f} TB/s, the datasheet's figures). Rows by gap, "
        "the 15 largest.",
        "",
    ]
    rows = [
        [r["row"], f"{r['seconds'] * 1e3:.2f}", _num(r["calls_per_step"], ".0f")]
        + [f"{r['flops'] / 1e12:.2f}", f"{r['bytes'] / 1e9:.2f}"]
        + [f"{r['floor_s'] * 1e3:.2f}", f"{r['gap_s'] * 1e3:.2f}"]
        for r in data["rows"][:15]
    ]
    header = ["row", "time (ms)", "calls", "TFLOP", "GB", "floor (ms)", "gap (ms)"]
    notes = data.get("notes", [])
    return lines + _table(header, rows) + [""] + [line for n in notes for line in (n, "")]


def dit_table(path: Path, base: Path) -> list[str]:
    """``bench/dit.py``: Titan's DiT train step against the plain-JAX DiT step, one row each."""
    data = json.loads(path.read_text())
    command = f"`{data['command']}`" if "command" in data else "not recorded (`bench/dit.py`)"
    peak = _catalog_peak(data["device_kind"])
    lines = [
        f"Result file: {_link(path, base)}; command: {command}. Batch {data['batch']} of 32 x 32 "
        f"x 4 random latents (a 256 x 256 image), {data['steps']} timed steps, "
        f"{data['device_kind']}, jax {data['jax']}.",
        "",
        _peak_line(peak, data["device_kind"], False),
        "",
        "MFU: images/s x model FLOPs per image over the peak, attention in full (a DiT's "
        "attention is not causal). Titan counts with `titan.flops.dit_token_flops`, "
        "where the adaLN modulation acts once per image; the baseline counts 6 x its matmul "
        "parameters per patch, adaLN included, so its FLOPs per image are higher for the same "
        "size and its MFU reads higher: compare the images/s.",
        "",
    ]
    base_run, titan = data["baseline"], data["titan"]
    served = ", ".join(f"{op} {name}" for op, name in titan["served"].items())
    rows = [
        ["plain-JAX baseline (`bench/baselines/plain_jax_dit.py`)", f"{base_run['params']:,}"]
        + [_num(base_run["images_s"], ",.0f"), _pct(base_run["mfu"])]
        + [_num(base_run["peak_mem_gb"], ".1f"), "1.00", "-"],
        [f"titan `{titan['preset']}`", f"{titan['params']:,}", _num(titan["images_s"], ",.0f")]
        + [_pct(titan["mfu"]), _num(titan["peak_mem_gb"], ".1f")]
        + [_num(titan["images_s"] / base_run["images_s"], ".2f"), served],
    ]
    header = ["step", "parameters", "images/s", "MFU", "peak GB", "vs baseline", "providers"]
    return lines + _table(header, rows) + [""]


def _maxtext_providers(run: dict[str, Any]) -> str:
    """A MaxText run's attention kernel and remat policy, or a Titan run's operator providers."""
    source = run["model_source"]
    if source.get("layers_by", "titan") == "titan":
        return ", ".join(f"{op} {name}" for op, name in run["ops"].items())
    return f"MaxText attention {source['attention']}, remat {source['remat_policy']}"


def maxtext_table(path: Path, base: Path) -> list[str]:
    """``bench/maxtext.py``: a MaxText llama and Titan's Llama of one shape, one row a run."""
    data = json.loads(path.read_text())
    shape, options = data["shape"], data["options"]
    runs = data["runs"]
    first = next(iter(runs.values()))
    lines = [
        f"Result file: {_link(path, base)}; command: `python bench/maxtext.py` (each model "
        "trained by Titan's trainer in its own process). Model: "
        f"{shape['n_layers']} layers, d {shape['d_model']}, {shape['n_heads']} heads, "
        f"{shape['n_kv_heads']} KV heads, ffn {shape['ffn_dim']}, vocabulary "
        f"{shape['vocab_size']} ({first['param_count']:,} parameters); batch "
        f"{options['batch_size']} x {options['seq_len']} tokens of `{options['data']}`, "
        f"`--remat {options['remat']}`, `--attention-mask {options['attention_mask']}`, "
        f"{first['compute_dtype']} compute; medians of {first['steps_timed']} steps after "
        f"{data['skip']}; {first['env']['device_kinds'][0]}, jax "
        f"{first['env']['packages']['jax']}.",
        "",
        _peak_line(first["peak_flops"], first["env"]["device_kinds"][0], True),
        "",
        f"MaxText's settings: `{' '.join(data['maxtext_set'])}` (`llama2-7b` reshaped). "
        f"{data.get('provenance', '')}",
        "",
    ]
    rows = [
        [name, run["model_source"]["layers_by"], _num(run["tokens_per_s"], ",.0f")]
        + [_pct(run["mfu"]["causal"]), _pct(run["mfu"]["full"]), _num(run["compile_s"], ".1f")]
        + [_num(run["loss_last"], ".3f"), _maxtext_providers(run)]
        for name, run in runs.items()
    ]
    header = ["run", "layers by", "tokens/s", "MFU causal", "MFU full", "compile s"]
    return lines + _table(header + ["last loss", "providers"], rows) + [""]


# ---------------------------------------------------------------- titan train run records


def _events(run_dir: Path) -> list[dict[str, Any]]:
    events = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a torn last line
            continue
    return events


def _train_command(config: dict[str, Any]) -> str:
    parts = ["titan train"]
    for key in ("preset", "steps", "batch_size", "seq_len", "remat", "attention_mask"):
        parts.append(f"--{key.replace('_', '-')} {config[key]}")
    parts.append(f"--layer-unroll {config['layer_unroll']}")
    if config.get("ops"):
        parts.append(f"--ops {config['ops']}")
    return " ".join(parts)


def _program_bytes(compile_event: dict[str, Any]) -> int:
    """A ``compile`` event's program bytes: arguments + outputs - aliases + temporaries."""
    memory = compile_event["memory"]
    parts = memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"]
    return int(parts - memory["alias_bytes"])


def run_records_table(group: Path, base: Path) -> list[str]:
    """A folder of ``titan train`` run records: medians of steps 2 to N per run, and its memory:
    the estimate ``run_start`` records, the compiled step's program and the steps' peak."""
    rows, commands, peaks = [], [], set()
    for run_dir in sorted(p for p in group.iterdir() if (p / "events.jsonl").exists()):
        events = _events(run_dir)
        start = next(e for e in events if e["type"] == "run_start")
        steps = [e for e in events if e["type"] == "step" and e["step"] >= 2]
        end = next((e for e in events if e["type"] == "run_end"), {})
        mfu = [e["mfu"] for e in steps if e.get("mfu")]
        peaks |= {(m["peak_flops"], m.get("peak_kind", "")) for m in mfu}
        served = start["ops"]
        joules = [e["joules_per_token"] for e in steps if e.get("joules_per_token") is not None]
        config = start["config"]
        estimate = (start.get("memory_check") or {}).get("estimate_bytes")
        compiled = next(
            (_program_bytes(e) for e in events if e["type"] == "compile" and e.get("memory")),
            None,
        )
        peak = max((e["peak_memory_bytes"] for e in steps if e.get("peak_memory_bytes")), default=0)
        rows.append(
            [f"`{run_dir.name}`", served["cross_entropy"], served["rope"], served["swiglu"]]
            + [served["attention"], config["remat"], config["attention_mask"]]
            + [str(config["layer_unroll"]), f"{len(steps)}"]
            + [f"{statistics.median(e['tokens_per_s'] for e in steps):,.0f}"]
            + [_pct(statistics.median(m["causal"] for m in mfu) if mfu else None)]
            + [_pct(statistics.median(m["full"] for m in mfu) if mfu else None)]
            + [_num(statistics.median(joules) if joules else None, ".4f")]
            + [_num(_giga(estimate), ".2f"), _num(_giga(compiled), ".2f")]
            + [_num(_giga(peak or None), ".2f"), end.get("status", "-")]
        )
        commands.append(f"- `{run_dir.name}`: `{_train_command(config)}`")
    device = "unknown device"
    for run_dir in sorted(group.iterdir()):
        if (run_dir / "events.jsonl").exists():
            env = next(e for e in _events(run_dir) if e["type"] == "run_start").get("env", {})
            device = ", ".join(env.get("device_kinds", [])) or device
            break
    peak = ", ".join(f"{p / 1e12:,.1f} TFLOP/s ({kind})" for p, kind in sorted(peaks)) or "none"
    lines = [
        f"### {_link(group, base)}",
        "",
        f"Device: {device}. Peak, as recorded in the step events: {peak}. Medians over steps 2 "
        "to the last (step 1 waits for compilation).",
        "",
    ]
    header = ["run", "cross-entropy", "rope", "swiglu", "attention", "remat", "attention mask"]
    header += ["layer unroll", "steps", "tokens/s", "MFU causal", "MFU full", "J/token"]
    header += ["estimate GB", "compiled GB", "peak GB", "status"]
    lines += _table(header, rows)
    return lines + ["", "Commands (from each run's `config.json`):", "", *commands, ""]


# ---------------------------------------------------------------- the documents


def render(results: Path = RESULTS, doc: Path = DOC) -> str:
    """``docs/benchmarks.md`` as generated from ``results``."""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python bench/report.py` from bench/results/; do not edit by hand. "
        "tests/bench/test_bench_docs.py fails when this file is stale. -->",
        "",
        "Every table below is generated from a file in `bench/results/` and names it. The "
        "machines are shared: compare rows of one file, which ran together, rather than rows of "
        "different files.",
        "",
        "## MFU convention",
        "",
        MFU_CONVENTION,
        "",
        "## Train step against plain JAX (`bench/mfu.py`, one GPU)",
        "",
        "A greedy search: from the starting configuration, each lever's values are tried in "
        "turn with the others held at the best so far, each configuration in its own process; "
        "the plain-JAX baseline runs in the same invocation. Files ordered by their fastest run.",
        "",
    ]
    files = mfu_files(results)
    keys = [json.loads(f.read_text())["runs"][0]["config"] for f in files]
    all_keys = list(dict.fromkeys(k for config in keys for k in config))
    for path in files:
        lines += mfu_table(path, doc, all_keys)
    lines += ["## `titan train` run records", ""]
    for group in sorted(p for p in results.iterdir() if p.is_dir()):
        lines += run_records_table(group, doc)
    lines += ["## Operators (`titan ops check --json`)", ""]
    for path in sorted(results.glob("ops-*.json")):
        lines += ops_table(path, doc)
    lines += ["## Pipeline schedules (`bench/pipeline.py`)", ""]
    for path in sorted(results.glob("pipeline-*.json")):
        lines += pipeline_table(path, doc)
    checkpoint_files = sorted(results.glob("checkpoint-*.json"))
    if checkpoint_files:
        lines += ["## Checkpoints (`bench/checkpoint.py`)", ""]
        for path in checkpoint_files:
            lines += checkpoint_table(path, doc)
    for path in sorted(results.glob("attention-*.json")):
        lines += ["## Attention under the document mask (`bench/attention.py`, one GPU)", ""]
        lines += attention_table(path, doc)
    for path in sorted(results.glob("tpu-*.json")):
        if not path.name.startswith("tpu-attention-"):
            lines += ["## Titan on a TPU (`bench/tpu.py`, one chip)", ""]
            lines += tpu_table(path, doc)
    for path in sorted(results.glob("tpu-attention-*.json")):
        lines += ["## Attention on a TPU (`bench/tpu_attention.py`, one chip)", ""]
        lines += tpu_attention_table(path, doc)
    peer_files = sorted(results.glob("peers-*.json"))
    if peer_files:
        lines += ["## Titan against its peers, per shape (`bench/peers.py`, one GPU)", ""]
        for path in peer_files:
            lines += peers_table(path, doc)
    for path in sorted(results.glob("fp8-*.json")):
        lines += ["## FP8 training and fused projections (`bench/fp8.py`, one GPU)", ""]
        lines += fp8_table(path, doc)
    for path in sorted(results.glob("layer-loop-*.json")):
        lines += ["## The layer loop, rolled and unrolled (`titan train --layer-unroll`)", ""]
        lines += layer_loop_table(path, doc)
    startup_files = sorted(results.glob("startup-*.json"))
    if startup_files:
        lines += ["## Time to first step, cold and warm compilation cache (`bench/startup.py`)", ""]
        for path in startup_files:
            lines += startup_table(path, doc)
    roofline_files = sorted(results.glob("roofline-*.json"))
    if roofline_files:
        lines += ["## Roofline of profiled train steps (`bench/roofline.py`)", ""]
        for path in roofline_files:
            lines += roofline_table(path, doc)
    if (results / "planner_draws_evaluation.json").exists():
        lines += ["## Planner accuracy on random draws (`bench/planner_accuracy.py --draw`)", ""]
        lines += planner_draw_tables(results / "planner_draws_evaluation.json", doc)
    if (results / "planner_microbatch.json").exists():
        lines += ["## Gradient accumulation's step time (`bench/planner_microbatch.py`)", ""]
        lines += planner_microbatch_table(results / "planner_microbatch.json", doc)
    if (results / "planner_unroll.json").exists():
        lines += ["## Remat, layer loop rolled and unrolled (`bench/planner_unroll.py`)", ""]
        lines += planner_unroll_table(results / "planner_unroll.json", doc)
    if (results / "planner_search.json").exists():
        lines += ["## The planner's search time (`bench/planner_search.py`)", ""]
        lines += planner_search_table(results / "planner_search.json", doc)
    if (results / "planner_accuracy.json").exists():
        lines += ["## Planner accuracy, fixed suites (`bench/planner_accuracy.py --suite`)", ""]
        lines += planner_tables(results / "planner_accuracy.json", doc)
    if (results / "console.json").exists():
        lines += ["## Console (`bench/console.py`)", ""]
        lines += console_table(results / "console.json", doc)
    for path in sorted(results.glob("console-scale-*.json"), key=lambda p: len(p.name)):
        runs = json.loads(path.read_text())["figures"]["runs"]
        lines += [f"## Console at {runs:,} runs (`bench/console.py --scale {runs}`)", ""]
        lines += console_table(path, doc)
    for path in sorted(results.glob("console-real-*.json")):
        runs = json.loads(path.read_text())["figures"]["runs"]
        lines += [f"## Console on {runs:,} copied sample runs (`bench/console.py --real {runs}`)"]
        lines += [""] + console_table(path, doc)
    for path in sorted(results.glob("console-follow*.json")):
        lines += [
            f"## Monitor following a run at 2 steps/s, {path.stem} (`bench/console.py --follow`)"
        ]
        lines += [""] + console_table(path, doc)
    for path in sorted(results.glob("console-forms*.json")):
        spinners = json.loads(path.read_text())["figures"].get("spinning_processes", 0)
        lines += [
            f"## Forms opening beside {spinners} busy processes, {path.stem} "
            "(`bench/console.py --forms`)"
        ]
        lines += [""] + console_table(path, doc)
    for path in sorted(results.glob("console-flood*.json")):
        lines += [f"## Monitor under a flood of events, {path.stem} (`bench/console.py --flood`)"]
        lines += [""] + console_table(path, doc)
    for path in sorted(results.glob("dit-*.json")):
        lines += ["## DiT train step against plain JAX (`bench/dit.py`, one GPU)", ""]
        lines += dit_table(path, doc)
    for path in sorted(results.glob("maxtext-*.json")):
        lines += ["## MaxText's llama against Titan's Llama (`bench/maxtext.py`, one GPU)", ""]
        lines += maxtext_table(path, doc)
    if (results / "data_loader.json").exists():
        lines += ["## Data loader (`bench/data_loader.py`)", ""]
        lines += data_loader_table(results / "data_loader.json", doc)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document is stale")
    args = parser.parse_args()
    expected = {DOC: render()}
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{_rel(path)} is stale: run python bench/report.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {_rel(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
