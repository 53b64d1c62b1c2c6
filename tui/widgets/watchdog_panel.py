"""The watchdog panel: the phase the run is in, the age of its last event against the phase's
stall allowance (the trainer's watchdog; not the heartbeat allowance the run's state is judged
by, :mod:`titan.analysis.liveness`), and the stalls with their stacks."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Log

from titan.formatting import format_number
from titan.inert import inert
from titan.telemetry.events import Stall
from tui.run_state import RunState
from tui.widgets.stat import Stat, tone_of

# Last event's age over the stall allowance that turns the age yellow (red past 1: the watchdog
# fires).
WARN_FRACTION = 0.5


class WatchdogPanel(Vertical):
    """Phase, age of the last event, stall allowance, stalls; the stacks of the last stall below.

    Args:
        id: the widget id.
    """

    def compose(self) -> ComposeResult:
        yield Stat("phase", id="wd-phase")
        yield Stat("last event", id="wd-age")
        yield Stat("stall allowance", id="wd-threshold")
        yield Stat("stalls", id="wd-stalls")
        yield Log(id="wd-stacks", max_lines=400)

    def on_mount(self) -> None:
        self.query_one(Log).border_title = "stacks of the last stall"
        self._stacks_of = -1

    def show(self, state: RunState, now: float | None = None) -> None:
        """Draw ``state`` at ``now`` (unix seconds; default: the clock)."""
        now = time.time() if now is None else now
        threshold = state.threshold_s()
        self.query_one("#wd-phase", Stat).show(state.phase)
        self.query_one("#wd-threshold", Stat).show(
            "none (idle)" if threshold == float("inf") else f"{threshold:.1f} s"
        )
        age_stat = self.query_one("#wd-age", Stat)
        if state.last_event_at is None or state.end_status:
            age_stat.show("-")
        elif state.last_event_at > now + 1:  # another host's clock, or a record's bad time
            age_stat.show(f"{state.last_event_at - now:.0f} s ahead of this clock", "warn")
        else:
            age = now - state.last_event_at
            # Whole seconds: the monitor's clock ticks once a second.
            age_stat.show(f"{age:.0f} s ago", tone_of(age / threshold, WARN_FRACTION, 1.0))
        stalls = state.stalls
        summary = (
            "none"
            if not stalls
            else "; ".join(
                f"{s.where()}: {format_number(s.elapsed_s, '.1f')} s > "
                f"{format_number(s.threshold_s, '.1f')} s"
                for s in stalls[-2:]
            )
        )
        self.query_one("#wd-stalls", Stat).show(
            f"{state.stall_count} · {summary}" if stalls else summary, "bad" if stalls else "good"
        )
        if state.stall_count != self._stacks_of:
            self._stacks_of = state.stall_count
            self._show_stacks(stalls[-1] if stalls else None)

    def _show_stacks(self, stall: Stall | None) -> None:
        log = self.query_one(Log)
        log.clear()
        if stall is None:
            log.write_line("no stall recorded")
            return
        log.write_lines(stack_lines(stall))


def stack_lines(stall: Stall) -> list[str]:
    """The lines of a stall's stacks, inert: ``thread <name>:`` then its frames' lines. A stack
    of the wrong shape in the record (not a list, a frame that is not text) is shown as what it
    is, not trusted."""
    lines = []
    for thread in stall.stacks or []:
        lines.append(inert(f"thread {thread.get('thread')}:"))
        stack = thread.get("stack")
        for frame in stack if isinstance(stack, list) else [stack]:
            lines += [inert(line) for line in str(frame).splitlines()]
    return lines
