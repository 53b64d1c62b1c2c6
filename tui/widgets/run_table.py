"""The table of run dirs on the run list: one row per run, newest first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from textual.binding import Binding

from tui.plain import cell
from tui.run_list import RunSummary
from tui.widgets.plain_table import PlainTable


class RunTable(PlainTable):
    """Runs with their status, progress and last loss; ``Enter`` selects the row under the
    cursor (``DataTable.RowSelected``, whose row key is the run dir's path). Names, presets and
    statuses are shown as inert plain text (:func:`tui.plain.cell`)."""

    BINDINGS = [Binding("enter", "select_cursor", "Open")]

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("run", "preset", "status", "step", "loss")

    def show(self, summaries: Sequence[RunSummary]) -> None:
        """Replace the rows with ``summaries``, keeping the cursor on the same run if listed."""
        selected = self.selected_run()
        self.clear()
        for summary in summaries:
            state = summary.state
            self.add_row(
                cell(summary.run_dir.name),
                cell(state.preset or "?"),
                cell(summary.liveness.state),
                cell(f"{state.step}/{state.total_steps or '?'}"),
                cell("-" if state.loss is None else f"{state.loss:.3f}"),
                key=str(summary.run_dir),
            )
        if selected is not None and str(selected) in self.rows:
            self.move_cursor(row=self.get_row_index(str(selected)))

    def selected_run(self) -> Path | None:
        """The run dir under the cursor, or ``None`` when the table is empty."""
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return Path(str(row_key.value))
