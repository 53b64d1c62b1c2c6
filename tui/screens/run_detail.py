"""A run's detail from the database: summary, config, environment, restarts and stalls."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Log, TabbedContent, TabPane

from titan.analysis.report import summary_rows
from titan.errors import TitanError
from titan.formatting import format_clock, format_number
from titan.inert import inert
from tui.history_queries import HistoryStore, RunDetail
from tui.plain import cell, plain, short
from tui.screens.value import ValueScreen
from tui.widgets.plain_table import PlainTable
from tui.widgets.watchdog_panel import stack_lines

TABS = ("summary", "config", "environment", "restarts", "stalls")


def _pairs(mapping: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``(key, value)`` rows of inert plain text, nested values as compact JSON."""
    return [
        (cell(key), cell(value if isinstance(value, str) else json.dumps(value)))
        for key, value in mapping.items()
    ]


def _fill_key_values(table: KeyValueTable, rows: list[tuple[Any, Any]], width: int) -> None:
    """Put ``(key, value)`` rows in a :func:`_key_value_table`, its columns as wide as their
    widest cell at once (DataTable widens auto-width columns only when the app is idle, which a
    loaded machine can put off for seconds, leaving the values cut to the header's width), the
    values no wider than ``width`` cells leave them (the table's width): a longer one is cut,
    ending in "…", and ``enter`` shows it whole (:attr:`KeyValueTable.values`)."""
    table.clear(columns=True)
    table.values = {str(i): str(value) for i, (_, value) in enumerate(rows)}
    key_width = max((cell_len(str(key)) for key, _ in rows), default=len("key"))
    room = width - table.styles.scrollbar_size_vertical - key_width - 4 * table.cell_padding
    value_width = max((cell_len(str(value)) for _, value in rows), default=len("value"))
    if width and room > 1:  # a table not laid out yet, or too narrow for a value: not cut
        value_width = min(value_width, room)
    table.add_column("key", width=key_width)
    table.add_column("value", width=value_width)
    for i, (key, value) in enumerate(rows):
        text = str(value)
        shown = value if cell_len(text) <= value_width else plain(short(text, value_width))
        table.add_row(key, shown, key=str(i))


def _title(tab: str) -> str:
    """A tab's title: its key and its name (``2 config``)."""
    return f"{TABS.index(tab) + 1} {tab}"


class KeyValueTable(PlainTable):
    """``(key, value)`` rows; ``enter`` shows the row's value in full (listed by ``?``).

    Attributes:
        values: each row's whole value, by row key (the cell may be cut to the width).
    """

    BINDINGS = [Binding("enter", "select_cursor", "Value in full")]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.values: dict[str, str] = {}


def _key_value_table(id: str) -> KeyValueTable:
    table = KeyValueTable(id=id, cursor_type="row", show_header=False)
    table.add_columns("key", "value")
    return table


class RunDetailScreen(Screen[None]):
    """Tabs ``1`` to ``5``; the detail is read in a worker. ``enter`` on a row of the summary,
    config or environment shows its value in full (the table cuts long values at 80 columns).

    Args:
        store: the runs root's database.
        run_id: the run to show.
    """

    CSS_PATH = "run_detail.tcss"
    # The cursor starts on the summary's rows (enter, j/k): the tab bar is a key away.
    AUTO_FOCUS = "#detail-summary"
    BINDINGS = [
        # The tab titles start with their keys (the footer leaves them out, as the monitor's).
        Binding(str(i), f"show_tab('{tab}')", tab.capitalize(), show=False)
        for i, tab in enumerate(TABS, 1)
    ]

    @dataclass
    class Loaded(Message):
        detail: RunDetail

    def __init__(self, store: HistoryStore, run_id: str) -> None:
        super().__init__()
        self.store = store
        self.run_id = run_id
        self.sub_title = inert(run_id)
        self.detail: RunDetail | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="summary"):
            for tab in TABS[:3]:
                with TabPane(_title(tab), id=tab):
                    yield _key_value_table(f"detail-{tab}")
            with TabPane(_title("restarts"), id="restarts"):
                table = PlainTable(id="detail-restarts", cursor_type="row")
                table.add_columns("attempt", "started", "from step", "resumed from")
                yield table
            with TabPane(_title("stalls"), id="stalls"):
                yield Log(id="detail-stalls")
        yield Footer()

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, group="detail")
    def _load(self) -> None:
        try:
            self.post_message(self.Loaded(self.store.detail(self.run_id)))
        except TitanError as err:
            self.app.call_from_thread(self.notify, inert(err), severity="error", markup=False)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """A key-value row's whole value, in a dialog."""
        table = event.data_table
        if isinstance(table, KeyValueTable) and event.row_key.value is not None:
            key = table.get_row(event.row_key)[0]
            self.app.push_screen(ValueScreen(str(key), table.values[event.row_key.value]))

    def action_show_tab(self, tab: str) -> None:
        """Show ``tab`` with its table (or stall log) focused, as the summary's at first."""
        tabs = self.query_one(TabbedContent)
        tabs.active = tab
        tabs.get_pane(tab).query("DataTable, Log").first().focus()

    def on_run_detail_screen_loaded(self, message: RunDetailScreen.Loaded) -> None:
        detail = self.detail = message.detail
        rows = summary_rows(detail.summary, detail.config.get("steps"))
        summary = [(cell(key), cell(value)) for key, value in rows]
        width = self.size.width  # every tab's table is as wide (a hidden one has no size yet)
        _fill_key_values(self.query_one("#detail-summary", KeyValueTable), summary, width)
        config = _pairs(detail.config)
        _fill_key_values(self.query_one("#detail-config", KeyValueTable), config, width)
        environment = self.query_one("#detail-environment", KeyValueTable)
        _fill_key_values(environment, _pairs(detail.environment), width)
        self.query_one("#detail-restarts", DataTable).add_rows(
            (
                str(i),
                format_clock(t),
                str(start),
                "-" if resumed is None else str(resumed),
            )
            for i, (t, start, resumed) in enumerate(detail.attempts, 1)
        )
        log = self.query_one("#detail-stalls", Log)
        log.write_line(f"{len(detail.stalls)} stall(s)")
        for stall in detail.stalls:
            log.write_line(
                inert(
                    f"{stall.where()}: {format_number(stall.elapsed_s, '.1f')}"
                    f" s (stall allowance {format_number(stall.threshold_s, '.1f')} s)"
                )
            )
            log.write_lines(f"  {line}" for line in stack_lines(stall))
