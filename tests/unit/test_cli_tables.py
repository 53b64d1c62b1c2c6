"""The CLI's tables at 80 columns: columns by priority, the run id and the layout never wrapped
(cut with an ellipsis only beyond 40% of the width);
``--wide`` for all; ``titan plan`` ends with a ``titan train`` command that ``titan train``
takes; ``--search`` answers at any ``--gpus``."""

from __future__ import annotations

import json
import subprocess
import sys

from samples import copy_sample_runs, sample_run_dirs

from titan.cli import build_parser, main
from titan.commands.train import explicit_options
from titan.config import TrainConfig

PLAN = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "--tokens", "1e12"]


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_summarize_at_80_columns_keeps_run_ids_whole_and_wide_shows_every_column(
    tmp_path, capsys, monkeypatch
):
    root = copy_sample_runs(tmp_path / "runs")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["summarize", str(root)]) == 0
    narrow = _lines(capsys)
    assert main(["summarize", str(root), "--wide"]) == 0
    wide = _lines(capsys)
    names = [d.name for d in sample_run_dirs()]
    assert max(map(len, narrow)) <= 80 and "…" not in "".join(narrow)
    assert all(any(f"│ {name} " in line for line in narrow) for name in names)
    header = next(line for line in narrow if "run" in line and "status" in line)
    assert "steps" in header and "final loss" in header and "restarts" not in header
    assert any("left out at 80 columns:" in line for line in narrow)
    wide_header = next(line for line in wide if "run" in line and "status" in line)
    assert "restarts" in wide_header and "best loss" in wide_header and len(wide_header) > 80
    assert not any("left out" in line for line in wide)


def test_a_run_id_of_200_characters_under_a_long_folder_is_cut_and_the_figures_stay(
    tmp_path, capsys, monkeypatch
):
    root = copy_sample_runs(tmp_path / ("f" * 230))
    (root / "tiny-killed-resumed").rename(root / ("r" * 200))
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["summarize", str(root)]) == 0
    lines = _lines(capsys)
    assert max(map(len, lines)) <= 100
    header = next(line for line in lines if "run" in line and "status" in line)
    assert "steps" in header and "final loss" in header and "MFU" in header
    assert any(f"│ {'r' * 30}" in line and "…" in line for line in lines)
    assert main(["summarize", str(root), "--wide"]) == 0
    assert any("r" * 200 in line for line in _lines(capsys))


def test_plan_search_at_80_columns_shows_the_layout_and_a_train_command(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*PLAN, "--search", "--top", "3"]) == 0
    lines = _lines(capsys)
    assert main([*PLAN, "--search", "--top", "3", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    layout = best["plans"][0]["layout_fields"]
    header = next(line for line in lines if line.split()[:5] == ["#", "dp", "fsdp", "tp", "pp"])
    first = lines[lines.index(header) + 2].split()
    assert max(map(len, lines[:-1])) <= 80 and "…" not in "".join(lines)
    assert first[:5] == ["1", str(layout["dp"]), str(layout["fsdp"]), str(layout["tp"])] + [
        str(layout["pp"])
    ]
    command = lines[-1]
    assert lines[-2] == "best layout, for titan train:" and command == best["train_command"]
    words = command.split()
    assert words[:2] == ["titan", "train"]
    # titan train's own parser and config take the command as it is printed.
    cfg = TrainConfig.of(**explicit_options(build_parser().parse_args(words[1:])))
    parallel = cfg.parallel
    assert (parallel.dp, parallel.fsdp, parallel.tp, parallel.pp) == tuple(
        layout[k] for k in ("dp", "fsdp", "tp", "pp")
    )
    assert (parallel.microbatches, cfg.compute.remat) == (layout["microbatches"], layout["remat"])
    assert cfg.data.batch_size * cfg.data.seq_len == best["batch_tokens"]
    assert cfg.optimizer.steps * best["batch_tokens"] >= 1e12


def test_plan_search_at_a_million_gpus_answers():
    argv = [sys.executable, "-m", "titan.cli", *PLAN[:5], "--gpus", "1048576", "--tokens", "1e15"]
    argv += ["--batch-size", "4194304", "--search", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["layouts_fit"] > 0
    best = report["plans"][0]["layout_fields"]
    assert best["dp"] * best["fsdp"] * best["tp"] * best["pp"] == 1048576
