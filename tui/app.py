"""``titan-console``: launch ``titan train`` runs and follow them in the terminal.

Screens: the run list of a runs root (the base screen), the launch form and the run monitor.
With no option the console opens the launch form over the list of ``$TITAN_RUNS`` (or
``./runs``); ``--runs-root DIR`` opens the list of DIR; ``--run RUN_DIR`` opens the monitor of
one run over the list of its parent folder. ``Esc`` goes back to the screen below.

Quitting leaves the training runs this console started running (they are training runs, each in
its own process group, with its output in its run dir) and prints how to stop or follow them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from titan.observability.records import default_runs_root
from tui.launcher import LaunchedRun
from tui.screens.keys import KeysScreen
from tui.screens.launch import LaunchScreen
from tui.screens.monitor import MonitorScreen
from tui.screens.runs import RunsScreen

EXIT_USAGE = 2


class TitanConsole(App[None], inherit_bindings=False):
    """The console. It routes the screens' messages (open a run, new run, launched) and keeps
    the children it started, so that a monitor opened later can still stop them.

    Args:
        runs_root: the runs root listed by the base screen and prefilled in the launch form.
        open_run: a run dir to open in the monitor at start.
        show_launch_form: open the launch form at start (ignored with ``open_run``).
    """

    TITLE = "Titan console"
    CSS_PATH = ["widgets/option_input.tcss", "widgets/stat.tcss"]
    ENABLE_COMMAND_PALETTE = False
    # The footer shows the first key of an action that works where the focus is: q and ? where
    # they can be typed into a text field are replaced there by ctrl+q and f1.
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("question_mark", "help", "Keys"),
        Binding("f1", "help", "Keys"),
        Binding("escape", "back", "Back"),
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    def __init__(
        self, runs_root: Path, *, open_run: Path | None = None, show_launch_form: bool = False
    ) -> None:
        super().__init__()
        self.runs_root = runs_root
        self._open_run = open_run
        self._show_launch_form = show_launch_form and open_run is None
        self.launched: dict[Path, LaunchedRun] = {}

    def get_default_screen(self) -> Screen:
        return RunsScreen(self.runs_root)

    def on_mount(self) -> None:
        if self._open_run is not None:
            self.push_screen(MonitorScreen(self._open_run))
        elif self._show_launch_form:
            self.push_screen(LaunchScreen(self.runs_root))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide Back on the base screen (there is nothing below it)."""
        if action == "back":
            return len(self.screen_stack) > 1
        return True

    def action_back(self) -> None:
        """Return to the screen below."""
        self.pop_screen()

    def action_help(self) -> None:
        """Show the keys of the current screen."""
        self.push_screen(KeysScreen(self.screen))

    def on_runs_screen_open_run(self, message: RunsScreen.OpenRun) -> None:
        launched = self.launched.get(message.run_dir.resolve())
        self.push_screen(MonitorScreen(message.run_dir, launched))

    def on_runs_screen_new_run(self) -> None:
        self.push_screen(LaunchScreen(self.runs_root))

    def on_launch_screen_launched(self, message: LaunchScreen.Launched) -> None:
        run = message.run
        self.launched[run.run_dir] = run
        self.push_screen(MonitorScreen(run.run_dir, run))

    def running_children(self) -> list[LaunchedRun]:
        """The runs this console started that are still running."""
        return [run for run in self.launched.values() if run.returncode() is None]


def exit_message(running: Sequence[LaunchedRun]) -> str:
    """What the console prints on quit about the runs it leaves running ("" when none)."""
    if not running:
        return ""
    lines = [
        f"titan-console: {len(running)} training run(s) left running (quitting does not stop them):"
    ]
    for run in running:
        lines += [
            f"  {run.run_dir}  (pid {run.pid})",
            f"    follow: titan-console --run {run.run_dir}",
            f"    stop:   kill -TERM -{run.pid}",
        ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``titan-console`` command line."""
    parser = argparse.ArgumentParser(
        prog="titan-console",
        description="Terminal console for Titan: launch `titan train` runs from a form built "
        "from the train options, and follow runs (step, loss curve, tokens/s, elapsed and ETA, "
        "process state, run status, stderr). Without options it opens the launch form. "
        "Keys: q quits (ctrl+q inside text fields), ? or f1 lists the keys, esc goes back. "
        "Quitting leaves started runs running and prints how to stop them.",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--runs-root",
        metavar="DIR",
        type=Path,
        help="list the run dirs in DIR (newest first) to open in the monitor; new runs are "
        "created in DIR (default: $TITAN_RUNS, else ./runs, with the launch form open)",
    )
    target.add_argument(
        "--run",
        metavar="RUN_DIR",
        type=Path,
        help="open the monitor of the run in RUN_DIR (a folder with events.jsonl); "
        "esc goes to the list of its parent folder",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``titan-console``. Returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run is not None and not args.run.is_dir():
        parser.exit(EXIT_USAGE, f"titan-console: error: --run: no such folder: {args.run}\n")
    if args.run is not None:
        app = TitanConsole(args.run.resolve().parent, open_run=args.run.resolve())
    elif args.runs_root is not None:
        app = TitanConsole(args.runs_root.resolve())
    else:
        app = TitanConsole(default_runs_root().resolve(), show_launch_form=True)
    app.run()
    message = exit_message(app.running_children())
    if message:
        print(message)
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
