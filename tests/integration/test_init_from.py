"""``titan train --init-from``: the options a run takes from the checkpoint it starts from."""

from __future__ import annotations

import dataclasses
import json

import pytest

from titan.checkpoint.init_from import init_from_options, saved_model
from titan.cli import main
from titan.config import TrainConfig
from titan.config_files import config_to_data
from titan.errors import TitanError
from titan.shapes import DEFAULT_VOCAB_SIZE


def test_a_vocab_size_other_than_the_checkpoints_is_refused_naming_both(
    finished_run, tmp_path, capsys
):
    _, model = saved_model(finished_run, "--init-from")
    assert model.vocab_size not in (1000, DEFAULT_VOCAB_SIZE)
    start = ["train", "--init-from", str(finished_run)]
    assert main([*start, "--vocab-size", "1000", "--print-config"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"titan train: error: --vocab-size 1000 conflicts with --init-from {finished_run}, whose "
        f"model has a vocabulary of {model.vocab_size} (the run keeps it); leave --vocab-size out"
    )
    assert main([*start, "--vocab-size", str(model.vocab_size), "--print-config"]) == 0
    capsys.readouterr()
    # the config --print-config writes holds the default --vocab-size: it reads back
    assert main([*start, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f"vocab_size = {DEFAULT_VOCAB_SIZE}\n" in printed
    (tmp_path / "printed.toml").write_text(printed)
    assert main(["train", "--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_the_checkpoints_own_preset_typed_with_init_from_is_taken_and_another_refused(
    finished_run, capsys
):
    start = ["train", "--init-from", str(finished_run), "--print-config"]
    assert main([*start, "--preset", "tiny"]) == 0  # the checkpoint's shape, its vocabulary aside
    capsys.readouterr()
    assert main([*start, "--preset", "llama3-1b"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("titan train: error: --model llama3-1b conflicts with the model of ")


@pytest.mark.slow
def test_a_checkpoint_in_another_dtype_than_param_dtype_is_refused_naming_both(
    finished_run, tmp_path, capsys
):
    runs = tmp_path / "runs"
    argv = ["train", "--init-from", str(finished_run), "--param-dtype", "bfloat16"]
    assert main([*argv, "--steps", "1", "--runs-root", str(runs)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "was saved as float32, the model asks for bfloat16" in line
    assert "--param-dtype float32 reads it" in line
    assert not runs.exists() or not any(runs.iterdir())


def test_a_preset_whose_labels_come_from_the_data_matches_the_diffusion_run_it_starts_from(
    tmp_path,
):
    saved = tmp_path / "d1"
    saved.mkdir()
    model = TrainConfig.of(preset="dit-tiny", task="diffusion").model.shape
    model = dataclasses.replace(model, vocab_size=11)  # the digits' 10 classes and the null label
    config = {"train": config_to_data(TrainConfig.of(task="diffusion")), "model": model}
    (saved / "config.json").write_text(json.dumps(config, default=dataclasses.asdict))
    (saved / "checkpoints").mkdir()
    options = {"task": "diffusion", "init_from": str(saved)}
    assert init_from_options({**options, "preset": "dit-tiny"})["preset"] == model
    with pytest.raises(TitanError, match="--model dit-s-2 conflicts with the model of"):
        init_from_options({**options, "preset": "dit-s-2"})


@pytest.mark.parametrize("flag", ["--init-from", "--resume"])
def test_a_hugging_face_directory_is_told_to_be_imported_first(tmp_path, capsys, flag):
    hf = tmp_path / "llama-hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    assert main(["train", flag, str(hf), "--print-config"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"titan train: error: {flag} {hf}: a Hugging Face model's directory, not a Titan run: "
        f"make it one with titan import hf {hf} --out RUN_DIR"
    )
