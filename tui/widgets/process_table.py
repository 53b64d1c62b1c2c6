"""The processes of a run, one row each: host, pid, last step, heartbeat age, state."""

from __future__ import annotations

import time

from titan.analysis.liveness import Liveness
from tui.plain import cell
from tui.widgets.plain_table import PlainTable


class ProcessTable(PlainTable):
    """The run's ``processes/<id>.json`` heartbeats (:class:`~titan.analysis.liveness.
    ProcessBeat`), drawn from a :class:`~titan.analysis.liveness.Liveness`; each row's state is
    :meth:`~titan.analysis.liveness.Liveness.process_state`, in the words of the run's status."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("process", "host", "pid", "step", "heartbeat", "state")

    def show(self, liveness: Liveness | None, now: float | None = None) -> None:
        """Replace the rows (none before the run is judged or without heartbeat files)."""
        now = time.time() if now is None else now
        self.clear()
        if liveness is None:
            return
        for beat in liveness.processes:
            self.add_row(
                str(beat.id.process),
                cell(beat.id.host),
                str(beat.id.pid),
                "-" if beat.step is None else str(beat.step),
                f"{max(now - beat.beat, 0.0):.0f} s ago",
                cell(liveness.process_state(beat, now)),
            )
        count = len(liveness.processes)
        self.border_title = (
            f"{count} process(es)"
            if count
            else "no heartbeat file (processes/*.json) in the run dir"
        )
