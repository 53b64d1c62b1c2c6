"""Diffusion objectives, image data and samplers: hand-computed targets and weights, the digits
read without scikit-learn, image folders, resumable batches, deterministic samples."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from titan.checkpoint.init_from import init_from_options
from titan.checkpoint.resume import check_resumed_images
from titan.cli import main
from titan.config import TrainConfig
from titan.config_files import config_to_data
from titan.data.images import ImageBatches, load_folder, open_images, read_digits
from titan.diffusion.objectives import (
    FLOW_SIGMA_MIN,
    Objective,
    alphas_cumprod,
    flow_sigmas,
    flow_weights,
)
from titan.diffusion.samplers import grid, sample
from titan.errors import TitanError
from titan.flops import model_flops_per_token
from titan.shapes import resolve_model
from titan.trainer.image_samples import trained_classes
from titan.trainer.image_task import image_batches, image_model_config
from titan.trainer.train import train

X0 = np.array([[0.5, -1.0]])
NOISE = np.array([[2.0, 1.0]])


def test_ddpm_epsilon_target_and_min_snr_weight_at_step_499():
    abar = alphas_cumprod("linear")[499]
    # the linear schedule's abar at t = 499: prod(1 - beta_s), beta from 1e-4 to 0.02
    assert abar == pytest.approx(np.prod(1 - np.linspace(1e-4, 0.02, 1000)[:500]))
    noisy, target, weight = Objective("epsilon", snr_gamma=5.0).example(X0, NOISE, np.array([499]))
    np.testing.assert_allclose(noisy, math.sqrt(abar) * X0 + math.sqrt(1 - abar) * NOISE, 1e-6)
    np.testing.assert_array_equal(target, NOISE.astype(np.float32))
    snr = abar / (1 - abar)  # about 0.086 < gamma: min(snr, 5) / snr = 1
    assert weight[0] == pytest.approx(min(snr, 5.0) / snr)
    _, _, early = Objective("epsilon", snr_gamma=5.0).example(X0, NOISE, np.array([10]))
    snr_10 = alphas_cumprod("linear")[10] / (1 - alphas_cumprod("linear")[10])
    assert snr_10 > 5 and early[0] == pytest.approx(5.0 / snr_10, rel=1e-6)


def test_ddpm_v_target_and_weight():
    abar = alphas_cumprod("cosine")[100]
    objective = Objective("v", beta_schedule="cosine", snr_gamma=5.0)
    _, target, weight = objective.example(X0, NOISE, np.array([100]))
    want = math.sqrt(abar) * NOISE - math.sqrt(1 - abar) * X0
    np.testing.assert_allclose(target, want, rtol=1e-6)
    snr = abar / (1 - abar)
    assert weight[0] == pytest.approx(min(snr, 5.0) / (snr + 1), rel=1e-6)
    _, _, unweighted = Objective("v").example(X0, NOISE, np.array([100]))
    assert unweighted[0] == 1.0


def test_flow_matching_input_target_shift_and_weight():
    sigmas = flow_sigmas(1.0)
    assert (sigmas[0], sigmas[-1]) == pytest.approx((1.0, FLOW_SIGMA_MIN))
    shifted = flow_sigmas(3.0)
    s = sigmas[400]
    assert shifted[400] == pytest.approx(3 * s / (1 + 2 * s))  # SD3's shift with shift 3
    noisy, target, weight = Objective("flow", flow_shift=3.0).example(X0, NOISE, np.array([400]))
    np.testing.assert_allclose(noisy, (1 - shifted[400]) * X0 + shifted[400] * NOISE, rtol=1e-6)
    np.testing.assert_array_equal(target, (NOISE - X0).astype(np.float32))
    weights = flow_weights(shifted, "gaussian")
    t = shifted * 1000
    y = np.exp(-2 * ((t - 500) / 1000) ** 2)
    assert weight[0] == pytest.approx((y[400] - y.min()) * 1000 / (y - y.min()).sum(), rel=1e-6)
    assert weights.mean() == pytest.approx(1.0)
    assert Objective("flow", flow_weighting="none").example(X0, NOISE, np.array([7]))[2][0] == 1
    assert Objective("flow").model_timesteps(np.array([0]))[0] == pytest.approx(1000.0)


def test_a_bad_objective_is_one_line():
    with pytest.raises(TitanError, match="--objective must be one of flow, epsilon, v"):
        Objective("x0")


def test_digits_are_read_from_the_wheel_without_importing_scikit_learn():
    pixels, labels = read_digits()
    assert pixels.shape == (1797, 8, 8) and pixels.max() == 255 and pixels.min() == 0
    assert sorted(set(labels.tolist())) == list(range(10))
    assert "sklearn" not in sys.modules
    data = open_images("digits", 16, 3)
    assert data.images.shape == (1797, 16, 16, 3) and data.classes == 10
    assert -1.0 <= data.images.min() < data.images.max() <= 1.0


def test_image_folder_class_subfolders_resize_and_centre_crop(tmp_path):
    for name, color in (("cat", 255), ("dog", 0)):
        (tmp_path / name).mkdir()
        image = np.full((20, 40, 3), color, np.uint8)
        image[:, :6] = 255 - color  # a stripe on the left, cut away by the centre crop
        Image.fromarray(image).save(tmp_path / name / "a.png")
        Image.fromarray(image).save(tmp_path / name / "b.jpg", quality=100)
    data = load_folder(str(tmp_path), 10, 1)
    assert data.images.shape == (4, 10, 10, 1) and data.labels.tolist() == [0, 0, 1, 1]
    np.testing.assert_allclose(data.images[:2], 1.0, atol=0.05)  # white cats
    np.testing.assert_allclose(data.images[2:], -1.0, atol=0.05)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TitanError, match="no .png, .jpg or .jpeg files"):
        load_folder(str(tmp_path / "empty"), 10, 1)


def test_batches_are_deterministic_and_resume_at_a_position():
    data = open_images("digits", 8, 1)
    first = ImageBatches(data, Objective(), 16, 3, 0.5)
    batches = [first.next_batch() for _ in range(3)]
    resumed = ImageBatches(data, Objective(), 16, 3, 0.5, position=first.position - 16)
    batch, ids = resumed.next_batch()
    np.testing.assert_array_equal(ids, batches[-1][1])
    for key, value in batch.items():
        np.testing.assert_array_equal(value, batches[-1][0][key])
    labels = np.concatenate([b["labels"] for b, _ in batches])
    assert 10 in labels and (labels < 10).any()  # about half dropped to the null label
    rows = ImageBatches(data, Objective(), 16, 3, 0.5, rows=np.array([1, 5]))
    part, _ = rows.next_batch()
    np.testing.assert_array_equal(part["noisy"], batches[0][0]["noisy"][[1, 5]])


def _predict(x, t, labels):
    """A fixed denoiser for the samplers: shrinks towards a label-dependent level."""
    return 0.5 * x + 0.01 * labels[:, None, None, None] - 0.0001 * t[:, None, None, None]


@pytest.mark.parametrize("kind", ["flow", "epsilon", "v"])
def test_samplers_are_deterministic_for_a_seed_with_shape_and_range(kind):
    labels = np.array([0, 1, 2])
    run = lambda seed: sample(_predict, Objective(kind), (4, 4, 1), labels, 3, seed=seed, steps=5)  # noqa: E731
    a, b, other = run(7), run(7), run(8)
    assert a.shape == (3, 4, 4, 1) and a.dtype == np.float32
    assert -1.0 <= a.min() and a.max() <= 1.0
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, other)
    guided = sample(_predict, Objective(kind), (4, 4, 1), labels, 3, seed=7, steps=5, guidance=3.0)
    assert not np.array_equal(guided, a)


def test_grid_lays_images_out_row_major_with_padding():
    images = np.stack([np.full((2, 2, 1), v) for v in (-1.0, 1.0, 1.0)])
    out = grid(images, columns=2)
    assert out.shape == (2 * 3 + 1, 2 * 3 + 1, 1)
    assert out[1, 1, 0] == 0 and out[1, 4, 0] == 255 and out[4, 1, 0] == 255 and out[4, 4, 0] == 0


def test_dit_presets_have_the_published_parameter_counts_and_the_planner_knows_them():
    # Peebles & Xie 2023, Table 1 (GFLOPs aside): 33 M, 130 M, 458 M, 675 M parameters
    for name, published in (("dit-s-2", 33e6), ("dit-b-2", 130e6), ("dit-l-2", 458e6)):
        assert resolve_model(name).param_count() == pytest.approx(published, rel=0.01)
    xl = resolve_model("dit-xl-2")
    assert xl.param_count() == pytest.approx(675e6, rel=0.01) and xl.patches == 256
    assert model_flops_per_token(xl, 256, "causal") == model_flops_per_token(xl, 256, "full")
    # forward FLOPs per image = 2 x the paper's Gflops (multiply-adds), Table 4: S/2 6.06,
    # B/2 23.01, L/2 80.71, XL/2 118.64
    for name, gflops in (
        ("dit-s-2", 6.06),
        ("dit-b-2", 23.01),
        ("dit-l-2", 80.71),
        ("dit-xl-2", 118.64),
    ):
        m = resolve_model(name)
        forward = model_flops_per_token(m, m.patches, "full") / 3 * m.patches
        assert forward == pytest.approx(2 * gflops * 1e9, rel=0.02), name
    assert resolve_model("dit-tiny").vocab_size == 11


def test_a_diffusion_run_with_a_missing_folder_is_one_line_and_leaves_nothing(tmp_path):
    cfg = TrainConfig.of(task="diffusion", images=str(tmp_path / "none"), runs_root=str(tmp_path))
    with pytest.raises(TitanError, match="--images .*none: not 'digits' nor a folder"):
        train(cfg)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TitanError, match="--task diffusion trains dit models"):
        TrainConfig.of(task="diffusion", preset="llama3-1b")


def test_image_folders_leave_hidden_entries_out_and_refuse_an_ambiguous_layout(tmp_path):
    pixel = np.zeros((8, 8), np.uint8)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        Image.fromarray(pixel).save(tmp_path / name / "0.png")
    (tmp_path / ".ipynb_checkpoints").mkdir()  # not a class
    (tmp_path / "a" / "._0.png").write_bytes(b"macOS resource fork")  # not an image
    data = load_folder(str(tmp_path), 8, 1)
    assert (data.classes, data.labels.tolist()) == (2, [0, 1])
    (tmp_path / "c").mkdir()
    with pytest.raises(TitanError, match="class subfolder c holds no .png"):
        load_folder(str(tmp_path), 8, 1)
    (tmp_path / "c").rmdir()
    Image.fromarray(pixel).save(tmp_path / "loose.png")
    with pytest.raises(TitanError, match="loose.png and others lie beside the class subfolders"):
        load_folder(str(tmp_path), 8, 1)


def test_sixteen_bit_images_are_scaled_to_eight_bits(tmp_path):
    values = np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000  # 0 to 63000 of 65535
    Image.fromarray(values).save(tmp_path / "a.png")  # a 16-bit grayscale PNG
    data = load_folder(str(tmp_path), 8, 1)
    expected = np.round(values / 65535 * 255) / 127.5 - 1
    np.testing.assert_allclose(data.images[0, ..., 0], expected, atol=1e-6)


def test_the_presets_shaped_for_latents_train_on_rgb_pixels():
    options = TrainConfig.of(task="diffusion", preset="dit-s-2", image_size=8).diffusion
    model, batches = image_batches(resolve_model("dit-s-2"), options, 2, 0)
    assert (model.channels, model.image_size, model.vocab_size) == (3, 8, 1001)
    assert batches.data.images.shape[1:] == (8, 8, 3)
    assert resolve_model("dit-tiny").channels == 1  # grayscale stays grayscale


def _diffusion_run_dir(path: Path, classes: int) -> Path:
    """A run dir holding only the ``config.json`` of a dit-tiny run on ``classes`` classes."""
    cfg = TrainConfig.of(task="diffusion", preset="dit-tiny")
    model = image_model_config(cfg.model.shape, 8, classes)
    saved = {"train": config_to_data(cfg), "model": dataclasses.asdict(model)}
    path.mkdir()
    (path / "config.json").write_text(json.dumps(saved))
    return path


def test_init_from_a_diffusion_run_takes_its_model_and_no_tokenizer(tmp_path):
    run_dir = _diffusion_run_dir(tmp_path / "a", classes=10)
    options = init_from_options({"task": "diffusion", "init_from": str(run_dir)})
    assert "tokenizer" not in options
    model = TrainConfig.of(**options).model.shape
    assert (model.family, model.vocab_size) == ("dit", 11)


def test_a_resume_whose_images_give_other_classes_is_refused_before_a_restore(tmp_path):
    run_dir = _diffusion_run_dir(tmp_path / "a", classes=3)
    preset = TrainConfig.of(task="diffusion").model.shape
    now = image_model_config(preset, 8, 2)  # a class folder fewer
    with pytest.raises(
        TitanError,
        match=r"images now give 3 labels \(classes and the null label\); the run trained 4 ",
    ):
        check_resumed_images(run_dir, now)
    check_resumed_images(run_dir, image_model_config(preset, 8, 3))


@pytest.mark.slow
def test_titan_train_refuses_a_resume_whose_image_folder_gained_a_class(tmp_path, capsys):
    images = tmp_path / "images"
    for name in ("a", "b"):
        (images / name).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.full((8, 8), 60 * i, np.uint8)).save(images / name / f"{i}.png")
    argv = ["train", "--task", "diffusion", "--images", str(images), "--image-size", "8"]
    runs = [
        "--runs-root",
        str(tmp_path / "runs"),
        "--run-id",
        "r",
        "--batch-size",
        "2",
        "--dp",
        "1",
    ]
    assert main([*argv, *runs, "--steps", "1", "--checkpoint-every", "1"]) == 0
    (images / "c").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(images / "c" / "0.png")
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "runs" / "r"), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "images now give 4 labels" in err and err.count("\n") == 1, err


def test_an_image_past_pils_bomb_limit_is_one_line_and_a_strip_is_never_enlarged(
    tmp_path, monkeypatch
):
    Image.fromarray(np.zeros((1, 20_000), np.uint8)).save(tmp_path / "strip.png")
    sizes = []
    resize = Image.Image.resize

    def recorded(self, size, *args, **kwargs):
        sizes.append(tuple(size))
        return resize(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", recorded)
    data = load_folder(str(tmp_path), 8, 1)
    assert data.images.shape == (1, 8, 8, 1) and sizes == [(8, 8)]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5_000)  # the strip is past twice that
    with pytest.raises(TitanError, match=r"--images: cannot read .*strip.png: Image size"):
        load_folder(str(tmp_path), 8, 1)


def test_sampling_draws_the_classes_the_run_trained_not_its_presets_label_table(tmp_path):
    model = dataclasses.replace(resolve_model("dit-s-2"), vocab_size=1001)
    assert trained_classes(tmp_path, model) == 1000  # no record: the table less the null label
    start = {"type": "run_start", "time": 1.0, "data": {"images": 40, "classes": 2}}
    (tmp_path / "events.jsonl").write_text(json.dumps(start) + "\n")
    assert trained_classes(tmp_path, model) == 2
    start["data"]["classes"] = 5000  # more than the table holds: not this model's record
    (tmp_path / "events.jsonl").write_text(json.dumps(start) + "\n")
    assert trained_classes(tmp_path, model) == 1000
