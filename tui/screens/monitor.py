"""The run monitor: overview (progress, loss, throughput, timing, process and run status, stderr)
and the live panels: loss and learning-rate curves, watchdog, power, FLOPs, pipeline timeline."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Log, TabbedContent, TabPane
from textual.worker import get_current_worker

from titan.analysis.liveness import STALLED, STARTING, UNRESPONSIVE, Liveness
from titan.exit_codes import EXIT_OK, EXIT_STOPPED, EXIT_USAGE
from titan.formatting import format_bounded
from titan.inert import inert
from titan.telemetry.heartbeat import ProcessId
from tui.console_app import console_app
from tui.launcher import LaunchedRun, signal_run
from tui.run_state import RunState
from tui.run_watch import POLL_INTERVAL_S, READ_SLICE_BYTES, RunUpdate, RunWatcher
from tui.screens.confirm import ConfirmScreen
from tui.widgets.curve_plot import CurvePlot
from tui.widgets.flops_panel import FlopsPanel
from tui.widgets.loss_chart import LossChart
from tui.widgets.pipeline_panel import PipelinePanel
from tui.widgets.power_panel import PowerPanel
from tui.widgets.process_table import ProcessTable
from tui.widgets.stat import Stat
from tui.widgets.step_progress import StepProgress
from tui.widgets.watchdog_panel import WatchdogPanel

# Colour of each run status: done is good, a stop is a warning, a failure is bad.
_STATUS_TONES = {
    "completed": "good",
    "stopped": "warn",
    "stopping": "warn",
    "resuming": "warn",
    "failed": "bad",
    "dead": "bad",
    "stalled": "warn",
    "unresponsive": "bad",
    "removed": "bad",
}
# What each key does to the run's recorded process group, and the question asked first.
_SIGNALS = {
    "stop": (signal.SIGTERM, "Stop the run? SIGTERM: it checkpoints, then records 'stopped'."),
    "kill": (signal.SIGKILL, "Kill the run? SIGKILL: no checkpoint and no run_end."),
}
# Refresh of the wall time and the last event's age between polls: both are shown in whole
# seconds, so a faster tick would redraw the same text (nvitop: never poll faster than the data
# changes).
_CLOCK_INTERVAL_S = 1.0
# Repaints of the panels at most this often (a burst of events is drawn once per interval):
# the values are read by a person, and a step already drawn less than a second ago waits for
# the next second (nvitop's restraint). A step after a quiet second is drawn at its poll.
_DRAW_INTERVAL_S = 1.0
# The tabs, with the key that shows each.
TABS = (
    ("overview", "1"),
    ("curves", "2"),
    ("watchdog", "3"),
    ("power", "4"),
    ("flops", "5"),
    ("pipeline", "6"),
    ("processes", "7"),
)


class MonitorScreen(Screen[None]):
    """Follows one run dir, every attempt of it (a resume's too). A thread worker polls it
    (:class:`~tui.run_watch.RunWatcher`: reading, parsing and folding into a
    :class:`~tui.run_state.RunState`) and posts :class:`Polled` with a snapshot; the handler
    only draws, at most every :data:`_DRAW_INTERVAL_S`. The status is the run's liveness
    (:func:`titan.analysis.liveness.judge`). ``s`` stops a live run of this host, whoever
    launched it (SIGTERM to its recorded process group), ``k`` kills it (SIGKILL), each after a
    confirmation and only while its pid is still the recorded process
    (:func:`tui.launcher.signal_run`); ``R`` opens the launch form to resume it. Where a key
    cannot act (another host, an ended run) the footer does not offer it and the process panel
    says why. ``1`` to ``7`` show the tabs.

    Args:
        run_dir: the run dir to follow.
        launched: the child when this console started the run, else ``None``.
    """

    CSS_PATH = "monitor.tcss"
    BINDINGS = [
        Binding("s", "signal('stop')", "Stop run"),
        # Before a focused table's own k (row up, tui.widgets.plain_table): k kills here.
        Binding("k", "signal('kill')", "Kill run", priority=True),
        Binding("R", "resume", "Resume"),
        # Each tab's title starts with its key: the footer leaves them out, so that at 80
        # columns it still shows the run's keys and ? (the key help lists them all).
        *(Binding(key, f"show_tab('{tab}')", tab.capitalize(), show=False) for tab, key in TABS),
    ]

    @dataclass
    class Polled(Message):
        """What the worker found changed in the run dir."""

        update: RunUpdate

    @dataclass
    class Resume(Message):
        """Open the launch form to resume ``run_dir``."""

        run_dir: Path

    def __init__(self, run_dir: Path, launched: LaunchedRun | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.launched = launched
        self.state = RunState()
        self.returncode: int | None = None
        self.liveness: Liveness | None = None
        self._stop_sent = False
        self._stderr_tail: tuple[str, ...] = ()
        self._stdout_line = ""  # stdout.log's last line: what a starting run is doing
        self._stderr_drawn: tuple[str, ...] = ()
        self._unread_bytes = 0
        self._drawn_at = 0.0
        self._draw_pending = False
        self._stale = False  # events arrived while the screen was hidden
        self._drawn_tab = ""
        self.sub_title = inert(self.run_dir.name)

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="overview"):
            with TabPane(_tab_title("overview"), id="overview"):
                yield from self._overview()
            with TabPane(_tab_title("curves"), id="curves"):
                ascii_only = console_app(self.app).ascii_only
                yield CurvePlot("loss", ascii_only=ascii_only, id="loss-plot")
                yield CurvePlot("learning rate", ascii_only=ascii_only, id="lr-plot")
            with TabPane(_tab_title("watchdog"), id="watchdog"):
                yield WatchdogPanel()
            with TabPane(_tab_title("power"), id="power"):
                yield PowerPanel()
            with TabPane(_tab_title("flops"), id="flops"):
                yield FlopsPanel()
            with TabPane(_tab_title("pipeline"), id="pipeline"):
                yield PipelinePanel()
            with TabPane(_tab_title("processes"), id="processes"):
                yield ProcessTable(id="process-table")
        yield Footer()

    def _overview(self) -> ComposeResult:
        with Grid(id="stats"):
            yield Stat("status", id="status")
            yield Stat("process", id="process")
            yield Stat("step", id="step")
            yield Stat("model", id="model")
            yield Stat("loss", id="loss")
            yield Stat("tokens/s", id="throughput")
            yield Stat("wall time", id="elapsed")
            yield Stat("ETA", id="eta")
            yield Stat("tokens", id="tokens")
            yield Stat("saved", id="checkpoint")
        yield StepProgress(id="progress")
        yield LossChart(id="loss-chart")
        yield Log(id="stderr", max_lines=200)

    def on_mount(self) -> None:
        log = self.query_one("#stderr", Log)
        log.border_title = "stderr.log"
        log.border_subtitle = "empty"
        self._show_state()
        self._follow()
        self.set_interval(_CLOCK_INTERVAL_S, self._tick)

    @work(thread=True, exclusive=True, group="follow")
    def _follow(self) -> None:
        """Poll the run dir every POLL_INTERVAL_S while the screen lives: after ``run_end`` too,
        since a resume appends the next attempt to the same record."""
        worker = get_current_worker()
        watcher = RunWatcher(self.run_dir, self.launched)
        while not worker.is_cancelled:
            update = watcher.poll()
            if update is not None:
                self.post_message(self.Polled(update))
            time.sleep(POLL_INTERVAL_S)

    def on_monitor_screen_polled(self, message: MonitorScreen.Polled) -> None:
        update = message.update
        if update.state is not None:
            if update.state.attempts != self.state.attempts:
                self._stop_sent = False  # a stop sent to an earlier attempt
                self.refresh_bindings()
            self.state = update.state
        self._unread_bytes = update.unread_bytes
        exited = update.returncode is not None and update.returncode != self.returncode
        self.returncode = update.returncode
        if exited:  # a resume refused at start-up can be resumed again
            self.refresh_bindings()
            if update.returncode == EXIT_USAGE:
                self._say_refused(update.stderr_tail)
        judged = update.liveness
        # A new state (stopped, dead, ...) is drawn at once, not at the next second.
        new_state = judged is not None and (
            self.liveness is None or self.liveness.state != judged.state
        )
        if judged is not None:
            if self.liveness is None or self.liveness.alive != judged.alive:
                self.refresh_bindings()
            self.liveness = judged
        self._stderr_tail = update.stderr_tail
        self._stdout_line = update.stdout_line
        if not self.is_current:  # under another screen: drawn when shown again
            self._stale = True
            return
        if self._draw_pending and not (exited or new_state):
            return
        due = self._drawn_at + _DRAW_INTERVAL_S - time.monotonic()
        if due <= 0 or exited or new_state:
            self._show_state()
        else:
            self._draw_pending = True
            self.set_timer(due, self._draw_later)

    def _draw_later(self) -> None:
        self._draw_pending = False
        self._show_state()

    def _say_refused(self, stderr_tail: tuple[str, ...]) -> None:
        """Notify that the child refused its options (exit 2), with its one-line reason."""
        lines = [line.strip() for line in stderr_tail if line.strip()]
        why = lines[-1] if lines else "see its stderr"
        self.notify(inert(f"Not started: {why}"), severity="error", markup=False, timeout=15)

    def on_screen_resume(self) -> None:
        """Drawn as it is now: what changed while another screen was shown (a resume launched
        from there may have started or ended meanwhile), and the keys that apply now."""
        self._stale = False
        self.refresh_bindings()
        self._show_state()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """A tab shown by a click: draw it (the hidden tabs are not kept up to date)."""
        if event.pane.id != self._drawn_tab:
            self._show_state()

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._show_state()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Offer Stop and Kill only for a live run of this host, Resume only for an ended one
        that is not being resumed and whose start-up did not fail (its run dir is gone)."""
        if action == "signal":
            return self._control() is not None
        if action == "resume":
            failed_start = self.launched is not None and self.launched.startup_error is not None
            ended = self.liveness is not None and not self.liveness.alive
            return ended and not failed_start and not self._resuming()
        return True

    def _resuming(self) -> bool:
        """Whether this console resumed the run and the new attempt has not started yet."""
        child = console_app(self.app).launched.get(self.run_dir.resolve())
        return child is not None and child.resuming(self.state.started_at)

    def _control(self) -> ProcessId | None:
        """The process group a stop would signal, or None when none can be."""
        if self.liveness is None or not self.liveness.alive:
            return None
        return self.liveness.control

    def action_signal(self, what: str) -> None:
        """After a confirmation, ``stop`` (SIGTERM: the trainer checkpoints and records
        ``stopped``) or ``kill`` (SIGKILL) the run's recorded process group."""
        process = self._control()
        if process is None:
            return
        signum, question = _SIGNALS[what]

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            refused = signal_run(process, signum)
            if refused is not None:
                self.notify(f"Not sent: {refused}.", severity="warning", markup=False)
                return
            self._stop_sent = signum == signal.SIGTERM  # "stopping" until the run ends
            self.notify(f"{signum.name} sent to process group {process.pgid}.")
            self._show_state()

        self.app.push_screen(ConfirmScreen(question), answered)

    def action_resume(self) -> None:
        """Open the launch form with this run's options, to resume it (``--resume``)."""
        self.post_message(self.Resume(self.run_dir))

    @property
    def status(self) -> str:
        """The run status shown: its liveness (the record's status until first judged);
        ``stopping`` after a stop until the run ends, unless the run is frozen or stalled (a
        process that may not act on the stop: :meth:`_show_overview` says the stop is pending);
        ``resuming`` from a resume's launch until its ``run_start``."""
        if self._resuming():
            return "resuming"
        if self.liveness is None:
            return self.state.status
        if self._stop_sent and self.liveness.alive and not self._stuck():
            return "stopping"
        return self.liveness.state

    def _show_state(self) -> None:
        """Draw the visible tab (a hidden tab is drawn when it is shown)."""
        active = self._drawn_tab = self.query_one(TabbedContent).active
        if active == "overview":
            self._show_overview()
        elif active == "curves":
            curve, held_out = self.state.curve, self.state.eval_curve
            steps = curve.steps
            losses = [("loss", steps, curve.losses)]
            if held_out.count:
                losses.append(("eval loss", held_out.steps, held_out.losses))
            self.query_one("#loss-plot", CurvePlot).show(losses)
            self.query_one("#lr-plot", CurvePlot).show([("lr", steps, curve.lrs)])
        elif active == "power":
            self.query_one(PowerPanel).show(self.state)
        elif active == "flops":
            self.query_one(FlopsPanel).show(self.state)
        elif active == "pipeline":
            self.query_one(PipelinePanel).show(self.state)
        elif active == "processes":
            self.query_one(ProcessTable).show(self.liveness)
        self._show_clock()
        self._drawn_at = time.monotonic()

    def _stuck(self) -> bool:
        """Whether the run is judged frozen or stalled (a stop may wait on it for ever)."""
        return self.liveness is not None and self.liveness.state in (UNRESPONSIVE, STALLED)

    def _history_behind(self) -> bool:
        """Whether the newest events are shown ahead of the history still being read
        (:mod:`tui.run_watch`): what the latest ``run_start`` says (the attempt's start, the
        step it resumed at) is not known until the history reaches it."""
        return self._unread_bytes > READ_SLICE_BYTES

    def _show_overview(self) -> None:
        state = self.state
        status = self.status
        liveness = self.liveness
        shown = liveness.describe() if liveness and status == liveness.state else status
        if status == STARTING and self._stdout_line:
            shown = f"{status}: {self._stdout_line}"
        if self._stop_sent and self._stuck():
            shown += "; stop sent, not acted on yet: k kills"
        self.query_one("#status", Stat).show(shown, _STATUS_TONES.get(status), wrap=shown != status)
        self._show_process()
        total = format_bounded(state.total_steps, "", "?")
        resumed_at = state.resumed_from_step
        resumed = "" if resumed_at is None else f" (resumed at {resumed_at})"
        if self._history_behind():  # its run_start may be an earlier attempt's: not shown
            resumed = f" · {self._unread_bytes / 1e6:.1f} MB of history to read"
        self.query_one("#step", Stat).show(f"{format_bounded(state.step, '')} / {total}{resumed}")
        params = "" if state.param_count is None else f" · {state.param_count / 1e6:.2f}M params"
        self.query_one("#model", Stat).show(f"{state.preset or '?'}{params}")
        self.query_one("#loss", Stat).show(format_bounded(state.loss, ".4f"))
        self.query_one("#throughput", Stat).show(format_bounded(state.tokens_per_s, ",.0f"))
        self.query_one("#tokens", Stat).show(format_bounded(state.tokens_seen, ","))
        # A run that stopped or failed has nothing left to wait for: no ETA, not 0:00:00.
        eta_s = state.eta_s() if status in ("running", "completed") else None
        self.query_one("#eta", Stat).show(_duration(eta_s))
        saved_at = state.checkpoint_step
        saved = "-" if saved_at is None else f"checkpoint at step {saved_at}"
        self.query_one("#checkpoint", Stat).show(saved)
        self.query_one("#progress", StepProgress).show(state.step, state.total_steps)
        self._show_stderr()

    def _show_stderr(self) -> None:
        """The tail of ``stderr.log``, when it changed since drawn."""
        if self._stderr_tail == self._stderr_drawn:
            return
        self._stderr_drawn = self._stderr_tail
        log = self.query_one("#stderr", Log)
        log.clear()
        log.write_lines(inert(line) for line in self._stderr_tail)
        log.border_subtitle = "" if self._stderr_tail else "empty"

    def _show_process(self) -> None:
        process = self.query_one("#process", Stat)
        liveness = self.liveness
        if self.launched is not None and self.returncode is not None:
            if self.returncode < 0:
                process.show(f"killed by {signal.Signals(-self.returncode).name}", "bad")
            else:
                clean = self.returncode in (EXIT_OK, EXIT_STOPPED)  # completed or stopped
                process.show(f"exited rc {self.returncode}", "good" if clean else "bad")
        elif self._resuming():  # the liveness is still the ended attempt's
            process.show("the resume's process runs; its run_start is not written yet", wrap=True)
        elif liveness is None:
            process.show("-")
        elif liveness.lost is not None:
            process.show(f"gone: {liveness.lost.name()}", "bad")
        elif liveness.alive and liveness.control is not None:
            pid = liveness.control.pid
            beats = [b for b in liveness.processes if b.id.pid == pid and b.id.local]
            # Its heartbeat's state (unresponsive when stopped), as the processes tab says it.
            word = liveness.process_state(beats[0], time.time()) if beats else "running"
            process.show(f"{word} (pid {pid})", _STATUS_TONES.get(word))
        else:
            process.show(liveness.no_control, wrap=True)

    def _tick(self) -> None:
        """The clock, unless a draw within the last tick already showed it: a run stepping
        once a second is repainted once a second, not twice."""
        if time.monotonic() - self._drawn_at >= _CLOCK_INTERVAL_S:
            self._show_clock()

    def _show_clock(self) -> None:
        """Draw what ages with the clock on the visible tab: the wall time, the loss chart (at
        most every few seconds), the last event's age."""
        if not self.is_current:
            return
        active = self.query_one(TabbedContent).active
        if active == "overview":
            alive = self.liveness is None or self.liveness.alive
            now = time.time() if alive else self.state.last_event_at or time.time()
            elapsed = None if self._history_behind() else self.state.elapsed_s(now)
            self.query_one("#elapsed", Stat).show(_duration(elapsed))
            ended = self.state.end_status is not None or self.returncode is not None
            self.query_one(LossChart).show(self.state.curve, force=ended)
        elif active == "watchdog":
            self.query_one(WatchdogPanel).show(self.state)


def _tab_title(tab: str) -> str:
    """A tab's title: its key and its name (``2 curves``)."""
    return f"{dict(TABS)[tab]} {tab}"


def _duration(seconds: float | None) -> str:
    """``h:mm:ss`` for a number of seconds; ``-`` when unknown."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
