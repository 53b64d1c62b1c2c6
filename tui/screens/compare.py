"""Two runs side by side: their loss curves overlaid and the config keys that differ.

The diff's columns are headed ``A`` and ``B`` (the sub-title names the runs), so that two long
run ids do not widen the table past an 80-column terminal."""

from __future__ import annotations

from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header

from titan.errors import TitanError
from titan.inert import inert
from tui.console_app import console_app
from tui.history_queries import HistoryStore, RunDetail, config_diff
from tui.plain import cell
from tui.widgets.curve_plot import CurvePlot
from tui.widgets.plain_table import PlainTable


class CompareScreen(Screen[None]):
    """Loss curves (downsampled by the database) and the config diff, read in a worker.

    Args:
        store: the runs root's database.
        run_a, run_b: the run ids to compare.
    """

    CSS_PATH = "compare.tcss"

    @dataclass
    class Loaded(Message):
        curves: list[list[tuple[int, float]]]
        details: list[RunDetail]

    def __init__(self, store: HistoryStore, run_a: str, run_b: str) -> None:
        super().__init__()
        self.store = store
        self.run_ids = (run_a, run_b)
        self.sub_title = inert(f"A {run_a} vs B {run_b}")
        self.diff: list[tuple[str, object, object]] = []

    def compose(self) -> ComposeResult:
        yield Header()
        ascii_only = console_app(self.app).ascii_only
        yield CurvePlot("loss", ascii_only=ascii_only, id="compare-plot")
        table = PlainTable(id="compare-diff", cursor_type="row")
        table.add_columns("config", "A", "B")
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, group="compare")
    def _load(self) -> None:
        try:
            curves = [self.store.loss_curve(run_id) for run_id in self.run_ids]
            details = [self.store.detail(run_id) for run_id in self.run_ids]
        except TitanError as err:
            self.app.call_from_thread(self.notify, inert(err), severity="error", markup=False)
            return
        self.post_message(self.Loaded(curves, details))

    def on_compare_screen_loaded(self, message: CompareScreen.Loaded) -> None:
        self.query_one(CurvePlot).show(
            [
                (inert(run_id), [s for s, _ in curve], [loss for _, loss in curve])
                for run_id, curve in zip(self.run_ids, message.curves, strict=True)
            ]
        )
        a, b = (d.config for d in message.details)
        self.diff = config_diff(a, b)
        table = self.query_one(DataTable)
        table.add_rows((cell(key), cell(str(va)), cell(str(vb))) for key, va, vb in self.diff)
        missing = [
            inert(r) for r, d in zip(self.run_ids, message.details, strict=True) if not d.config
        ]
        table.border_title = (
            f"config: not recorded by {' and '.join(missing)} (no run_start config)"
            if missing
            else f"config: {len(self.diff)} differences"
        )
