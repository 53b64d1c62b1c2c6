"""Attach a run dir started outside the console (another terminal, a cluster job writing to a
shared filesystem): type its path, the monitor follows it."""

from __future__ import annotations

from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from titan.inert import inert
from titan.telemetry.records import EVENTS_FILE
from tui.widgets.dialog import dialog_box


class AttachScreen(ModalScreen[Path | None]):
    """Dismisses with the run dir typed (a folder with ``events.jsonl``), or None on ``Esc``.

    Args:
        runs_root: where a relative path starts.
    """

    CSS_PATH = "dialog.tcss"
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = runs_root

    def compose(self) -> ComposeResult:
        with dialog_box("attach a run dir", "enter: attach · esc: cancel"):
            yield Input(placeholder=f"run dir (relative to {self.runs_root})", id="attach-path")
            yield Static("", id="attach-error", markup=False)

    @on(Input.Submitted)
    def _open_typed_run_dir(self, event: Input.Submitted) -> None:
        run_dir = (self.runs_root / Path(event.value.strip()).expanduser()).resolve()
        if not (run_dir / EVENTS_FILE).is_file():
            self.query_one("#attach-error", Static).update(inert(f"no {EVENTS_FILE} in {run_dir}"))
            return
        self.dismiss(run_dir)
