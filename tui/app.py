"""``titan-console``: launch ``titan train`` runs, follow them, plan budgets, browse history.

Screens: the run list of a runs root (the base screen), the launch form, the run monitor, the
planner and the history (DuckDB), with the run detail and the comparison of two runs under it.
With no option the console opens the launch form over the list of ``$TITAN_RUNS`` (or
``./runs``); ``--runs-root DIR`` opens the list of DIR; ``--run RUN_DIR`` opens the monitor of
one run over the list of its parent folder. ``Esc`` goes back to the screen below; ``n``, ``p``
and ``h`` open the launch form, the planner and the history from anywhere (``ctrl+p``: the
command palette lists the same). The terminal is restored on quit, on a crash, on SIGTERM and
on SIGHUP (the terminal or SSH session went away; output to a terminal that is gone raises
SIGHUP, :mod:`tui.driver`).

Quitting leaves the training runs this console started running (they are training runs, each in
its own process group, with its output in its run dir) and prints how to stop or follow them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.geometry import Size
from textual.screen import Screen

from titan import installed_version
from titan.analysis.liveness import LAUNCH_FILE
from titan.errors import TitanError
from titan.inert import inert
from titan.out_paths import path_of
from titan.telemetry.records import EVENTS_FILE, check_runs_root, default_runs_root
from tui.driver import ConsoleDriver
from tui.history_queries import HistoryStore
from tui.launcher import LaunchedRun
from tui.options import default_texts, resume_texts
from tui.screens.history import HistoryScreen
from tui.screens.keys import KeysScreen
from tui.screens.launch import LaunchScreen
from tui.screens.monitor import MonitorScreen
from tui.screens.planner import PlannerScreen
from tui.screens.runs import RunsScreen
from tui.typed_keys import KeyQueue, TypedKey
from tui.widgets.too_small import TooSmall, notice_text, too_small

EXIT_USAGE = 2
# The keys that act while the "terminal too small" notice is shown (it names them).
QUIT_KEYS = ("q", "ctrl+q")
# Terminals that draw no colour (terminfo's names): the console runs there as with NO_COLOR.
DUMB_TERMINALS = ("dumb", "unknown")


class TitanConsole(App[None], inherit_bindings=False):
    """The console. It routes the screens' messages (open a run, new run, launched) and keeps
    the children it started, so that a monitor opened later can still stop them.

    Args:
        runs_root: the runs root listed by the base screen and prefilled in the launch form.
        open_run: a run dir to open in the monitor at start.
        show_launch_form: open the launch form at start (ignored with ``open_run``).
        ascii_only: ``--ascii``: line charts with ``*`` and ``+`` instead of braille dots and the
            console's box borders with ``+ - |`` (``ascii.tcss`` says what stays as it is).
    """

    TITLE = "Titan console"
    CSS_PATH = [
        "widgets/option_input.tcss",
        "widgets/stat.tcss",
        "widgets/too_small.tcss",
        "screens/runs.tcss",  # the default screen's: Textual loads only a pushed screen's
        "ascii.tcss",
    ]
    # The footer shows the first key of an action that works where the focus is: q, where it
    # can be typed into a text field, is replaced there by ctrl+q. Help is f1 everywhere (a
    # character key would be text in a form's field).
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "help", "Keys"),
        Binding("escape", "back", "Back"),
        # Shown in the run list's footer (RunsScreen binds them there again); a narrow footer of
        # another screen has no room for them (f1 lists them).
        Binding("n", "open('launch')", "Launch", show=False),
        Binding("p", "open('planner')", "Planner", show=False),
        Binding("h", "open('history')", "History", show=False),
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    def __init__(
        self,
        runs_root: Path,
        *,
        open_run: Path | None = None,
        show_launch_form: bool = False,
        ascii_only: bool = False,
    ) -> None:
        # NO_COLOR: the terminal's own ANSI colours, which Textual then strips (its NoColor
        # filter): no colour escape at all (with Textual's colours it draws shades of grey).
        super().__init__(ansi_color="NO_COLOR" in os.environ)
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            # No animations unless asked for: a tab's sliding underline repaints the screen for
            # 0.3 s, twice the CPU of drawing the tab itself, and every frame crosses the SSH
            # link (bench/console.py --scale, monitor_curves_key_s).
            self.animation_level = "none"
        self.runs_root = runs_root
        self.ascii_only = ascii_only
        self._open_run = open_run
        self._show_launch_form = show_launch_form and open_run is None
        self.launched: dict[Path, LaunchedRun] = {}
        self.history = HistoryStore(runs_root)
        self.keys = KeyQueue(self)

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver for this platform, with :class:`ConsoleDriver` for its Linux one."""
        driver_class = super().get_driver_class()
        return ConsoleDriver if driver_class is LinuxDriver else driver_class

    def get_default_screen(self) -> Screen:
        return RunsScreen(self.runs_root)

    def on_mount(self) -> None:
        self.set_class(self.ascii_only, "-ascii")
        # Below the minimum size every screen shows the same notice over its widgets.
        self.screen_change_signal.subscribe(self, self._add_size_notice)
        self._add_size_notice(self.screen)
        # SIGTERM and SIGHUP exit like q does, so the terminal is restored (Textual restores it
        # on a crash). The loop runs these handlers on this thread: call_from_thread would refuse.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            asyncio.get_running_loop().add_signal_handler(signum, self.exit)
        if self._open_run is not None:
            self.push_screen(MonitorScreen(self._open_run))
        elif self._show_launch_form:
            self.push_screen(LaunchScreen(self.runs_root))

    async def on_event(self, event: events.Event) -> None:
        """Keys the terminal sends are applied one at a time (:mod:`tui.typed_keys`); while the
        "terminal too small" notice is shown, only the quit keys act, and the mouse does not."""
        if isinstance(event, events.InputEvent) and not event.is_forwarded:
            if isinstance(event, TypedKey):
                if self.has_class("-too-small"):
                    self.keys.handled(event)
                    if event.key in QUIT_KEYS:
                        await self.action_quit()
                    return
            elif isinstance(event, events.Key):
                self.keys.read(event)
                return
            elif self.has_class("-too-small"):
                return
        await super().on_event(event)
        if isinstance(event, TypedKey) and not event.is_forwarded:  # a priority binding's key
            self.keys.handled(event)

    def on_key(self, event: events.Key) -> None:
        """A key gone up from the focused widget: the app's bindings act on it next, and then
        the next key goes (:class:`~tui.typed_keys.KeyQueue`)."""
        if isinstance(event, TypedKey):
            self.keys.handled(event)

    def on_resize(self, event: events.Resize) -> None:
        self._check_size(event.size)

    def _check_size(self, size: Size | None = None, screen: Screen | None = None) -> None:
        """Show or hide the "terminal too small" notice for ``size`` (default: the app's), its
        text written on ``screen`` (default: the active one)."""
        size = size or self.size
        small = too_small(size)
        self.set_class(small, "-too-small")
        for notice in (screen or self.screen).query_children(TooSmall):
            notice.left_small = small
            if small:
                notice.update(notice_text(size))

    def _add_size_notice(self, screen: Screen) -> None:
        """Give ``screen`` its notice, as the terminal is now: a screen returned to after a
        resize kept the notice of the size it was left at (or none, when it was left large)."""
        notices = screen.query_children(TooSmall)
        left_small = notices.first().left_small if notices else None
        if not notices:
            screen.mount(TooSmall())
        self._check_size(screen=screen)
        if left_small is not None and left_small != self.has_class("-too-small"):
            # The app's class changed while the screen was below: its styles are restyled (all
            # of its widgets: not for a new screen, which is styled as it mounts).
            self.update_styles(screen)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide Back on the base screen (there is nothing below it), in the key help over it
        too (the help lists the keys of the screen under it)."""
        if action == "back":
            return sum(not isinstance(s, KeysScreen) for s in self.screen_stack) > 1
        return True

    async def action_back(self) -> None:  # async as App's, which it replaces
        """Return to the screen below."""
        self.pop_screen()

    def action_help(self) -> None:
        """Show the keys of the current screen."""
        self.push_screen(KeysScreen(self.screen))

    def action_open(self, name: str) -> None:
        """Show the ``launch``, ``planner`` or ``history`` screen (the one already open when it
        is in the stack: the screens above it are closed; a resume form is never reused as the
        launch form)."""
        kind = {"launch": LaunchScreen, "planner": PlannerScreen, "history": HistoryScreen}[name]
        for depth, screen in enumerate(reversed(self.screen_stack)):
            resume_form = isinstance(screen, LaunchScreen) and screen.resume is not None
            if isinstance(screen, kind) and not resume_form:
                for _ in range(depth):
                    self.pop_screen()
                return
        if name == "launch":
            self.push_screen(LaunchScreen(self.runs_root))
        elif name == "planner":
            self.push_screen(PlannerScreen())
        else:
            self.push_screen(HistoryScreen(self.history))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette (``ctrl+p``): the screens, then Textual's own commands."""
        for name, help in (
            ("launch", "the launch form"),
            ("planner", "the budget planner"),
            ("history", "the run history (DuckDB)"),
        ):
            yield SystemCommand(f"Open {name}", f"Show {help}", lambda n=name: self.action_open(n))
        yield from super().get_system_commands(screen)

    def on_runs_screen_open_run(self, message: RunsScreen.OpenRun) -> None:
        launched = self.launched.get(message.run_dir.resolve())
        self.push_screen(MonitorScreen(message.run_dir, launched))

    def on_monitor_screen_resume(self, message: MonitorScreen.Resume) -> None:
        """The launch form with the run's saved options, to resume it (not while this
        console's resume of it is starting)."""
        child = self.launched.get(message.run_dir.resolve())
        if child is not None and child.resumed and child.process.poll() is None:
            self.notify(f"Already resumed (pid {child.pid}).", title="Cannot resume")
            return
        try:
            texts = resume_texts(message.run_dir)
        except TitanError as err:
            self.notify(inert(err), title="Cannot resume", severity="error", markup=False)
            return
        self.push_screen(LaunchScreen(self.runs_root, resume=message.run_dir, texts=texts))

    def on_planner_screen_train_plan(self, message: PlannerScreen.TrainPlan) -> None:
        """The launch form with a plan's ``titan train`` options over the defaults."""
        texts = default_texts(self.runs_root)
        texts |= {name: str(value) for name, value in message.options.items() if name in texts}
        self.push_screen(LaunchScreen(self.runs_root, texts=texts))

    def on_launch_screen_launched(self, message: LaunchScreen.Launched) -> None:
        for run in message.runs:
            self.launched[run.run_dir] = run
        first = message.runs[0]
        monitor = MonitorScreen(first.run_dir, first)
        if isinstance(self.screen, LaunchScreen):
            # The form is spent: esc goes back to where the form was opened from, and a key
            # typed next never lands in one of its fields (nor resumes a run again).
            self.switch_screen(monitor)
        else:
            self.push_screen(monitor)
        if len(message.runs) > 1:
            self.notify(f"{len(message.runs)} runs launched; the run list shows them all.")

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
        run_dir = inert(run.run_dir)
        lines += [
            f"  {run_dir}  (pid {run.pid})",
            f"    follow: titan-console --run {run_dir}",
            f"    stop:   kill -TERM -{run.pid}",
        ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``titan-console`` command line."""
    parser = argparse.ArgumentParser(
        prog="titan-console",
        description="Terminal console for Titan: launch `titan train` runs from a form built "
        "from the train options, and follow runs (step, loss curve, tokens/s, elapsed and ETA, "
        "process state, run status, watchdog, power, FLOPs, pipeline, stderr), plan budgets "
        "and browse the run history (DuckDB). Without options it opens the launch form. "
        "Keys: q quits (ctrl+q inside text fields), f1 lists the keys, esc goes back, "
        "n / p / h open launch, planner, history. "
        "Quitting leaves started runs running and prints how to stop them.",
    )
    parser.add_argument(
        "--version", action="version", version=f"titan-console {installed_version()}"
    )
    parser.add_argument(
        "--no-color", action="store_true", help="no colours (the same as NO_COLOR=1)"
    )
    parser.add_argument(
        "--ascii",
        action="store_true",
        help="line charts (curves, comparison) with * and + instead of braille dots, and the "
        "console's box borders (loss chart, logs, dialogs) with + - |, while Textual's own "
        "glyphs stay (input field borders, scrollbars, tab underline, progress bar, "
        "sparkline blocks)",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--runs-root",
        metavar="DIR",
        type=path_of,
        help="list the run dirs in DIR (newest first) to open in the monitor; runs launched "
        "here are created in DIR, which the first one creates when it does not exist "
        "(default: $TITAN_RUNS, else ./runs, with the launch form open)",
    )
    target.add_argument(
        "--run",
        metavar="RUN_DIR",
        type=path_of,
        help="open the monitor of the run in RUN_DIR (a folder with events.jsonl); "
        "esc goes to the list of its parent folder",
    )
    return parser


def _not_a_run(run_dir: Path) -> str | None:
    """Why ``run_dir`` is not a run dir the monitor can open (None: it is one): missing, not a
    folder, or a folder with neither the record (``events.jsonl``) nor the console's launch
    file of a run that has not written it yet."""
    if not run_dir.exists():
        return "no such folder"
    if not run_dir.is_dir():
        return "not a folder (give the run's folder)"
    if not any((run_dir / name).exists() for name in (EVENTS_FILE, LAUNCH_FILE)):
        return f"not a run dir (no {EVENTS_FILE} there)"
    return None


def utf8_locale(env: Mapping[str, str]) -> bool:
    """Whether the locale of ``env`` (the first of ``LC_ALL``, ``LC_CTYPE``, ``LANG`` set, POSIX's
    order) encodes UTF-8; a terminal under another (``LANG=C``, or none) gets ASCII drawing
    (``--ascii``). Python's own encoding cannot tell: it coerces the C locale to UTF-8 (PEP 538).
    """
    name = next((env[key] for key in ("LC_ALL", "LC_CTYPE", "LANG") if env.get(key)), "")
    return name.split("@")[0].lower().replace("utf8", "utf-8").endswith("utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``titan-console``. Returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run is not None and (problem := _not_a_run(args.run)):
        parser.exit(EXIT_USAGE, f"titan-console: error: --run {inert(args.run)}: {problem}\n")
    try:  # a runs root that does not exist yet is created by the first run launched
        if args.run is None:
            check_runs_root(args.runs_root or default_runs_root(), created=True)
    except TitanError as err:
        parser.exit(EXIT_USAGE, f"titan-console: error: --runs-root: {inert(err)}\n")
    if args.no_color or os.environ.get("TERM") in DUMB_TERMINALS:
        os.environ["NO_COLOR"] = "1"
    ascii_only = args.ascii or not utf8_locale(os.environ)
    # The terminal's own size, followed as it changes: Textual reads it with
    # shutil.get_terminal_size, which takes exported COLUMNS and LINES first, so that those would
    # pin the console at one size (and hide the "terminal too small" notice).
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    if args.run is not None:
        app = TitanConsole(
            args.run.resolve().parent, open_run=args.run.resolve(), ascii_only=ascii_only
        )
    elif args.runs_root is not None:
        app = TitanConsole(args.runs_root.resolve(), ascii_only=ascii_only)
    else:
        app = TitanConsole(
            default_runs_root().resolve(), show_launch_form=True, ascii_only=ascii_only
        )
    app.run()
    message = exit_message(app.running_children())
    if message:
        try:
            print(message, flush=True)
        except OSError:  # the terminal went away (tui.driver): nobody is left to read it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor the final flush
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
