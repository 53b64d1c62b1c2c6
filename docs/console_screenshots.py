"""Save the console screenshots of the docs (80x24 SVG): the launch form as it opens, and the
monitor of a real small run while it trains (the run is stopped afterwards).

Run from the repository root: ``.venv/bin/python docs/console_screenshots.py``. It trains for
about a minute on CPU; the run dir goes to a temporary folder.
"""

from __future__ import annotations

import asyncio
import os
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


async def main() -> None:
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
            await pilot.press("s")
            await _wait(pilot, lambda: app.screen.returncode is not None)
    print(f"saved {DOCS / 'console-launch.svg'} and {DOCS / 'console-monitor.svg'}")


if __name__ == "__main__":
    asyncio.run(main())
