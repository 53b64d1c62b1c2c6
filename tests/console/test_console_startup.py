"""A launch that fails at start-up leaves nothing in the runs root, and its error stays in the
console (tui/launcher.py, tui/run_watch.py); a resume never rewrites the run's launch.json."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import small_run
from samples import copy_sample_runs

from titan.analysis.liveness import LAUNCH_FILE
from titan.checkpoint.resume import TOKENIZER_FILE, resume_options
from titan.config import TrainConfig
from titan.errors import TitanError
from tui.app import utf8_locale
from tui.launcher import start_run
from tui.run_list import list_runs
from tui.run_watch import RunWatcher


def _wait_for_exit(run, timeout_s: float = 300.0) -> int:
    deadline = time.monotonic() + timeout_s
    while run.process.poll() is None:
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.2)
    return run.process.returncode


@pytest.mark.slow
def test_a_launch_that_fails_before_run_start_leaves_no_run_dir(corpus_dir: Path, tmp_path):
    # 16 data-parallel replicas on the 8 test devices: titan train refuses it at start-up.
    config = TrainConfig.of(**small_run(corpus_dir, tmp_path, steps=2, run_id="too-wide", dp=16))
    run = start_run(config)
    listed_while_starting = [s.run_dir.name for s in list_runs(tmp_path).summaries]
    code = _wait_for_exit(run)
    watcher = RunWatcher(run.run_dir, run)
    update = watcher.poll()
    assert listed_while_starting == ["too-wide"]
    assert code == 2
    assert not run.run_dir.exists() and list(tmp_path.iterdir()) == []
    assert list_runs(tmp_path).summaries == []
    assert update.liveness.state == "failed"
    assert update.liveness.reason.startswith("exited before run_start: ")
    assert "16" in update.liveness.reason and "asked" in update.liveness.reason
    assert update.stderr_tail and update.stderr_tail[-1] in update.liveness.reason


@pytest.mark.slow
def test_a_refused_resume_leaves_its_run_dir_and_launch_json_as_they_were(tmp_path):
    # A copied record with its options but no checkpoint: the launcher starts the resume, and
    # titan train refuses it.
    run_dir = copy_sample_runs(tmp_path) / "tiny-killed-resumed"
    (run_dir / TOKENIZER_FILE).write_text("")
    (run_dir / LAUNCH_FILE).write_text('{"pid": 1}')
    run = start_run(TrainConfig.of(), resume=run_dir)
    code = _wait_for_exit(run)
    run.returncode()
    assert code != 0
    assert (run_dir / LAUNCH_FILE).read_text() == '{"pid": 1}'
    assert (run_dir / "events.jsonl").is_file() and run.startup_error is None


def test_a_resume_that_changes_an_option_that_cannot_change_is_refused_before_a_child(tmp_path):
    run_dir = copy_sample_runs(tmp_path) / "tiny-killed-resumed"
    (run_dir / TOKENIZER_FILE).write_text("")
    before = sorted(p.name for p in run_dir.iterdir())
    saved = resume_options(run_dir, {})
    with pytest.raises(TitanError, match=r"^--lr cannot change on --resume"):
        start_run(saved.replace(lr=saved.optimizer.lr * 2), resume=run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == before  # no log opened, no child


@pytest.mark.parametrize("from_env", [False, True])
def test_a_runs_root_that_cannot_be_made_is_a_one_line_error_naming_its_source(
    tmp_path, monkeypatch, from_env: bool
):
    (tmp_path / "a-file").write_text("")
    root = tmp_path / "a-file" / "runs"  # under a file: no user, root neither, can make it
    if from_env:
        monkeypatch.setenv("TITAN_RUNS", str(root))
    else:
        monkeypatch.delenv("TITAN_RUNS", raising=False)
    config = TrainConfig.of(runs_root="" if from_env else str(root))
    source = "$TITAN_RUNS" if from_env else "--runs-root"
    with pytest.raises(TitanError, match=rf"^\{source}: cannot create .*: Not a directory$"):
        start_run(config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize(
    ("env", "utf8"),
    [
        ({}, False),
        ({"LANG": "C"}, False),
        ({"LANG": "en_US.UTF-8"}, True),
        ({"LANG": "C.utf8"}, True),
        ({"LC_ALL": "C", "LANG": "en_US.UTF-8"}, False),
        ({"LC_CTYPE": "de_DE.UTF-8@euro"}, True),
    ],
)
def test_a_locale_that_is_not_utf8_draws_in_ascii(env: dict[str, str], utf8: bool):
    assert utf8_locale(env) is utf8
