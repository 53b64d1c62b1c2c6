"""``titan train --task diffusion``: dit-tiny learns the digits; FSDP, TP and a 1F1B pipeline give
the one-device losses; a run killed with kill -9 resumes exactly; ``titan sample`` writes a grid;
the run's records read like any other's."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import events, run_in_process, start_subprocess, wait_for_event
from PIL import Image

from titan.analysis.report import summary_rows, write_report
from titan.analysis.summarize import summarize_run_dir
from titan.checkpoint.checkpointer import Checkpointer
from titan.cli import main
from titan.trainer import image_samples
from titan.trainer.image_samples import sample_grid, write_sample_grid

pytestmark = pytest.mark.slow

STEPS = 60
FALL = 1.6  # the mean loss of the last 5 steps is at least this many times below the first 5's


def _options(root, run_id, **extra):
    return {
        "task": "diffusion",
        "batch_size": 32,
        "steps": STEPS,
        "warmup_steps": 5,
        "checkpoint_every": 20,
        "runs_root": str(root),
        "run_id": run_id,
        "compute_dtype": "float32",
        "dp": 1,
        "layer_unroll": 1,  # a rolled layer loop compiles faster
        **extra,
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffusion")
    code, run_dir = run_in_process(_options(root, "one"))
    assert code == 0
    return run_dir


def _losses(run_dir):
    return [e["loss"] for e in events(run_dir, "step")]


def test_dit_tiny_loss_falls_on_digits(trained):
    losses = _losses(trained)
    assert len(losses) == STEPS
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert first / last > FALL, (first, last)
    start = events(trained, "run_start")[0]
    assert start["model"]["family"] == "dit" and start["model"]["vocab_size"] == 11
    assert start["data"]["source"] == "digits" and start["data"]["images"] == 1797
    assert start["tokenizer"] is None
    step = events(trained, "step")[-1]
    assert step["tokens"] == 32 * 16  # 16 patches of 2 x 2 per 8 x 8 image
    assert step["images_per_s"] == pytest.approx(step["tokens_per_s"] / 16)
    per_token = step["model_flops_per_token"]
    assert per_token["causal"] == per_token["full"] > 0  # no causal mask in a DiT


def test_a_1f1b_pipeline_with_fsdp_and_tp_gives_the_one_device_losses(trained, tmp_path):
    # One run for the three (each stage's mesh is fsdp 2 x tp 2): a test each would cost a
    # compile each. 5 steps of warmup (capped at --steps): the learning rates equal the longer
    # run's.
    layout = {"layout": "mpmd", "pp": 2, "microbatches": 2, "fsdp": 2, "tp": 2}
    code, run_dir = run_in_process(_options(tmp_path, "layout", steps=5, **layout))
    start = events(run_dir, "run_start")[0]
    assert start["layout"]["layout"] == "mpmd"
    assert code == 0
    assert _losses(run_dir) == pytest.approx(_losses(trained)[:5], rel=2e-5)


def test_sample_grid_is_deterministic_and_written(trained, tmp_path):
    image, step = sample_grid(trained, per_class=2, steps=4, seed=1)
    assert step == STEPS
    assert image.shape == (10 * 9 + 1, 2 * 9 + 1, 1)  # 10 classes of 8 x 8, 1-pixel padding
    assert image.max() > image[1:-1, 1:-1].min()  # not blank
    # a second sampling, with the same seed, writes the same pixels
    path, _ = write_sample_grid(trained, tmp_path / "grid.png", per_class=2, steps=4, seed=1)
    written = np.asarray(Image.open(io.BytesIO(path.read_bytes())))
    np.testing.assert_array_equal(written[..., None], image)
    # --scale 3: each pixel a 3 x 3 block of the same value
    path, _ = write_sample_grid(trained, tmp_path / "big.png", 3, per_class=2, steps=4, seed=1)
    big = np.asarray(Image.open(io.BytesIO(path.read_bytes())))
    assert big.shape == (3 * 91, 3 * 19)
    np.testing.assert_array_equal(big[::3, ::3][..., None], image)
    np.testing.assert_array_equal(big[2::3, 1::3][..., None], image)


def test_sample_reads_the_checkpoint_named_by_step_or_by_its_folder(trained, tmp_path, capsys):
    grids = {}
    for name, source in {
        "step": [str(trained), "--step", "20"],
        "folder": [str(trained / "checkpoints" / "20")],
        "newest": [str(trained)],
    }.items():
        out = tmp_path / f"{name}.png"
        assert main(["sample", *source, "--out", str(out), "--per-class", "1"]) == 0
        assert capsys.readouterr().out.startswith("titan sample: step ")
        grids[name] = np.asarray(Image.open(out))
    np.testing.assert_array_equal(grids["step"], grids["folder"])
    assert not np.array_equal(grids["step"], grids["newest"])  # step 20's weights, not 60's


def test_samples_that_are_not_finite_are_one_line_and_write_nothing(
    trained, tmp_path, capsys, monkeypatch
):
    # a diverged run's weights: every sample NaN, which a PNG would show as black pixels
    monkeypatch.setattr(image_samples, "sample", lambda *a, **k: np.full((10, 8, 8, 1), np.nan))
    assert main(["sample", str(trained), "--out", str(tmp_path / "g.png")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"titan sample: error: {trained}: the samples of checkpoint {STEPS} are not finite (its "
        "weights, or --guidance 1.0, overflow): nothing written\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sample", "--per-class", "100000000"], "--per-class must be in [1, 64], got 100000000"),
        (["sample", "--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
        (["sample", "--sample-steps", "1001"], "--sample-steps must be in [1, 1000]"),
        (["sample", "--scale", "0"], "--scale must be in [1, 16], got 0"),
        (["sample", "--out", "FILE/x.png"], "FILE is not a directory"),
        (["sample", "--step", "7"], "--step 7: RUN has no checkpoint of it (it has: 20, 40, 60)"),
        (["sample", "/checkpoints/020"], "neither a run dir (with config.json) nor a checkpoint"),
        (["generate", "--prompt", "x"], "a diffusion run (no text): use titan sample"),
    ],
)
def test_bad_sample_input_is_one_line_naming_the_option(trained, tmp_path, capsys, args, message):
    (tmp_path / "FILE").write_text("")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    before = sorted(trained.iterdir())
    if args[1].startswith("/checkpoints/"):  # a checkpoint folder of the run's that is not there
        args = [args[0], str(trained) + args[1], *args[2:]]
    else:
        args = [args[0], str(trained), *args[1:]]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message.replace("RUN", str(trained)) in err and len(err.splitlines()) == 1, err
    assert sorted(trained.iterdir()) == before


def test_report_shows_the_sample_grid_of_the_last_checkpoint(trained, tmp_path):
    report = write_report(trained, tmp_path / "report").read_text()
    assert "## Samples" in report and "![samples](samples.png)" in report
    assert f"step {STEPS}" in report
    grid = Image.open(tmp_path / "report" / "samples.png")
    assert grid.size == (8 * 9 + 1, 10 * 9 + 1)  # 8 per class (titan sample's default)


def test_summaries_read_a_diffusion_run(trained):
    summary = summarize_run_dir(trained)
    assert (summary.status, summary.steps) == ("completed", STEPS)
    assert summary.final_loss == pytest.approx(_losses(trained)[-1])
    rates = sorted(e["images_per_s"] for e in events(trained, "step"))
    assert summary.median_images_per_s == pytest.approx(float(np.median(rates)))
    rows = dict(summary_rows(summary, STEPS))
    assert rows["median images/s"] == f"{summary.median_images_per_s:,.1f}"


def test_killed_diffusion_run_resumes_exactly(tmp_path):
    options = _options(tmp_path, "killed", steps=100000, checkpoint_every=2, min_lr_ratio=1.0)
    proc = start_subprocess(options)
    run_dir = tmp_path / "killed"
    wait_for_event(run_dir, lambda e: e["type"] == "checkpoint" and e["step"] >= 2)
    proc.kill()
    proc.wait(timeout=60)
    before = {e["step"]: (e["batch_digest"], e["loss"]) for e in events(run_dir, "step")}
    checkpointer = Checkpointer(run_dir)
    last = checkpointer.latest_step()
    checkpointer.close()
    code, _ = run_in_process({**options, "steps": max(before) + 2}, resume=run_dir)
    assert code == 0
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == last
    redone = [e for e in events(run_dir, "step") if e["step"] > last]
    assert redone[0]["step"] == last + 1
    for event in redone:
        if event["step"] in before:
            assert event["batch_digest"] == before[event["step"]][0]
            assert event["loss"] == pytest.approx(before[event["step"]][1], rel=1e-5)
    assert events(run_dir)[-1]["status"] == "completed"


def test_a_poisoned_image_batch_is_skipped_and_the_run_completes(tmp_path):
    options = _options(tmp_path, "poisoned", steps=3, batch_size=8, debug_nonfinite_at_step=2)
    code, run_dir = run_in_process(options)
    steps = {e["step"]: e for e in events(run_dir, "step")}
    assert code == 0 and events(run_dir)[-1]["status"] == "completed"
    assert steps[2]["skipped"] is True and steps[2]["nonfinite"]["loss"] == "nan"
    assert np.isfinite(steps[3]["loss"]) and "skipped" not in steps[3]


def test_a_folder_of_one_image_fewer_than_a_batch_is_one_line(tmp_path, capsys):
    (tmp_path / "images" / "only").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "only" / "a.png")
    options = ["--task", "diffusion", "--images", str(tmp_path / "images"), "--batch-size", "2"]
    options += ["--dp", "1"]
    assert main(["train", *options, "--runs-root", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "titan train: error: --images has 1 image, fewer than --batch-size 2"
    ]
