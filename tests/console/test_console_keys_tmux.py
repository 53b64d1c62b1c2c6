"""Keys through a real terminal act only where the operator can see, in the order typed: tmux
runs ``titan-console`` (one test through real SSH), ``send-keys`` sends keys with no pause
between them, ``capture-pane`` reads what they did."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from console_helpers import LAUNCH_TIMEOUT_S, tiny_form_texts
from samples import copy_sample_runs
from test_console_ssh import ConsoleServer, _kill_runs, _open_pane, _ssh_command, needs_ssh
from test_console_tmux import (
    FIRST_FLAG,
    SESSION,
    _screen,
    _send,
    _tmux,
    _wait_for,
    type_launch_form,
)

from titan.analysis.summarize import database_path
from titan.config import option_fields

pytestmark = pytest.mark.slow
RUN_LIST = "⏎ Open"  # the run list's footer
FLAGS = [option.flag for option in option_fields()]


def _console(*args: str, columns: int = 80, lines: int = 24, env: str = "") -> None:
    """``titan-console ARGS`` in tmux session :data:`SESSION`."""
    command = f"{env}{shlex.quote(sys.executable)} -m tui.app {shlex.join(args)}"
    _tmux(
        *("new-session", "-d", "-s", SESSION, "-x", str(columns), "-y", str(lines)),
        *("-c", os.getcwd(), command),
    )


def _burst(*keys: str) -> None:
    """Send ``keys`` in one write, as a fast typist or one SSH packet does."""
    _tmux("send-keys", "-t", SESSION, *keys)


def _field(screen: str, flag: str) -> str:
    """The value the launch form shows for ``flag`` (the text after it on its line, up to the
    next column's flag)."""
    line = next(line for line in screen.splitlines() if f" {flag} " in f"{line} ")
    after = line.split(f" {flag} ", 1)[1] if f" {flag} " in line else ""
    return after.split(" --", 1)[0].strip()


def _kill_session() -> None:
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


def test_keys_under_the_size_notice_reach_no_screen(tmp_path: Path):
    _console("--runs-root", str(copy_sample_runs(tmp_path / "runs")))
    try:
        _wait_for(RUN_LIST, 60)
        _tmux("resize-window", "-t", SESSION, "-x", "60", "-y", "20")
        _wait_for("Terminal too small", 10)
        _send("h", "n", "Enter")
        time.sleep(2)  # what the keys would have done, done by now
        _tmux("resize-window", "-t", SESSION, "-x", "80", "-y", "24")
        back = _wait_for(RUN_LIST, 10)
    finally:
        _kill_session()
    assert "history of" not in back and "launch a training run" not in back, back


def test_tab_tab_9_typed_with_no_pause_goes_to_the_third_field(tmp_path: Path):
    _console("--runs-root", str(tmp_path / "runs"))
    try:
        _wait_for("press n to launch one", 60)
        _burst("n", "Tab", "Tab", "9")  # the form opens as the keys arrive
        typed = _wait_for(f"{FLAGS[2]}: ", 30)
        time.sleep(1)
        typed = _screen()
    finally:
        _kill_session()
    assert _field(typed, FLAGS[0]) == "tiny", typed
    assert _field(typed, FLAGS[2]) == "9", typed


# Tab stops and texts of the burst: --steps (5), --lr (6), --warmup-steps (8), --decay-steps (9),
# where shift+tab comes back and 8 replaces the 33 selected.
BURST = ["Tab"] * 5 + ["1", "2", "Tab", "0", ".", "5", "Tab", "Tab", "7", "Tab"]
BURST += ["3", "3", "Tab", "BTab", "8"]


def _typed_form(keys: list[str], burst: bool, columns: int = 100) -> str:
    """The launch form after ``keys``, sent at once or one by one as a typist does."""
    _console(env=f"TITAN_RUNS={shlex.quote(str(Path.cwd() / 'unused-runs'))} ", columns=columns)
    try:
        _wait_for(f"{FIRST_FLAG}: ", 60)
        if burst:
            _burst(*keys)
        else:
            _send(*keys)
        _wait_for(f"{FLAGS[9]}: ", 30)  # the last key, shift+tab, back on --decay-steps
        time.sleep(1)
        return _screen()
    finally:
        _kill_session()


def test_a_burst_of_20_keys_fills_the_form_as_slow_typing_does(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(BURST) == 20
    slow = _typed_form(BURST, burst=False)
    fast = _typed_form(BURST, burst=True)
    assert [_field(slow, FLAGS[i]) for i in (5, 6, 8, 9)] == ["12", "0.5", "7", "8"], slow
    assert fast == slow


@needs_ssh
def test_over_ssh_a_burst_after_esc_from_a_launched_run_reaches_history(
    tmp_path: Path, corpus_dir: Path
):
    """A launch replaces its form by the run's monitor: esc goes back to the run list, and h,
    sent in the same write, opens History (not typed into the form's --model)."""
    runs = tmp_path / "runs"
    texts = tiny_form_texts(corpus_dir) | {"steps": "100000", "checkpoint_every": "100000"}
    with ConsoleServer(tmp_path, ["--runs-root", str(runs)]) as server:
        _open_pane(_ssh_command(server), tmp_path / "ssh-status")
        try:
            _wait_for("press n to launch one", 60)
            _send("n")
            type_launch_form(texts)
            _send("C-r")
            _wait_for("1 overview", LAUNCH_TIMEOUT_S)
            _burst("Escape")
            time.sleep(0.6)  # esc and a key read together are alt and that key
            _burst("h")
            after = _wait_for("history of", 30)
        finally:
            _tmux("kill-session", "-t", SESSION)
            _kill_runs(runs)
    assert FIRST_FLAG not in after, after


def test_help_is_f1_on_every_screen_and_leaves_a_form_field_as_it_was(tmp_path: Path):
    _console("--runs-root", str(copy_sample_runs(tmp_path / "runs")))
    try:
        runs = _wait_for(RUN_LIST, 60)
        _send("n")
        _wait_for(f"{FIRST_FLAG}: ", 30)
        form = _wait_for("f1 Keys", 10)
        _send("F1")
        help_ = _wait_for("esc or f1 to close", 10)
        _send("Escape")
        after = _wait_for(f"{FIRST_FLAG}: ", 10)
    finally:
        _kill_session()
    assert "f1 Keys" in runs and "? Keys" not in runs, runs
    assert "f1 Keys" in form, form
    assert "Launch" in help_
    assert _field(after, FIRST_FLAG) == "tiny", after


HOLD = (
    "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('held', flush=True); "
    "time.sleep(120)"
)


def _holder(database: Path) -> subprocess.Popen[str]:
    """A process that holds ``database`` (DuckDB's lock) for two minutes, once it says so."""
    database.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(database)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_held_database_is_named_at_once_in_history_and_by_titan_summarize(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    holder = _holder(database_path(root))
    _console("--runs-root", str(root))
    try:
        _wait_for(RUN_LIST, 60)
        _send("h")
        history = _wait_for(f"another process (pid {holder.pid}) holds", 10)
        cli = subprocess.Popen(
            [sys.executable, "-m", "titan.cli", "summarize", str(root)],
            stderr=subprocess.PIPE,
            text=True,
        )
        start = time.monotonic()
        assert cli.stderr is not None
        said = cli.stderr.readline()
        said_after_s = time.monotonic() - start
        cli.kill()
        cli.wait()
    finally:
        _kill_session()
        holder.kill()
        holder.wait()
    assert "IO Error" not in history
    assert f"another process (pid {holder.pid}) holds {database_path(root)}: waiting" in said
    assert said_after_s < 5.0  # about a second: the interpreter's start and the first try


# SGR parameters that set a colour: basic and bright foreground and background, 256 and 24-bit.
COLOUR_SGR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])[;m]")


@pytest.mark.parametrize("env", ["TERM=dumb", "NO_COLOR=1"])
def test_a_terminal_without_colour_gets_no_colour_escape(tmp_path: Path, env: str):
    _console("--runs-root", str(copy_sample_runs(tmp_path / "runs")), env=f"{env} ")
    try:
        _wait_for(RUN_LIST, 60)
        drawn = _tmux("capture-pane", "-e", "-p", "-t", SESSION)
    finally:
        _kill_session()
    assert "llama3-1b-h200" in drawn
    assert COLOUR_SGR.findall(drawn) == []


CUSTOM_SHAPE = "d_model=256,n_layers=4,n_heads=8,n_kv_heads=4,d_ff=1024"


def test_a_custom_shape_in_the_run_list_at_80x24_ends_in_an_ellipsis(tmp_path: Path):
    root = copy_sample_runs(tmp_path / "runs")
    record = root / "tiny-killed-resumed" / "events.jsonl"
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    for line in lines:
        if line["type"] == "run_start":
            line["config"]["preset"] = CUSTOM_SHAPE
    record.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _console("--runs-root", str(root))
    try:
        listed = _wait_for(RUN_LIST, 60)
    finally:
        _kill_session()
    row = next(line for line in listed.splitlines() if "tiny-killed-resumed" in line)
    assert row.rstrip().endswith("…") and "d_model=256" in row, listed
    assert re.search(r"llama3-1b-h200 +llama3-1b *$", listed, re.MULTILINE), listed  # whole
