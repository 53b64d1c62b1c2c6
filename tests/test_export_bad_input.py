"""Bad input to ``titan import|export hf|maxtext``: one line naming the bad run or flag, exit 2,
nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan.cli import main
from titan.config import TrainConfig
from titan.config_files import config_to_data


@pytest.fixture(scope="module")
def diffusion_run(tmp_path_factory) -> Path:
    """A diffusion run dir's config.json as the trainer writes it (train.py's payload)."""
    run_dir = tmp_path_factory.mktemp("runs") / "d1"
    run_dir.mkdir()
    cfg = TrainConfig.of(task="diffusion")
    payload = {"train": config_to_data(cfg), "model": cfg.model.shape.record()}
    (run_dir / "config.json").write_text(json.dumps(payload))
    return run_dir


@pytest.mark.parametrize("fmt", ["hf", "maxtext"])
def test_export_refuses_a_diffusion_run_in_one_line(diffusion_run, tmp_path, capsys, fmt):
    out = tmp_path / "out"
    assert main(["export", fmt, str(diffusion_run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "diffusion (DiT) run" in err and str(diffusion_run) in err
    assert not out.exists()


def test_import_hf_names_out_under_a_regular_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub"
    assert main(["import", "hf", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}" in err and "not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_export_hf_of_a_run_without_its_tokenizer_names_the_missing_file(tmp_path, capsys):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    cfg = TrainConfig.of(preset="tiny", vocab_size=512)
    payload = {"train": config_to_data(cfg), "model": cfg.model.shape.record()}
    (run_dir / "config.json").write_text(json.dumps(payload))
    assert main(["export", "hf", str(run_dir), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer.model there" in err and "--tokenizer" not in err
    assert not (tmp_path / "out").exists()


def test_export_csv_names_out_under_a_regular_file(tmp_path, capsys):
    run_dir = tmp_path / "r2"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("")
    (tmp_path / "t.sh").write_text("x")
    out = tmp_path / "t.sh" / "x.csv"
    assert main(["export", "csv", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}: {tmp_path / 't.sh'} is not a directory" in err
