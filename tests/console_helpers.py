"""Helpers for the console tests: fill the launch form, wait on the app, write run records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from records import event as event  # the console tests take it from here too
from textual.message import Message
from textual.notifications import Notify
from textual.pilot import Pilot
from textual.screen import Screen

from titan.telemetry.events import Event, parse_events
from titan.telemetry.heartbeat import PROCESSES_DIR, ProcessId
from titan.telemetry.records import EVENTS_FILE, write_json_atomic
from tui.app import TitanConsole
from tui.screens.launch import LaunchScreen
from tui.screens.monitor import MonitorScreen
from tui.screens.planner import PlannerScreen
from tui.widgets.option_input import OptionInput
from tui.widgets.stat import Stat

FormScreen = TypeVar("FormScreen", bound=Screen)
# The first launched run of a session trains a tokenizer and compiles: allow for it.
LAUNCH_TIMEOUT_S = 180.0


def tiny_form_texts(corpus_dir: Path) -> dict[str, str]:
    """Form texts of a small real run (one device, the test corpus)."""
    return {
        "steps": "4",
        "seq_len": "32",
        "batch_size": "4",
        "vocab_size": "512",
        "checkpoint_every": "2",
        "warmup_steps": "2",
        "dp": "1",
        "data": str(corpus_dir),
    }


def fill_form(app: TitanConsole, texts: dict[str, str]) -> None:
    """Set launch-form fields by option name (``{"steps": "4"}``)."""
    for name, text in texts.items():
        app.screen.query_one(f"#option-{name}", OptionInput).control.value = text


async def launch_from_form(
    app: TitanConsole,
    pilot: Pilot,
    texts: dict[str, str],
    until: Callable[[MonitorScreen], bool] | None = None,
) -> MonitorScreen:
    """Fill the launch form with ``texts``, launch with ``ctrl+r`` and let the app run until the
    new run's process has exited, or sooner, its monitor satisfies ``until``; returns the
    monitor."""
    await form_shown(app, pilot, LaunchScreen)
    fill_form(app, texts)
    await pilot.press("ctrl+r")

    def ready() -> bool:
        screen = app.screen
        if not isinstance(screen, MonitorScreen):
            return False
        return screen.returncode is not None or (until is not None and until(screen))

    def context() -> str:
        return run_context(next(iter(app.launched), None))

    await wait_until(pilot, ready, context, LAUNCH_TIMEOUT_S)
    await pilot.pause(0.3)  # let the last poll's message render
    return app.screen


async def open_planner(app: TitanConsole, pilot: Pilot) -> PlannerScreen:
    """Open the planner (``p``) and wait for the plan of its opening form."""
    await pilot.press("p")
    planner = app.screen
    assert isinstance(planner, PlannerScreen)
    await wait_until(pilot, lambda: planner.current, lambda: "no plan", 30)
    return planner


async def form_shown(app: TitanConsole, pilot: Pilot, kind: type[FormScreen]) -> FormScreen:
    """The form of type ``kind`` (launch form, planner) once it shows with its first field
    focused and every row mounted (``filled``; the planner: its first plan made)."""

    def shown() -> bool:
        screen = app.screen
        if not isinstance(screen, kind) or app.focused is None:
            return False
        return bool(getattr(screen, "filled", None) or getattr(screen, "current", None))

    await wait_until(pilot, shown, lambda: f"{app.screen} shown, not a {kind.__name__}", 30)
    assert isinstance(app.screen, kind)
    return app.screen


def stat(app: TitanConsole, stat_id: str) -> str:
    """The value shown by the monitor's Stat ``stat_id`` (``status``, ``step``, ...)."""
    return app.screen.query_one(f"#{stat_id}", Stat).value


async def wait_until(
    pilot: Pilot, condition: Callable[[], bool], context: Callable[[], str], timeout_s: float
) -> None:
    """Let the app run until ``condition()`` holds; fail with ``context()`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s: {context()}")
        await pilot.pause(0.25)


def run_context(run_dir: Path | None) -> str:
    """The tail of a run's stderr.log and events, to explain a timeout."""
    if run_dir is None:
        return "no run launched"
    parts = []
    for name in ("stderr.log", EVENTS_FILE):
        path = run_dir / name
        text = path.read_text(errors="replace")[-2000:] if path.exists() else "(missing)"
        parts.append(f"--- {name}\n{text}")
    return "\n".join(parts)


def notes_into(notes: list[str]) -> Callable[[Message], None]:
    """A ``run_test`` message hook that appends the text of each notification to ``notes``."""

    def hook(message: Message) -> None:
        if isinstance(message, Notify):
            notes.append(message.notification.message)

    return hook


def kill_children(app: TitanConsole) -> None:
    """SIGKILL the process groups of the runs ``app`` started that still run, and reap them."""
    for run in app.launched.values():
        if run.returncode() is None:
            os.killpg(run.pid, signal.SIGKILL)
        run.process.wait(timeout=30)


def parsed(lines: Iterable[dict[str, Any]]) -> list[Event]:
    """Events as a reader gets them from ``lines`` (:func:`parse_events`)."""
    return parse_events(lines)[0]


def append_events(run_dir: Path, events: Iterable[dict[str, Any]], tail: str = "") -> None:
    """Append complete event lines to ``events.jsonl``, then ``tail`` (a partial line)."""
    lines = "".join(json.dumps(e) + "\n" for e in events)
    with open(run_dir / EVENTS_FILE, "a", encoding="utf-8") as f:
        f.write(lines + tail)


def write_lost_peer(run_dir: Path, host: str) -> ProcessId:
    """Process 1 of a two-process run in ``run_dir``: a heartbeat, fresh and ``running``, of a
    process on ``host`` that has already exited (its pid is gone). Returns its identity."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    lost = ProcessId(host, gone.pid, gone.pid, time.time() - 30, process=1)
    beat = {**lost.as_dict(), "processes": 2, "step": 7, "status": "running", "beat": time.time()}
    write_json_atomic(run_dir / PROCESSES_DIR / "1.json", beat)
    return lost
