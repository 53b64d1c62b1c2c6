"""docs/options.md is generated from the declarations of ``titan train``'s options and names every
flag that ``titan train --help`` lists."""

from __future__ import annotations

import runpy
from pathlib import Path

from titan.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "options.md"
COMMAND = ".venv/bin/python docs/options_reference.py"


def _render() -> str:
    return runpy.run_path(str(REPO / "docs" / "options_reference.py"))["render"]()


def test_options_page_is_generated_from_the_declarations():
    assert PAGE.read_text(encoding="utf-8") == _render(), f"docs/options.md is stale: run {COMMAND}"


def test_every_flag_of_titan_train_help_is_on_the_options_page():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = [flag for a in train._actions for flag in a.option_strings if a.dest != "help"]
    assert {"--preset", "--no-checkpoint-async", "--resume", "--process-id"} <= set(flags)
    page = PAGE.read_text(encoding="utf-8")
    missing = [flag for flag in flags if f"`{flag}`" not in page]
    assert not missing, f"docs/options.md lacks {', '.join(missing)}: run {COMMAND}"


def test_an_option_row_states_its_flags_key_type_default_bounds_and_marks():
    page = _render()
    assert "| `--data-workers` | R | `data.data_workers` | `int` | `0` | 0 to 256 | " in page
    assert "| `--batch-size` | P | `data.batch_size` | `int` | `16` | >= 1 | " in page
    assert "| `--model`, `--preset` |  | `model.model` | `shape` | `tiny` |  | " in page
    assert (
        "| `--checkpoint-async`, `--no-checkpoint-async` | R | `checkpoint.checkpoint_async` "
        "| `bool` | `true` |  | "
    ) in page
    assert "| `--remat` | R P planner | `compute.remat` | `str` | `auto` | `auto`, `none`, " in page
    assert "| `--lr` |  | `optimizer.lr` | `float` | `0.003` | > 0 | " in page
    assert "| `--resume` | `RUN_DIR` | continue the run in RUN_DIR" in page
