"""Progress of a command's long work (titan.progress_bar): a bar on a terminal's stderr, nothing
on a pipe, the items handed on in order either way."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from titan.progress_bar import tracked

WORK = (
    "import time; from titan.progress_bar import tracked; "
    "done = [time.sleep(0.002) for _ in tracked(range(600), 'writing: steps', every=10)]; "
    "print(len(done), file=__import__('sys').stdout)"
)


def _in_a_terminal(code: str) -> str:
    """What ``code`` writes to stderr and stdout when both are a terminal (a pseudo-terminal)."""
    parent, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, "-c", code], stdout=child, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    assert process.wait(timeout=60) == 0
    return b"".join(chunks).decode(errors="replace")


def test_a_terminal_gets_a_bar_with_the_count_and_the_items_all_come_through():
    shown = _in_a_terminal(WORK)
    assert "writing: steps" in shown and "/600" in shown
    assert shown.rstrip().endswith("600")


def test_a_pipe_gets_no_bar_even_where_colour_is_forced():
    env = {**os.environ, "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"}  # as CI systems set
    done = subprocess.run(
        [sys.executable, "-c", WORK],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    assert (done.stdout, done.stderr) == ("600\n", "")


def test_tracked_hands_on_every_item_in_order():
    assert list(tracked(list("abcde"), "letters", every=2)) == list("abcde")
