"""The console through a real terminal: tmux runs ``titan-console``, ``send-keys`` fills the
launch form of a tiny run, ``capture-pane`` reads the monitor, ``q`` quits; and every screen at
80x24 shows what it must (run ids in full, states, the keys), and below it the "terminal too
small" notice. ``TITAN_TMUX_CAPTURES=DIR`` saves the text of each screen at 80x24 in DIR."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from console_helpers import tiny_form_texts
from samples import copy_sample_runs, sample_run_dirs

from titan.config import option_fields
from titan.telemetry.records import read_events

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.slow,
]
SESSION = f"titan-console-test-{os.getpid()}"
# Tab stops of the launch form from its first field to the ones typed here: one per option, in
# the config's order (section headings take no focus).
TAB_OF = {option.name: tab for tab, option in enumerate(option_fields())}
FIRST_FLAG = option_fields()[0].flag
FLAG_OF = {option.name: option.flag for option in option_fields()}
FIELD_NAMES = ("steps", "batch_size", "seq_len", "warmup_steps", "data", "vocab_size", "dp")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _screen() -> str:
    return _tmux("capture-pane", "-p", "-t", SESSION)


def _session_alive() -> bool:
    return (
        subprocess.run(["tmux", "has-session", "-t", SESSION], capture_output=True).returncode == 0
    )


def _send(*keys: str) -> None:
    """Send keys one by one, pausing as a typist does (a burst would reach a field before the
    focus moved to it)."""
    for key in keys:
        _tmux("send-keys", "-t", SESSION, *key.split(" "))
        # After esc, a longer pause: esc and a key read together are alt and that key.
        time.sleep(0.6 if key == "Escape" else 0.2)


def _back_to_the_run_list(*keys: str) -> None:
    """Send ``keys`` and wait for the run list's keys: a key sent while a form still had the
    focus (a loaded machine is slow to close it) would be typed into its field."""
    _send(*keys)
    _wait_for("⏎ Open", 30)


def _wait_for(text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (screen := _screen()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not on screen after {timeout_s} s:\n{screen}")
        time.sleep(0.3)
    return screen


def type_launch_form(texts: dict[str, str]) -> None:
    """Type ``texts`` into the launch form's fields, tabbing from the first one. Each field is
    typed into once the help line names it: keys read before the focus moved (the console lags
    under load, and the form focuses its first field only once shown) would land in the field
    before."""
    _wait_for(f"{FIRST_FLAG}: ", 60)
    position = 0
    for name in sorted(texts, key=TAB_OF.__getitem__):
        _send(*["Tab"] * (TAB_OF[name] - position))
        _wait_for(f"{FLAG_OF[name]}: ", 30)
        _send(f"-l {texts[name]}")
        position = TAB_OF[name]


def test_console_in_tmux_launches_watches_and_quits(tmp_path: Path, corpus_dir: Path):
    runs = tmp_path / "runs"
    texts = tiny_form_texts(corpus_dir) | {"steps": "6"}
    exit_file = tmp_path / "exit.txt"
    command = (
        f"TITAN_RUNS={shlex.quote(str(runs))} {shlex.quote(sys.executable)} -m tui.app "
        f"> {shlex.quote(str(exit_file))}"
    )
    _tmux("new-session", "-d", "-s", SESSION, "-x", "100", "-y", "30", "-c", os.getcwd(), command)
    try:
        type_launch_form({name: texts[name] for name in FIELD_NAMES})
        _send("C-r")
        # The process's exit, not only run_end's "completed": quitting before the trainer's
        # process is gone would leave it running (and say so).
        watched = _wait_for("exited rc 0", 180)
        _send("q")
        deadline = time.monotonic() + 20
        while _session_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        quit_in_time = not _session_alive()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    (run_dir,) = runs.iterdir()
    events = read_events(run_dir)
    steps = [e["step"] for e in events if e["type"] == "step"]
    for pid_line in exit_file.read_text().split("(pid ")[1:]:  # runs left running, if any
        os.killpg(int(pid_line.split(")")[0]), signal.SIGKILL)
    assert quit_in_time
    assert "step      6 / 6" in watched and "completed" in watched
    assert steps == [1, 2, 3, 4, 5, 6]
    assert events[-1]["status"] == "completed"
    assert exit_file.read_text() == ""  # quit after the run ended: nothing left running


# Where test_every_screen_at_80x24_* writes the text of each screen (unset: nowhere).
CAPTURES = os.environ.get("TITAN_TMUX_CAPTURES")
SAMPLE_IDS = [d.name for d in sample_run_dirs()]
TOO_SMALL = "Terminal too small: 70x20."


def _shown(name: str, *texts: str, small: bool = True, timeout_s: float = 30) -> str:
    """The screen once every one of ``texts`` is on it (saved as ``name``.txt under CAPTURES);
    then, with ``small``, the terminal shrunk below the minimum size: the notice instead; and
    back at 80x24."""
    deadline = time.monotonic() + timeout_s
    while not all(text in (screen := _screen()) for text in texts):
        if time.monotonic() > deadline:
            missing = [text for text in texts if text not in screen]
            raise AssertionError(f"{name}: {missing} not on screen:\n{screen}")
        time.sleep(0.3)
    if CAPTURES:
        Path(CAPTURES).mkdir(parents=True, exist_ok=True)
        (Path(CAPTURES) / f"{name}.txt").write_text(screen)
    if not small:
        return screen
    _tmux("resize-window", "-t", SESSION, "-x", "70", "-y", "20")
    small = _wait_for(TOO_SMALL, 10)
    _tmux("resize-window", "-t", SESSION, "-x", "80", "-y", "24")
    _wait_for(texts[0], 10)
    assert "enlarge the window" in small and texts[0] not in small, name
    return screen


def test_every_screen_at_80x24_shows_run_ids_states_and_keys_or_a_too_small_notice(
    tmp_path: Path,
):
    root = copy_sample_runs(tmp_path / "runs")
    command = f"{shlex.quote(sys.executable)} -m tui.app --runs-root {shlex.quote(str(root))}"
    _tmux("new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", "-c", os.getcwd(), command)
    keys = ("q Quit", "f1 Keys")
    try:
        runs = _shown("runs", *SAMPLE_IDS, "completed", "failed", "23/40", *keys, "h History")
        _send("Enter")  # the newest run: llama3-1b-h200
        monitor = _shown("monitor", "— llama3-1b-h200", "1 overview", "completed", *keys)
        _send("2")
        _shown("monitor-curves", "learning rate", "step", "R Resume", *keys, small=False)
        _send("Escape", "h")
        history = _shown("history", *SAMPLE_IDS, "4 runs", "failed", "⏎ Detail", *keys)
        _send("Enter")
        detail = _shown("detail", "— llama3-1b-h200", "1 summary", "completed", *keys)
        _send("Escape", "Space", "Down", "Space", "c")
        compare = _shown("compare", "A llama3-1b-h200 vs B tiny-watchdog-stall", "config", *keys)
        _back_to_the_run_list("Escape", "Escape")
        _send("p")
        # a field has focus: q and ? are text there
        planner = _shown("planner", "budget planner", "--model", "^t Train this plan", "f1 Keys")
        _back_to_the_run_list("Escape")
        _send("n")
        launch = _shown("launch", "--model: ", "--nonfinite-patience ", "^r Launch", "f1 Keys")
        _back_to_the_run_list("Escape")
        _send("F1")
        help_ = _shown("keys", "esc or f1 to close", "Attach")
        _send("C-End")  # the list scrolls: the app's keys come last
        _shown("keys-end", "esc or f1 to close", "History", small=False)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    screens = [runs, monitor, history, detail, compare, planner, launch, help_]
    assert all(len(line) <= 80 for screen in screens for line in screen.splitlines())
    assert "23" in history.split("tiny-watchdog-stall")[1].splitlines()[0]  # as the run list
