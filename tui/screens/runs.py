"""The run list: the run dirs of a runs root, newest first, to open in the monitor (the most
recently written :data:`tui.run_list.RECENT_RUNS`; History lists all)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from titan.inert import inert
from tui.run_list import RunListing, list_runs
from tui.screens.attach import AttachScreen
from tui.widgets.run_table import RunTable


class RunsScreen(Screen[None]):
    """Lists ``runs_root`` in a worker each time the screen is shown (and on ``r``).

    Posts :class:`OpenRun` for the selected row, or for a run dir typed after ``a`` (attach a run
    started elsewhere); the app opens the monitor.

    Args:
        runs_root: the folder whose run dirs are listed.
    """

    CSS_PATH = "runs.tcss"
    BINDINGS = [
        Binding("a", "attach", "Attach"),
        Binding("r", "refresh", "Refresh"),
    ]

    @dataclass
    class OpenRun(Message):
        """Open ``run_dir`` in the monitor."""

        run_dir: Path

    @dataclass
    class Listed(Message):
        """A finished listing of the runs root (posted by the worker)."""

        listing: RunListing

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.sub_title = inert(f"runs in {runs_root}")

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunTable(id="runs")
        yield Static("Listing runs...", id="runs-status", markup=False)
        yield Footer()

    def on_screen_resume(self) -> None:
        self.action_refresh()

    def action_refresh(self) -> None:
        """List the runs root again (in a worker)."""
        self._list_runs()

    def action_attach(self) -> None:
        """Ask for a run dir and open it in the monitor."""

        def attach(run_dir: Path | None) -> None:
            if run_dir is not None:
                self.post_message(self.OpenRun(run_dir))

        self.app.push_screen(AttachScreen(self.runs_root), attach)

    @work(thread=True, exclusive=True, group="list")
    def _list_runs(self) -> None:
        self.post_message(self.Listed(list_runs(self.runs_root)))

    def on_runs_screen_listed(self, message: RunsScreen.Listed) -> None:
        listing = message.listing
        self.query_one(RunTable).show(listing.summaries)
        status = self.query_one("#runs-status", Static)
        shown = len(listing.summaries)
        if not shown:
            status.update(inert(f"No runs in {self.runs_root} yet: press n to launch one."))
        elif listing.total > shown:
            status.update(
                f"{shown:,} most recently written of {listing.total:,} runs · h: History lists all"
            )
        status.set_class(bool(shown), "-count")
        status.display = listing.total > shown or not shown

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.post_message(self.OpenRun(Path(str(event.row_key.value))))
