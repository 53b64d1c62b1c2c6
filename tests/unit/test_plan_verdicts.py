"""``titan plan``'s verdicts: only layouts ``titan train`` accepts are ranked, a layout that does
not fit exits 1 saying by how much and what would fit, a search with nothing fitting says how
many GPUs are needed, and ``--from`` / ``--calibration perfdb`` read measured runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jax
import pytest

from titan.analysis import perfdb
from titan.cli import main
from titan.commands.plan import train_options
from titan.config import TrainConfig, model_config
from titan.exit_codes import EXIT_FAILED, EXIT_OK
from titan.gpus import find_gpu
from titan.layouts.builders import build_adapter
from titan.ops import Ops
from titan.parallel.chunks import plan_chunks
from titan.parallel.sharding import mesh_spec
from titan.planning.budget import PlanRequest, search
from titan.planning.memory import FIT_MARGIN
from titan.planning.step import calibrate
from titan.shapes import resolve_model
from titan.telemetry.records import load_events

SAMPLE_H200_RUN = Path(__file__).resolve().parents[2] / "sample_runs" / "llama3-1b-h200"
SAMPLE_RUN_WITHOUT_PEAK = SAMPLE_H200_RUN.parent / "tiny-killed-resumed"  # 8 CPU devices


def _accepted_by_titan_train(model: str, options: dict) -> None:
    """What ``titan train`` checks before it needs devices: the config (``TrainConfig``), the
    split of the layers into pipeline chunks, every parameter's sharding over the stage mesh
    and the microbatch rows over dp x fsdp (``titan.layouts.spmd`` / ``titan.layouts.mpmd``)."""
    cfg = TrainConfig.of(**options)
    shape = model_config(cfg.model.shape, cfg.data.vocab_size)
    par = cfg.parallel
    pp = par.pp if par.layout == "mpmd" else 1
    chunks = plan_chunks(shape.n_layers, pp, par.virtual_stages, par.stage_layers, model)
    mesh_shape = {"data": par.dp, "fsdp": par.fsdp, "tensor": par.tp}
    adapter = build_adapter(shape, cfg.model, cfg.compute, cfg.data.seq_len, Ops("cpu"))
    shapes, logical = adapter.abstract_params(chunks[0])
    for (path, leaf), spec in zip(
        jax.tree_util.tree_flatten_with_path(shapes)[0], jax.tree.leaves(logical), strict=True
    ):
        mesh_spec(jax.tree_util.keystr(path), spec, leaf.shape, mesh_shape)
    rows = cfg.data.batch_size // par.microbatches
    assert rows % (par.dp * par.fsdp) == 0, options


@pytest.mark.parametrize(
    ("model", "gpus", "seq_len", "batch"),
    [
        ("llama3-8b", 8, 8192, 512),
        ("llama3-70b", 64, 8192, 512),
        ("llama3-1b", 2, 2048, 16),
        ("llama3-8b", 32, 131072, 1),  # one sequence: pipelines of fewer microbatches than stages
        (
            "d_model=1536,n_layers=7,n_heads=12,n_kv_heads=4,ffn_dim=4096,vocab_size=32000",
            6,
            2048,
            48,
        ),
    ],
)
def test_search_ranks_only_layouts_that_titan_train_accepts(model, gpus, seq_len, batch):
    shape = resolve_model(model)
    request = PlanRequest(shape, find_gpu("h200"), gpus, 8, seq_len, batch * seq_len, 1e11)
    plans = search(request)
    assert plans
    for p in plans[:5]:
        _accepted_by_titan_train(model, train_options(model, p))


def run_plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), err  # the words, however the terminal's width wraps them


def test_a_layout_that_does_not_fit_exits_1_with_the_shortfall_and_what_would_fit(capsys):
    argv = ("--model", "llama3-8b", "--gpu", "H100", "--gpus", "8", "--tokens", "1e11")
    argv += ("--fsdp", "8", "--microbatches", "32", "--remat", "dots")
    code, out, _ = run_plan(capsys, *argv)
    assert code == EXIT_FAILED
    assert "does not fit:" in out and "GB over the 60.00 GB usable" in out
    assert "--remat full:" in out and "--microbatches 64:" in out and "--gpus" not in out
    assert "titan train" not in out  # no command to run a layout that does not fit
    code, out, _ = run_plan(capsys, *argv, "--json")
    report = json.loads(out)
    verdict = report["verdict"]
    assert code == EXIT_FAILED and not verdict["fits"] and verdict["over_bytes"] > 0
    assert verdict["remedies"][0].startswith("--remat full: ")
    assert report["train_command"] is None
    code, out, _ = run_plan(capsys, *argv[:-1], "full")
    assert code == EXIT_OK and "fits:" in out
    assert "this layout, for titan train: titan train --model llama3-8b" in out


def test_a_misfit_advises_the_searchs_best_layout_of_the_same_gpus_not_more_gpus(capsys):
    argv = ("--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--tokens", "1e11")
    code, out, _ = run_plan(capsys, *argv)
    assert code == EXIT_FAILED and "does not fit:" in out and "--gpus 16" not in out
    code, found, _ = run_plan(capsys, *argv, "--search", "--json")
    best = json.loads(found)
    assert code == EXIT_OK and best["layouts_fit"] > 100
    fields = best["plans"][0]["layout_fields"]
    flags = [f"--{name}" for name in ("dp", "fsdp", "tp", "pp", "microbatches", "remat")]
    flags = [str(word) for flag in flags for word in (flag, fields[flag[2:]])]
    assert f"would fit with: {' '.join(flags)}: " in out
    assert f"(the fastest of the {best['layouts_fit']} layouts of 8 GPUs that fit;" in out
    code, out, _ = run_plan(capsys, *argv, *flags, "--json")  # the advice, taken, fits
    assert code == EXIT_OK and json.loads(out)["train_command"] == best["train_command"]


def test_more_gpus_are_advised_only_when_no_layout_of_the_gpus_fits(capsys):
    argv = ("--model", "llama3-70b", "--gpu", "h200", "--gpus", "2", "--tokens", "1e11")
    code, out, _ = run_plan(capsys, *argv, "--json")
    (remedy,) = [r for r in json.loads(out)["verdict"]["remedies"] if "--gpus" in r]
    code, found, _ = run_plan(capsys, *argv[:-3], "32", *argv[-2:], "--search", "--json")
    fields = json.loads(found)["plans"][0]["layout_fields"]
    assert code == EXIT_OK and remedy.startswith(f"--gpus 32 --dp {fields['dp']} ")
    assert "layouts of 2 GPUs" not in remedy


def test_search_with_nothing_fitting_says_how_many_gpus_are_needed(capsys):
    argv = ("--model", "llama3-70b", "--gpu", "h200", "--gpus", "2", "--tokens", "1e11")
    code, out, _ = run_plan(capsys, *argv, "--search")
    assert code == EXIT_FAILED
    assert "no layout of 2 GPUs fits in memory; 32 GPUs would be needed" in out
    code, out, err = run_plan(capsys, *argv, "--search", "--json")
    assert code == EXIT_FAILED and json.loads(out)["gpus_needed"] == 32
    assert (
        err == "titan plan: no layout of 2 GPUs fits in memory; 32 GPUs would be needed "
        "(titan plan --gpus 32 --search)\n"
    )
    code, out, err = run_plan(capsys, *argv, "--json")  # the layout given does not fit
    assert code == EXIT_FAILED and not json.loads(out)["verdict"]["fits"]
    assert err.startswith("titan plan: does not fit: ") and err.count("\n") == 1
    code, _, _ = run_plan(capsys, *argv[:-3], "32", *argv[-2:], "--search", "--json")
    assert code == EXIT_OK


def test_from_a_run_dir_prints_the_prediction_against_the_measurements(capsys):
    code, out, _ = run_plan(capsys, "--from", str(SAMPLE_H200_RUN))
    assert code == EXIT_OK
    run, _ = perfdb.run_measurement(SAMPLE_H200_RUN)
    assert (run.layout.remat, run.seq_len, run.batch_sequences) == ("dots", 2048, 8)
    measured = [line for line in out.splitlines() if "step time (s), measured" in line][0]
    assert f"{run.step_s:,.4g}" in measured and "%" in measured
    (peak,) = [line for line in out.splitlines() if "peak memory" in line]
    assert "peak memory (GB), as compiled" in peak  # XLA's plan of the programs: not measured
    assert "predicted against measured" not in out
    code, out, _ = run_plan(capsys, "--from", str(SAMPLE_H200_RUN), "--json")
    report = json.loads(out)
    assert code == EXIT_OK and report["measured"]["step_s"] == run.step_s
    assert report["plans"][0]["layout_fields"]["remat"] == "dots" and report["verdict"]["fits"]
    code, _, err = run_plan(capsys, "--from", "/nonexistent-run-dir")
    assert code == 2 and err.count("\n") == 1


def test_from_a_hostile_run_dir_shows_it_inert_and_its_unknown_peak_not_reported(capsys, tmp_path):
    hostile = tmp_path / "e\x1b[31mDIR[bold]x"
    shutil.copytree(SAMPLE_RUN_WITHOUT_PEAK, hostile)
    events = hostile / "events.jsonl"
    events.write_text(events.read_text().replace('"name": "tiny"', '"name": "ti\\u001b[2Jny"'))
    code, out, _ = run_plan(capsys, "--from", str(hostile))
    assert code == EXIT_OK and "\x1b" not in out
    header = f"{tmp_path}/e\\x1b[31mDIR[bold]x: ti\\x1b[2Jny: 5.0M params, 8 x "
    assert "".join(out.split()).startswith("".join(header.split()))  # wrapped at any width
    assert re.search(r"peak memory \(GB\), as compiled │ [\d.]+ │ not reported │ - │", out), out


def test_a_search_that_fits_nowhere_names_the_most_gpus_a_layout_spans(capsys):
    # One sequence a step: tp at most 8 (8 KV heads), pp at most the layers, one microbatch.
    argv = ("--model", "llama3-70b", "--gpu", "h200", "--gpus", "1", "--tokens", "1e9")
    code, out, _ = run_plan(capsys, *argv, "--batch-tokens", "8192", "--search")
    assert code == EXIT_FAILED and "32 GPUs would be needed" in out  # pp 4 x tp 8
    argv = ("--model", "llama3-8b", "--gpu", "h200", "--gpus", "1", "--tokens", "1e9")
    code, out, _ = run_plan(capsys, *argv, "--batch-size", "1", "--seq-len", "4194304", "--search")
    assert code == EXIT_FAILED  # 4M tokens of activations: 1 x 8 x 32 GPUs are not enough
    words = " ".join(out.split())
    assert (
        "no power-of-two multiple of 1 up to 256 GPUs (the most any layout of this model and "
        "batch spans) fits either"
    ) in words


def test_calibration_from_the_performance_database(capsys, tmp_path):
    shutil.copytree(SAMPLE_H200_RUN, tmp_path / SAMPLE_H200_RUN.name)
    run, _ = perfdb.run_measurement(tmp_path / SAMPLE_H200_RUN.name)
    argv = ("--model", "llama3-1b", "--gpu", "h200", "--gpus", "1", "--tokens", "1e9")
    argv += ("--seq-len", "2048", "--batch-size", "8", "--remat", "dots", "--json")
    code, out, _ = run_plan(capsys, *argv, "--calibration", "perfdb", "--runs-root", str(tmp_path))
    assert code == EXIT_OK
    fitted = json.loads(out)["plans"][0]["achievable_fraction"]
    assert fitted == pytest.approx(calibrate([run])["h200"])
    code, _, err = run_plan(capsys, *argv, "--calibration", "perfdb", "--runs-root", "/nonexistent")
    assert code == 2 and "does not exist" in err


def test_a_missing_perfdb_runs_root_names_the_runs_root_option(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./runs
    monkeypatch.delenv("TITAN_RUNS", raising=False)
    argv = ("--model", "llama3-1b", "--gpu", "h200", "--gpus", "1", "--tokens", "1e9")
    code, _, err = run_plan(capsys, *argv, "--calibration", "perfdb")
    assert code == 2 and err.count("\n") == 1 and "RUNS_ROOT" not in err
    assert err == (
        "titan plan: error: --calibration perfdb: runs root runs (the default) does not exist; "
        "give one with --runs-root\n"
    )
    monkeypatch.setenv("TITAN_RUNS", str(tmp_path / "gone"))
    code, _, err = run_plan(capsys, *argv, "--calibration", "perfdb")
    assert code == 2 and f"runs root {tmp_path}/gone ($TITAN_RUNS) does not exist" in err
    (tmp_path / "a-file").write_text("")
    code, _, err = run_plan(capsys, *argv, "--calibration", "perfdb", "--runs-root", "a-file")
    assert code == 2 and err.startswith("titan plan: error: --runs-root a-file is not a directory")
    code, _, err = run_plan(capsys, *argv, "--runs-root", str(tmp_path))
    assert code == 2 and "--runs-root needs --calibration perfdb" in err


def test_the_fit_margin_covers_the_fitting_half_of_the_suite():
    # FIT_MARGIN's source: the largest under-estimate on draw 1's fitting half, as
    # bench/planner_accuracy.py --evaluate recorded it; no configuration called a fit ran out
    # of memory.
    evaluation = Path(__file__).resolve().parents[2] / "bench" / "results"
    report = json.loads((evaluation / "planner_draws_evaluation.json").read_text())
    first = report["draws"][0]
    assert first["seed"] == 1 and first["configurations"] >= 30
    assert first["margin_needed"] <= FIT_MARGIN < first["margin_needed"] + 0.01
    assert all(not draw["false_fits"] for draw in report["draws"])


def test_remat_auto_plans_the_fastest_policy_that_fits_as_titan_train_resolves_it(capsys):
    base = ["plan", "--model", "llama3-8b", "--gpu", "h200", "--seq-len", "4096"]
    base += ["--batch-size", "2", "--tokens", "1e9", "--param-dtype", "bfloat16"]
    assert main([*base, "--gpus", "2", "--fsdp", "2"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "layout: dp1 fsdp2 tp1 remat=dots-attention" in out  # fits, and is the fastest
    assert "--remat dots-attention" in out  # the titan train command takes the same
    assert main([*base, "--gpus", "1"]) == EXIT_OK  # on one H200 with the margin: dots
    assert "layout: dp1 fsdp1 tp1 remat=dots" in capsys.readouterr().out
    assert main([*base, "--gpus", "1", "--param-dtype", "float32"]) == EXIT_FAILED
    assert "remat=full" in capsys.readouterr().out  # nothing fits: the last candidate


def test_from_a_run_resumed_with_another_layout_plans_its_last_layout_by_its_steps(tmp_path):
    run_dir = tmp_path / "relaid"
    shutil.copytree(SAMPLE_RUN_WITHOUT_PEAK, run_dir)
    events = run_dir / "events.jsonl"
    lines = events.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if '"type": "run_start"' in line]
    assert len(starts) == 2  # killed, then resumed
    lines[starts[1]] = lines[starts[1]].replace('"remat": "none"', '"remat": "full"')
    events.write_text("\n".join(lines) + "\n")
    run, _ = perfdb.run_measurement(run_dir)
    row = perfdb.measure("relaid", load_events(run_dir))
    assert row is not None and row.layout["remat"] == "full"
    assert run.layout.remat == "full" and run.step_s == row.median_step_s  # as perf check
    whole = perfdb.measure("whole", load_events(SAMPLE_RUN_WITHOUT_PEAK))
    assert whole is not None and whole.steps > row.steps  # the first attempt's steps left out
    assert run.model.name == "tiny"


def test_from_a_run_plans_a_given_budget_and_refuses_no_tokens(capsys):
    code, out, _ = run_plan(capsys, "--from", str(SAMPLE_H200_RUN), "--tokens", "1e12")
    words = " ".join(out.split())
    assert code == EXIT_OK and "GPU-hours" in words and "total time" in words
    code, out, _ = run_plan(capsys, "--from", str(SAMPLE_H200_RUN))
    assert code == EXIT_OK and "GPU-hours" not in out  # no budget given: none planned
    code, _, err = run_plan(capsys, "--from", str(SAMPLE_H200_RUN), "--tokens", "0")
    assert code == 2 and "--tokens must be a finite number > 0" in err


def test_a_batch_of_a_trillion_sequences_gets_its_verdict(capsys):
    argv = ("--model", "llama3-8b", "--gpu", "h100", "--gpus", "1", "--seq-len", "1")
    code, out, _ = run_plan(capsys, *argv, "--batch-size", str(2**40), "--tokens", "1e12")
    assert code in (EXIT_OK, EXIT_FAILED) and "tokens/s" in out


@pytest.mark.parametrize(
    ("gpu", "swiglu"),
    [("h200", "fused"), ("b200", "fused"), ("mi300x", "native"), ("cpu", "native")],
)
def test_the_swiglu_priced_is_the_one_the_registry_serves_on_that_gpu(capsys, gpu, swiglu):
    argv = ["--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--tokens", "1e11", "--json"]
    code, out, _ = run_plan(capsys, *argv)
    assert json.loads(out)["precision"]["swiglu"] == swiglu


def test_an_amd_layout_is_priced_with_the_native_swiglu_it_runs(capsys):
    # priced with the fused SwiGLU (opt-in on ROCm), 77 GB: a fit in 144 GB that would not run
    argv = ["--model", "llama3-8b", "--gpu", "mi300x", "--gpus", "8", "--tokens", "1e11"]
    code, out, _ = run_plan(capsys, *argv, "--fsdp", "8", "--microbatches", "64", "--remat", "none")
    assert code == EXIT_FAILED and "does not fit: 138.47 GB estimated" in out


def test_the_matmul_efficiency_says_whether_the_calibration_gave_it(capsys, tmp_path):
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"h100": 0.5}))
    argv = ["--model", "llama3-8b", "--gpus", "8", "--tokens", "1e11", "--fsdp", "4", "--tp", "2"]
    argv += ["--microbatches", "128", "--remat", "dots-attention"]
    shown = {}
    for gpu, given in (("h100", True), ("h200", True), ("h200", False)):
        extra = ["--calibration", str(calibration)] if given else []
        code, out, _ = run_plan(capsys, *argv, "--gpu", gpu, *extra)
        assert code == EXIT_OK
        shown[gpu, given] = re.search(r"eta = [\d.]+ of peak for matmuls \([^)]*\)", out)[0]
    assert shown == {
        ("h100", True): "eta = 0.50 of peak for matmuls (calibrated)",
        ("h200", True): "eta = 0.72 of peak for matmuls (default: the calibration has no h200)",
        ("h200", False): "eta = 0.72 of peak for matmuls (default)",
    }


def test_a_run_judged_by_a_calibration_fitted_on_it_is_said_so(capsys, tmp_path):
    for root in ("here", "elsewhere"):
        shutil.copytree(SAMPLE_H200_RUN, tmp_path / root / SAMPLE_H200_RUN.name)
    run_dir = tmp_path / "here" / SAMPLE_H200_RUN.name
    said = {}
    for root in ("here", "elsewhere"):
        argv = ["--from", str(run_dir), "--calibration", "perfdb", "--runs-root"]
        code, out, _ = run_plan(capsys, *argv, str(tmp_path / root), "--json")
        said[root, "json"] = json.loads(out)["calibrated_on_this_run"]
        code, out, _ = run_plan(capsys, *argv, str(tmp_path / root))
        said[root, "text"] = "this one among them" in out
    assert said == {
        ("here", "json"): True,
        ("here", "text"): True,
        ("elsewhere", "json"): False,
        ("elsewhere", "text"): False,
    }


def test_a_search_on_one_gpu_that_finds_nothing_says_gpu_once(capsys):
    argv = ["--model", "llama3-70b", "--gpu", "h200", "--gpus", "1", "--tokens", "1e9", "--search"]
    code, out, _ = run_plan(capsys, *argv)
    assert code == EXIT_FAILED and "no layout of 1 GPU fits in memory; " in out


def test_an_fp8_plan_says_so_and_its_train_command_trains_in_fp8(capsys):
    argv = ("--model", "llama3-8b", "--gpu", "h200", "--gpus", "8", "--fsdp", "8")
    argv += ("--microbatches", "8", "--matmul-dtype", "float8")
    code, out, _ = run_plan(capsys, *argv)
    assert code == 0 and "linear layers in float8 (priced at the FP8 peak)" in out
    assert "--matmul-dtype float8" in out.split("titan train", 1)[1]
    code, out, _ = run_plan(capsys, *argv, "--json")
    assert "--matmul-dtype float8" in json.loads(out)["train_command"]
    code, out, _ = run_plan(capsys, *argv[:-2])  # a bf16 plan names no matmul dtype
    assert "--matmul-dtype" not in out and "float8" not in out


def test_from_an_fp8_run_prices_its_fp8_layers_and_refuses_another_matmul_dtype(capsys, tmp_path):
    run = tmp_path / "fp8-run"
    shutil.copytree(SAMPLE_H200_RUN, run)
    events = run / "events.jsonl"
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    for line in lines:
        if line["type"] == "run_start":
            line["config"]["matmul_dtype"] = "float8"
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    measured, _ = perfdb.run_measurement(run)
    assert measured.precision.matmul == "float8"
    assert perfdb.run_measurement(SAMPLE_H200_RUN)[0].precision.matmul == "compute"
    code, out, _ = run_plan(capsys, "--from", str(run), "--json")
    assert code == EXIT_OK and json.loads(out)["precision"]["matmul"] == "float8"
    code, _, err = run_plan(capsys, "--from", str(run), "--matmul-dtype", "compute")
    assert code == 2 and "--matmul-dtype conflicts with --from" in err
