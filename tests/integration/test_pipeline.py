"""MPMD pipeline on 8 CPU devices: every schedule equals the SPMD baseline; checkpoints move
between layouts; pipeline events are recorded."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import events, run_in_process, small_run

from titan.cli import main
from titan.trainer.train import resume_options, train

STEPS = 3


def _options(corpus_dir, root, run_id, **layout):
    return small_run(
        corpus_dir, root, **{"steps": STEPS, "run_id": run_id, "dp": 1, "timing_every": 2, **layout}
    )


def final_params(run_dir):
    """The run's last checkpoint as one SPMD-shaped parameter dict (numpy)."""
    step = max(e["step"] for e in events(run_dir, "checkpoint"))
    meta = events(run_dir, "checkpoint")
    chunks = len(events(run_dir, "run_start")[-1]["layout"]["chunks"])
    assert meta
    params = {"layers": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in range(chunks):
            item = ocp.PyTreeCheckpointer().restore(run_dir / f"checkpoints/{step}/chunk_{c}")
            for name, value in item["params"].items():
                if name != "layers":
                    params[name] = np.asarray(value)
            for name, value in item["params"]["layers"].items():
                params["layers"].setdefault(name, []).append(np.asarray(value))
    params["layers"] = {k: np.concatenate(v) for k, v in params["layers"].items()}
    return params


@pytest.fixture(scope="module")
def spmd(corpus_dir, tmp_path_factory):
    _, run_dir = run_in_process(_options(corpus_dir, tmp_path_factory.mktemp("r"), "spmd"))
    return [e["loss"] for e in events(run_dir, "step")], final_params(run_dir)


CASES = [
    ("gpipe", 2, 1, {}),
    ("1f1b", 2, 1, {}),
    ("zero-bubble", 2, 1, {}),
    ("interleaved-1f1b", 2, 2, {}),
    ("gpipe", 4, 1, {"fsdp": 2}),
    ("1f1b", 4, 1, {"tp": 2}),
    ("zero-bubble", 4, 1, {"fsdp": 2}),
    # interleaving at pp=4 needs 8 chunks; the tiny preset has 4 layers, so v=2 is shown at pp=2
    ("interleaved-1f1b", 2, 2, {"tp": 2, "fsdp": 2}),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schedule", "pp", "v", "inner"), CASES, ids=[f"{c[0]}-pp{c[1]}-{c[3]}" for c in CASES]
)
def test_pipeline_matches_spmd_loss_and_parameters(
    spmd, corpus_dir, tmp_path, schedule, pp, v, inner
):
    options = _options(
        corpus_dir,
        tmp_path,
        "mpmd",
        layout="mpmd",
        pp=pp,
        microbatches=4,
        schedule=schedule,
        virtual_stages=v,
        **inner,
    )
    code, run_dir = run_in_process(options)
    assert code == 0
    losses = [e["loss"] for e in events(run_dir, "step")]
    assert losses == pytest.approx(spmd[0], rel=1e-5)
    got = final_params(run_dir)
    # Float32 sums in another order (microbatches, sharded reductions) change gradients by
    # rounding; AdamW moves a parameter by lr * g / (|g| + 1e-8), which magnifies that where g is
    # near 1e-8 (rare tokens' embedding rows): up to 2.7e-5 of the about 3e-4 that the warmup
    # steps move.
    for name in ("embed", "head", "final_norm"):
        np.testing.assert_allclose(got[name], spmd[1][name], atol=5e-5)
    for name, value in spmd[1]["layers"].items():
        np.testing.assert_allclose(got["layers"][name], value, atol=5e-5, err_msg=name)


@pytest.mark.slow
def test_pipeline_records_its_shape_timing_and_dispatch(corpus_dir, tmp_path):
    options = _options(
        corpus_dir, tmp_path, "timing", layout="mpmd", pp=2, microbatches=4, schedule="1f1b"
    )
    _, run_dir = run_in_process(options)
    (pipeline,) = events(run_dir, "pipeline")
    assert pipeline["stages"] == 2 and pipeline["layers_per_chunk"] == [2, 2]
    assert pipeline["theoretical_bubble"] == pytest.approx(1 / 5)
    compiles = events(run_dir, "compile")
    assert [e.get("stage") for e in compiles] == [0, 1, None], compiles  # finite check last
    (timing,) = events(run_dir, "pipeline_timing")
    assert timing["step"] == 2 and len(timing["actions"]) == 2 * 2 * 4
    assert all(end >= start for *_, start, end in timing["actions"])
    assert all(e["dispatch_s"] > 0 for e in events(run_dir, "step"))


@pytest.mark.slow
def test_checkpoint_moves_from_pp4_to_pp2_and_spmd(corpus_dir, tmp_path):
    # warmup of one step: the learning rates of steps 1-2 do not depend on the run's length
    whole = _options(corpus_dir, tmp_path, "whole", steps=4, warmup_steps=1)
    _, whole_dir = run_in_process(whole)
    expected = [e["loss"] for e in events(whole_dir, "step")][2:]
    first = _options(
        corpus_dir,
        tmp_path,
        "pp4",
        steps=2,
        decay_steps=4,  # the whole run's schedule: a resume keeps it
        warmup_steps=1,
        layout="mpmd",
        pp=4,
        microbatches=4,
        fsdp=2,
    )
    _, pp4_dir = run_in_process(first)
    # as `titan train --resume` takes them: onto SPMD the saved pipeline options fall back to
    # their defaults; --fsdp 2 and --microbatches 4 (gradient accumulation) stay
    targets = {
        "pp2": {"layout": "mpmd", "pp": 2, "microbatches": 2, "fsdp": 1},
        "spmd": {"layout": "spmd"},
    }
    for name, layout in targets.items():
        run_dir = tmp_path / name
        shutil.copytree(pp4_dir, run_dir)
        assert train(resume_options(run_dir, {**layout, "steps": 4}), run_dir) == 0
        assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 2
        resumed = [e["loss"] for e in events(run_dir, "step")][2:]
        assert resumed == pytest.approx(expected, rel=1e-5), name


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pp", "3"], "4 layers of --preset tiny do not split evenly into --pp 3"),
        (
            ["--pp", "8"],
            "4 layers of --preset tiny cannot fill --pp 8 x --virtual-stages 1 = 8 chunks",
        ),
        (
            [
                "--pp",
                "3",
                "--model",
                "d_model=64,n_layers=4,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512",
            ],
            "4 layers of --model do not split evenly into --pp 3",
        ),
        (["--pp", "16"], "--pp 16 = 16 devices asked, 8 present"),
        (
            ["--pp", "2", "--microbatches", "3"],
            "--batch-size 8 is not a multiple of --microbatches 3",
        ),
        (["--pp", "2", "--stage-layers", "1,2"], "--stage-layers 1,2 must give 2 positive counts"),
        (
            [
                "--pp",
                "4",
                "--microbatches",
                "2",
                "--schedule",
                "interleaved-1f1b",
                "--virtual-stages",
                "2",
            ],
            "--microbatches 2 must be a multiple of --pp 4",
        ),
    ],
)
def test_invalid_pipeline_layouts_fail_before_compiling(
    corpus_dir, tmp_path, capsys, extra, message
):
    argv = [
        "train",
        "--layout",
        "mpmd",
        "--data",
        str(corpus_dir),
        "--vocab-size",
        "512",
        "--batch-size",
        "8",
        "--dp",
        "1",
        "--runs-root",
        str(tmp_path / "runs"),
        *extra,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_stage_layers_give_first_and_last_stages_fewer_layers(corpus_dir, tmp_path):
    options = _options(
        corpus_dir,
        tmp_path,
        "uneven",
        steps=1,
        layout="mpmd",
        pp=3,
        microbatches=2,
        stage_layers="1,2,1",
    )
    _, run_dir = run_in_process(options)
    assert events(run_dir, "pipeline")[0]["layers_per_chunk"] == [1, 2, 1]


@pytest.mark.slow
def test_bfloat16_master_weights_train_on_pipeline_stages_and_resume_onto_them(
    corpus_dir, tmp_path
):
    bf16 = {"param_dtype": "bfloat16", "decay_steps": 4, "warmup_steps": 1}
    first = _options(corpus_dir, tmp_path, "bf16", steps=2, checkpoint_every=2, **bf16)
    code, run_dir = run_in_process(first)
    assert code == 0
    pipeline = {"layout": "mpmd", "pp": 2, "microbatches": 2}
    assert main(["train", "--resume", str(run_dir), "--steps", "4", *_flags(pipeline)]) == 0
    steps = events(run_dir, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    assert all(np.isfinite(e["loss"]) and np.isfinite(e["grad_norm"]) for e in steps)
    fresh = _options(corpus_dir, tmp_path, "bf16-mpmd", steps=2, **bf16, **pipeline)
    code, fresh_dir = run_in_process(fresh)
    assert code == 0 and len(events(fresh_dir, "step")) == 2


def _flags(options: dict) -> list[str]:
    return [f for name, value in options.items() for f in (f"--{name}", str(value))]
