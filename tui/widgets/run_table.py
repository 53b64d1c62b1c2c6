"""The table of run dirs on the run list: one row per run, its status, step and loss first (a
long run name or preset never pushes them out of an 80-column terminal)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from textual.binding import Binding

from titan.formatting import format_bounded
from titan.inert import inert
from tui.plain import PRESET_WIDTH, STATUS_WIDTH, PlainText, cell, short
from tui.run_list import RunSummary
from tui.widgets.plain_table import PlainTable

RUN_WIDTH = 40  # run names longer than this are cut (tui.plain.short)
MIN_NAME_WIDTH = 8  # a run or preset column is never cut narrower (its "…" then stays legible)
# The colour of each state: done is green, live cyan, a stop blue, a warning yellow, a failure
# red, a lost or unreadable run magenta. Each is the RGB of a bright ANSI colour (Rich's
# standard palette), which a 16-colour terminal is sent as that very ANSI colour. Not the ANSI
# names: Textual draws those in its ANSI theme (Monokai), whose red and magenta are one colour,
# and whose yellow a 16-colour terminal gets as bright red.
STATUS_STYLES = {
    "completed": "#55ff55",
    "running": "#55ffff",
    "starting": "#55ffff",
    "stopped": "#5555ff",
    "stalled": "#ffff55",
    "unresponsive": "bold #ffff55",
    "failed": "#ff5555",
    "dead": "#ff55ff",
    "unreadable": "#ff55ff",
    "removed": "#ff55ff",
}


def status_cell(state: str) -> PlainText:
    """A state as inert text in its colour (:data:`STATUS_STYLES`; other text unstyled)."""
    text = short(inert(state), STATUS_WIDTH)
    return PlainText(text, style=STATUS_STYLES.get(state, ""), no_wrap=True, end="")


class RunTable(PlainTable):
    """Runs with their status, progress and last loss; ``Enter`` selects the row under the
    cursor (``DataTable.RowSelected``, whose row key is the run dir's path). Names, presets and
    statuses are shown as inert plain text (:func:`tui.plain.cell`)."""

    BINDINGS = [Binding("enter", "select_cursor", "Open")]

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("status", "step", "loss", "run", "preset")

    def show(self, summaries: Sequence[RunSummary]) -> None:
        """Replace the rows with ``summaries``, keeping the cursor on the same run if listed."""
        selected = self.selected_run()
        self.clear()
        rows = []
        for summary in summaries:
            state = summary.state
            if summary.unread_bytes:  # its figures so far may be an earlier attempt's
                step, loss = "…", "…"
            else:
                total = format_bounded(state.total_steps, "", "?")
                step = f"{format_bounded(state.step, '')}/{total}"
                loss = format_bounded(state.loss, ".3f")
            rows.append((summary, step, loss))
        run_width, preset_width = self._name_widths(
            [(short(summary.status, STATUS_WIDTH), step, loss) for summary, step, loss in rows],
            max((len(summary.run_dir.name) for summary, _, _ in rows), default=0),
        )
        for summary, step, loss in rows:
            self.add_row(
                status_cell(summary.status),
                cell(step),
                cell(loss),
                cell(short(summary.run_dir.name, run_width)),
                cell(short(summary.state.preset or "?", preset_width)),
                key=str(summary.run_dir),
            )
        if selected is not None and str(selected) in self.rows:
            self.move_cursor(row=self.get_row_index(str(selected)))

    def _name_widths(
        self, figures: Sequence[tuple[str, str, str]], longest_run: int
    ) -> tuple[int, int]:
        """The widths the run and preset columns are cut to (:func:`tui.plain.short`): at most
        :data:`RUN_WIDTH` (and the longest run name, ``longest_run``) and
        :data:`~tui.plain.PRESET_WIDTH`, and within the table's width once the status, step
        and loss columns (``figures``' texts) have theirs: the preset gives way first, down to
        :data:`MIN_NAME_WIDTH`, then the run."""
        width = self.size.width or 10_000  # not laid out yet: the caps alone
        columns = zip(*figures, strict=True) if figures else ((), (), ())
        headers = ("status", "step", "loss")
        used = sum(max([len(h), *map(len, t)]) for h, t in zip(headers, columns, strict=True))
        room = width - used - 2 * self.cell_padding * 5 - 1  # 1: the scrollbar's edge
        run = max(MIN_NAME_WIDTH, min(RUN_WIDTH, longest_run, room - MIN_NAME_WIDTH))
        return run, max(MIN_NAME_WIDTH, min(PRESET_WIDTH, room - run))

    def selected_run(self) -> Path | None:
        """The run dir under the cursor, or ``None`` when the table is empty."""
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return Path(str(row_key.value))
