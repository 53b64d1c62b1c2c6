"""Save the console screenshots of the docs (SVG), all at 80x24, the smallest terminal the
console is drawn for: the launch form as it opens, the monitor of a real small run while it
trains (the run is stopped afterwards), and the planner, history, run comparison and watchdog
panel over ``sample_runs/``.

Run from the repository root: ``.venv/bin/python docs/console_screenshots.py``. It trains for
about a minute on CPU; run dirs go to a temporary folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
os.environ["PYTHONPATH"] = str(DOCS.parent)  # for the trainer child, which runs in a temp dir

from tui.app import TitanConsole  # noqa: E402
from tui.screens.monitor import MonitorScreen  # noqa: E402
from tui.widgets.option_input import OptionInput  # noqa: E402

SIZE = (80, 24)
# A run small enough for a CPU, long enough to draw a loss curve.
RUN_OPTIONS = {"steps": "400", "batch_size": "8", "seq_len": "64", "vocab_size": "1024"}
SHOT_AT_STEP = 120
TIMEOUT_S = 600


async def _wait(pilot, condition) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the run did not get far enough; see its stderr.log")
        await pilot.pause(0.5)


async def sample_screens(tmp: str) -> None:
    """Planner, history, comparison, run detail and watchdog panel over a copy of sample_runs."""
    shutil.copytree(DOCS.parent / "sample_runs", Path(tmp) / "sample_runs")
    os.chdir(tmp)
    app = TitanConsole(Path("sample_runs"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await _wait(pilot, lambda: app.screen.report is not None)
        await pilot.pause(0.5)
        app.save_screenshot("console-planner.svg", str(DOCS))
        await pilot.press("escape", "h")  # a planner field has focus: h would be text there
        await _wait(pilot, lambda: app.screen.loaded)
        await pilot.press("space", "down", "space")
        await pilot.pause(0.3)
        app.save_screenshot("console-history.svg", str(DOCS))
        await pilot.press("c")
        await _wait(pilot, lambda: bool(app.screen.diff))
        await pilot.pause(0.5)
        app.save_screenshot("console-compare.svg", str(DOCS))
        await pilot.press("escape", "up", "enter")
        await _wait(pilot, lambda: app.screen.detail is not None)
        await pilot.press("5")
        await pilot.pause(0.3)
        app.save_screenshot("console-run-detail.svg", str(DOCS))
    app = TitanConsole(Path("sample_runs"), open_run=Path("sample_runs/tiny-watchdog-stall"))
    async with app.run_test(size=SIZE) as pilot:
        await _wait(pilot, lambda: app.screen.state.end_status is not None)
        await pilot.press("3")
        await pilot.pause(0.5)
        app.save_screenshot("console-watchdog.svg", str(DOCS))


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await sample_screens(tmp)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the form shows the runs root as typed: "runs"
        app = TitanConsole(Path("runs"), show_launch_form=True)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.5)
            app.save_screenshot("console-launch.svg", str(DOCS))
            for name, text in RUN_OPTIONS.items():
                app.screen.query_one(f"#option-{name}", OptionInput).control.value = text
            await pilot.press("ctrl+r")
            await _wait(
                pilot,
                lambda: (
                    isinstance(app.screen, MonitorScreen)
                    and (app.screen.state.step >= SHOT_AT_STEP or app.screen.returncode is not None)
                ),
            )
            await pilot.pause(1.0)
            app.save_screenshot("console-monitor.svg", str(DOCS))
            await pilot.press("2")
            await pilot.pause(1.0)
            app.save_screenshot("console-curves.svg", str(DOCS))
            await pilot.press("s", "y")
            await _wait(pilot, lambda: app.screen.returncode is not None)
    print(f"saved the console screenshots in {DOCS}")


if __name__ == "__main__":
    asyncio.run(main())
