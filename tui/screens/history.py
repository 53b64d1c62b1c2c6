"""History: the runs of the runs root's DuckDB database, sortable and filterable, to open,
compare and export. The console ingests the records in a worker when the screen opens, on ``r``
and every few seconds while the screen is shown; sorting, filtering and paging run in SQL in a
worker too, and the table holds one page (:data:`tui.history_queries.PAGE_ROWS` rows), so the UI
thread only ever draws a page."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from titan.errors import TitanError
from titan.formatting import counted
from titan.inert import inert
from titan.telemetry.events import MFU_CONVENTION
from tui.history_queries import READ_HOLD_S, HistoryPage, HistoryQuery, HistoryStore
from tui.refresh_timer import ScreenTicker
from tui.screens.compare import CompareScreen
from tui.screens.run_detail import RunDetailScreen
from tui.widgets.history_table import HistoryTable

# New records are ingested this often while the screen is shown (the timer is paused while a
# detail, a comparison or another screen covers it), and never more often than every
# INGEST_SPACING times the last ingest's duration (the stat of every run dir takes seconds at
# 100k runs: the console would do nothing else), nor while one is under way; but at least every
# MAX_INGEST_GAP_S, so that new runs appear within half a minute whatever an ingest took. An
# ingest that found the database held by another process (for longer than its connect waits,
# summarize.LOCK_WAIT_S) is tried again at the next tick.
REFRESH_INTERVAL_S = 5.0
INGEST_SPACING = 5.0
MAX_INGEST_GAP_S = 30.0


class HistoryScreen(Screen[None]):
    """The History table over a :class:`~tui.history_queries.HistoryStore`.

    Args:
        store: the runs root's database.
    """

    CSS_PATH = "history.tcss"
    AUTO_FOCUS = "HistoryTable"
    # The footer shows what fits at 80 columns with q and ?; the status line and the key help
    # (?) name the rest.
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "close_filter", "Clear filter"),
        Binding("r", "refresh", "Refresh", show=False),
        Binding("c", "compare", "Compare"),
        Binding("x", "export('csv')", "CSV", show=False),
        Binding("X", "export('parquet')", "Parquet", show=False),
    ]

    @dataclass
    class Loaded(Message):
        """A page of rows (after an ingest, or a new sort, filter or page), or the error that
        stopped it (posted by the worker)."""

        page: HistoryPage | None
        error: str = ""

    def __init__(self, store: HistoryStore) -> None:
        super().__init__()
        self.store = store
        self.sub_title = inert(f"history of {store.runs_root}")
        self.loaded = False
        self._ticker = ScreenTicker(self, REFRESH_INTERVAL_S, self._tick)
        self._ingesting = False
        self._held_line = ""  # the database held by another process, said until an ingest gets it
        self._next_ingest_at = 0.0  # time.monotonic() before which no periodic ingest starts

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter: text in any column, enter to apply", id="history-filter")
        yield HistoryTable(id="history")
        yield Static("Ingesting run records...", id="history-status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        """Show the stored runs at once, then ingest the new records and show them again (a
        database held by another process is said at once, on the status line)."""
        self.store.on_held = self._held
        self._load(self.query_one(HistoryTable).requested, ingest=True, stored_first=True)

    def on_unmount(self) -> None:
        self.store.on_held = None

    def _held(self, line: str) -> None:
        """Say (from a worker) that the database is held, until an ingest gets it; the rows
        shown stay."""
        self._held_line = f"{line} (the rows shown stay)"
        self.app.call_from_thread(self._status, self._held_line)

    def on_screen_resume(self) -> None:
        self._ticker.resume()

    def on_screen_suspend(self) -> None:
        self._ticker.pause()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``esc`` clears the filter while its field has focus; elsewhere it goes back."""
        if action == "close_filter":
            return self.query_one("#history-filter", Input).has_focus
        return True

    def action_refresh(self) -> None:
        """Ingest new records and fetch the page shown again (in a worker)."""
        self._load(self.query_one(HistoryTable).requested, ingest=True)

    def _tick(self) -> None:
        """The periodic refresh, unless an ingest is under way or the last one was recent for
        its duration (:data:`INGEST_SPACING`)."""
        if not self._ingesting and time.monotonic() >= self._next_ingest_at:
            self.action_refresh()

    def on_history_table_columns_changed(self) -> None:
        """Name the columns left out (or none) on the status line."""
        if self.loaded:
            self._show_count()

    def on_history_table_query_changed(self, message: HistoryTable.QueryChanged) -> None:
        """Fetch another page (sort, filter or page changed), in a worker; its connection is
        held for the next key (:data:`tui.history_queries.READ_HOLD_S`)."""
        self._load(message.query, ingest=False, hold_s=READ_HOLD_S)

    @work(thread=True, group="history")
    def _load(
        self, query: HistoryQuery, ingest: bool, stored_first: bool = False, hold_s: float = 0.0
    ) -> None:
        """Sort, filter and page in SQL, off the UI thread (the page is drawn on it); with
        ``ingest``, after ingesting the new records (``stored_first``: the page of the records
        already stored is posted before, so that a large runs root opens at once)."""
        try:
            if stored_first and self.store.exists():
                self.post_message(self.Loaded(self.store.page(query)))
            if ingest:
                self._ingest(query)
            self.post_message(self.Loaded(self.store.page(query, hold_s)))
        except TitanError as err:
            self.post_message(self.Loaded(None, inert(err)))

    def _ingest(self, query: HistoryQuery) -> None:
        """One ingest (in the worker), timed for :meth:`_tick`; while it lasts, the status line
        counts the run dirs read, and the page of ``query`` is shown again after each batch
        (a first ingest of many runs fills the table as it goes)."""
        self._ingesting = True
        start = time.monotonic()

        def progress(done: int, todo: int) -> None:
            if done < todo:
                self.post_message(self.Loaded(self.store.page(query)))
                self.app.call_from_thread(
                    self._status, f"Ingesting run records: {done:,} of {todo:,} run dirs read..."
                )

        try:
            self.store.ingest(progress)
        except TitanError:
            self._next_ingest_at = 0.0  # the database was held: the next tick tries again
            raise
        else:
            self._held_line = ""
            end = time.monotonic()
            self._next_ingest_at = end + min(INGEST_SPACING * (end - start), MAX_INGEST_GAP_S)
        finally:
            self._ingesting = False

    def on_history_screen_loaded(self, message: HistoryScreen.Loaded) -> None:
        table = self.query_one(HistoryTable)
        if message.page is None:
            self._status(message.error)
            return
        if message.page.query != table.requested:
            return  # an answer to a query since replaced
        if message.page != table.page:
            table.show(message.page)
        self.loaded = True
        self._show_count()

    def _show_count(self) -> None:
        """The runs matching (``1 of 4 runs`` under a filter), the rows of the page when there
        is more than one, the MFU's convention and the keys, on the status line."""
        page = self.query_one(HistoryTable).page
        parts = [
            f"{page.matched:,} of {counted(page.total, 'run')}"
            if page.query.text
            else counted(page.total, "run")
        ]
        if page.matched > len(page.rows):
            last = page.offset + len(page.rows)
            parts.append(f"rows {page.offset + 1:,}-{last:,}, ]/[: next/previous page")
        hidden = self.query_one(HistoryTable).hidden
        if hidden:  # before the rest: the status line is cut at its end
            parts.append(f"{', '.join(hidden)}: enter (detail)")
        parts.append(f"MFU {MFU_CONVENTION}, of each run's peak (in its detail)")
        parts.append("space: mark two, c: compare · O: reverse · x/X: export CSV/Parquet")
        if self._held_line:
            parts.insert(0, self._held_line)
        elif self._ingesting:
            parts.insert(0, "reading new run records...")
        self._status(" · ".join(parts))

    def _status(self, text: str) -> None:
        self.query_one("#history-status", Static).update(text)

    def action_filter(self) -> None:
        field = self.query_one("#history-filter", Input)
        field.add_class("-shown")
        field.focus()

    def action_close_filter(self) -> None:
        """Clear the filter (all runs shown again), hide its field, back to the table."""
        field = self.query_one("#history-filter", Input)
        field.value = ""
        field.remove_class("-shown")
        table = self.query_one(HistoryTable)
        table.set_filter("")
        table.focus()

    @on(Input.Submitted, "#history-filter")
    def _apply_filter(self, event: Input.Submitted) -> None:
        table = self.query_one(HistoryTable)
        table.set_filter(event.value)
        event.input.set_class(bool(event.value.strip()), "-shown")
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.push_screen(RunDetailScreen(self.store, str(event.row_key.value)))

    def action_compare(self) -> None:
        marked = self.query_one(HistoryTable).marked
        if len(marked) != 2:
            self.notify("Mark two runs with space to compare them.", severity="warning")
            return
        self.app.push_screen(CompareScreen(self.store, *marked))

    def action_export(self, kind: str) -> None:
        """Write every run matching the filter, in the table's order, to
        ``<runs root>/history.<kind>``, or the first free ``history-2.<kind>``, ``history-3...``
        when it exists (never overwritten; the notice names the file), in a worker."""
        query = dataclasses.replace(self.query_one(HistoryTable).requested, offset=0)
        self._export(self.store.runs_root, kind, query)

    @work(thread=True, group="export")
    def _export(self, folder: Path, kind: str, query: HistoryQuery) -> None:
        path = free_path(folder, "history", kind)
        try:
            count = self.store.export(path, query)
        except TitanError as err:
            self.app.call_from_thread(self.notify, inert(err), severity="error", markup=False)
            return
        runs = "run" if count == 1 else "runs"
        self.app.call_from_thread(
            self.notify, inert(f"{count} {runs} written to {path}"), markup=False
        )


def free_path(folder: Path, stem: str, suffix: str) -> Path:
    """``folder/stem.suffix``, or the first of ``stem-2.suffix``, ``stem-3.suffix``... that does
    not exist."""
    path, number = folder / f"{stem}.{suffix}", 1
    while path.exists():
        number += 1
        path = folder / f"{stem}-{number}.{suffix}"
    return path
