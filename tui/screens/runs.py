"""The run list: the run dirs of a runs root, newest first, to open in the monitor (the most
recently written :data:`tui.run_list.RECENT_RUNS`; History lists all). It lists them again
every :data:`REFRESH_INTERVAL_S` while shown (each run judged anew, only what a record gained
since read), so that a run killed meanwhile leaves the ``running`` count at the next listing;
one listing runs at a time, and a long record is read a slice at a time: the list shows at
once, such a run as ``reading N%`` until its record is read. ``o`` changes the order, ``/``
filters."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static
from textual.worker import get_current_worker

from titan.analysis.liveness import RUNNING
from titan.formatting import counted
from titan.inert import inert
from tui.refresh_timer import ScreenTicker
from tui.run_list import RecordCache, RunListing, RunSummary, list_runs
from tui.screens.attach import AttachScreen
from tui.widgets.run_table import RunTable

# The run list is listed again this often while shown (seconds).
REFRESH_INTERVAL_S = 2.0
# Seconds a listing reads records before it is shown; one that left records unread is followed
# by another at once, after a pause that leaves the interpreter to the UI thread.
LISTING_BUDGET_S = 0.5
LISTING_PAUSE_S = 0.05
# The orders ``o`` cycles through: name, and the key of each run.
ORDERS = {
    "newest": lambda s: -s.created_at,
    "run": lambda s: s.run_dir.name,
    "status": lambda s: (s.status, -s.created_at),
}


def arrange(summaries: list[RunSummary], order: str, text: str) -> list[RunSummary]:
    """The runs whose name, preset or status holds ``text`` (case-insensitive; '' keeps all),
    in ``order`` (an :data:`ORDERS` name)."""
    text = text.strip().lower()

    def holds(s: RunSummary) -> bool:
        return any(text in (v or "").lower() for v in (s.run_dir.name, s.state.preset, s.status))

    return sorted([s for s in summaries if holds(s)], key=ORDERS[order])


class RunsScreen(Screen[None]):
    """Lists ``runs_root`` in a worker each time the screen is shown (and on ``r``).

    Posts :class:`OpenRun` for the selected row, or for a run dir typed after ``a`` (attach a run
    started elsewhere); the app opens the monitor.

    Its styles (``runs.tcss``) are the app's: Textual loads a screen's ``CSS_PATH`` when the
    screen is pushed, never for the default screen.

    Args:
        runs_root: the folder whose run dirs are listed.
    """

    AUTO_FOCUS = "RunTable"
    # The footer keeps to 80 columns with the app's keys (h History last of them); ? lists all.
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "close_filter", "Clear filter", show=False),
        Binding("o", "order", "Order: newest, run, status", show=False),
        Binding("a", "attach", "Attach", show=False),
        Binding("r", "refresh", "Refresh", show=False),
        # The app's keys, shown in this footer (the app's own are not shown: TitanConsole).
        Binding("n", "app.open('launch')", "Launch"),
        Binding("p", "app.open('planner')", "Planner"),
        Binding("h", "app.open('history')", "History"),
    ]

    @dataclass
    class OpenRun(Message):
        """Open ``run_dir`` in the monitor."""

        run_dir: Path

    @dataclass
    class Listed(Message):
        """A listing of the runs root (posted by the worker); ``last``: the worker's last."""

        listing: RunListing
        last: bool

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.sub_title = inert(f"runs in {runs_root}")
        self.listing: RunListing | None = None
        self.order = "newest"
        self.text = ""
        self._records: RecordCache = {}
        self._listing_now = False  # a worker is listing: no other starts
        self._ticker = ScreenTicker(self, REFRESH_INTERVAL_S, self.action_refresh)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter: text in run, preset or status; enter", id="runs-filter")
        yield RunTable(id="runs")
        yield Static("Listing runs...", id="runs-status", markup=False)
        yield Footer()

    def on_screen_resume(self) -> None:
        self.action_refresh()
        self._ticker.resume()

    def on_screen_suspend(self) -> None:
        self._ticker.pause()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``esc`` clears the filter while its field has focus or a filter is applied;
        elsewhere it goes back."""
        if action == "close_filter":
            return bool(self.text) or self.query_one("#runs-filter", Input).has_focus
        return True

    def action_order(self) -> None:
        """The next order of :data:`ORDERS`."""
        names = list(ORDERS)
        self.order = names[(names.index(self.order) + 1) % len(names)]
        self._show()

    def action_filter(self) -> None:
        field = self.query_one("#runs-filter", Input)
        field.add_class("-shown")
        field.focus()

    def action_close_filter(self) -> None:
        field = self.query_one("#runs-filter", Input)
        field.value = ""
        field.remove_class("-shown")
        self.text = ""
        self._show()
        self.query_one(RunTable).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.text = event.value
        event.input.set_class(bool(event.value.strip()), "-shown")
        self._show()
        self.query_one(RunTable).focus()

    def action_refresh(self) -> None:
        """List the runs root again (in a worker), unless a listing is under way."""
        if not self._listing_now:
            self._listing_now = True
            self._list_runs()

    def action_attach(self) -> None:
        """Ask for a run dir and open it in the monitor."""

        def attach(run_dir: Path | None) -> None:
            if run_dir is not None:
                self.post_message(self.OpenRun(run_dir))

        self.app.push_screen(AttachScreen(self.runs_root), attach)

    @work(thread=True, exclusive=True, group="list")
    def _list_runs(self) -> None:
        """Post listings until every listed record is read (or the screen goes)."""
        worker = get_current_worker()
        while not worker.is_cancelled:
            listing = list_runs(self.runs_root, cache=self._records, budget_s=LISTING_BUDGET_S)
            last = not any(s.unread_bytes for s in listing.summaries)
            self.post_message(self.Listed(listing, last))
            if last:
                return
            time.sleep(LISTING_PAUSE_S)

    def on_runs_screen_listed(self, message: RunsScreen.Listed) -> None:
        self.listing = message.listing
        self._listing_now = not message.last
        self._show()

    def _show(self) -> None:
        """Draw the last listing in the order and under the filter asked, and count it."""
        listing = self.listing
        if listing is None:
            return
        rows = arrange(listing.summaries, self.order, self.text)
        self.query_one(RunTable).show(rows)
        status = self.query_one("#runs-status", Static)
        shown = len(listing.summaries)
        running = sum(s.status == RUNNING for s in listing.summaries)
        if not shown:
            status.update(inert(f"No runs in {self.runs_root} yet: press n to launch one."))
        else:
            parts = [f"{running:,} running"]
            if self.text.strip():
                parts.append(inert(f"{len(rows):,} matching {self.text.strip()!r}"))
            if listing.total > shown:
                parts.append(f"{shown:,} most recently written of {listing.total:,} runs")
                parts.append("h: History lists all")
            else:
                parts.append(counted(shown, "run"))
            parts.append(f"o: order ({self.order})")
            status.update(" · ".join(parts))
        status.set_class(bool(shown), "-count")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.post_message(self.OpenRun(Path(str(event.row_key.value))))
