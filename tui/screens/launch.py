"""The launch form: every ``titan train`` option, prefilled with its default, form presets,
several copies of a run at once, and a Launch key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, HorizontalGroup
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Header, Input, Label, Select, Static

from titan.config import TrainConfig, option_fields
from titan.errors import TitanError
from titan.inert import inert
from titan.parallel.fit import check_layout
from tui.devices import devices_seen
from tui.launcher import LaunchedRun, child_env, start_run
from tui.options import FORM_PRESETS, config_from_texts, copies_of, default_texts, preset_texts
from tui.widgets.option_input import (
    FieldSelect,
    NumberInput,
    OptionInput,
    help_line,
    mount_in_parts,
    row_of,
)

# The sections composed with the form (what a terminal of 80x24 shows of it); the others are
# mounted right after it shows (mount_in_parts).
FIRST_SECTIONS = 2


class LaunchScreen(Screen[None]):
    """A form built from :class:`titan.config.TrainConfig`'s options, under a heading per
    section.

    Launching validates with the CLI's own check (a :class:`~titan.errors.TitanError` is shown
    under the form and as a notification, and focuses the named field), then, in a worker,
    checks the layout against the devices a run would see (:mod:`tui.devices`; refused with
    ``titan train``'s line, :func:`titan.parallel.fit.check_layout`), creates the run dir and
    starts the child, and posts :class:`Launched`; the app opens the monitor.

    Args:
        runs_root: prefilled ``--runs-root``.
        resume: a run dir to resume (``titan train --resume``): the form holds its saved
            options, and one run is launched in it.
        texts: the form's texts (default: the defaults, with ``runs_root``).
    """

    CSS_PATH = "launch.tcss"
    # The first field has focus as the form opens.
    AUTO_FOCUS = "OptionInput > Input, OptionInput > Select"
    BINDINGS = [Binding("ctrl+r", "launch", "Launch")]

    @dataclass
    class Launched(Message):
        """Runs were started (posted from the launch worker)."""

        runs: list[LaunchedRun]

    @dataclass
    class LaunchFailed(Message):
        """The layout does not fit the devices (or they could not be counted), or creating the
        run dir or starting the child failed (posted from the launch worker)."""

        error: str

    def __init__(
        self, runs_root: Path, resume: Path | None = None, texts: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.resume = resume
        self.texts = texts or default_texts(runs_root)
        self.sub_title = inert(f"resume {resume}") if resume else "launch a training run"
        self._launching = False
        self._error = ""  # the error shown under the form
        self._preset = "defaults"  # the form preset the Select shows
        self.filled = False  # every section's rows mounted (mount_in_parts)
        self._later_sections: list[list[Widget]] = []

    def compose(self) -> ComposeResult:
        yield Header()
        sections = self._sections()
        self._later_sections = sections[FIRST_SECTIONS:]
        with Grid(id="options"):
            for widgets in sections[:FIRST_SECTIONS]:
                yield from widgets
        yield Static(id="option-help", markup=False)
        yield Static(id="launch-error", markup=False)
        with HorizontalGroup(id="launch-bar"):
            yield Button(
                "Resume" if self.resume else "Launch", id="launch", variant="primary", compact=True
            )
            if self.resume:
                yield Label(inert(f"--resume {self.resume}"), id="resume-dir", markup=False)
            else:
                yield Label("preset")
                presets = [(name, name) for name in FORM_PRESETS]
                yield FieldSelect(
                    presets, value="defaults", allow_blank=False, compact=True, id="preset"
                )
                yield Label("copies")
                yield NumberInput("1", "integer", "copies", id="copies")
        yield Footer()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """Show the help text of the option whose field got focus."""
        row = row_of(event.widget)
        if row is not None:
            self.query_one("#option-help", Static).update(help_line(row))

    @on(Select.Changed, "#preset")
    def _apply_preset(self, event: Select.Changed) -> None:
        """Fill every field from the chosen form preset (a choice of another one: the Select's
        first value, posted as it mounts, leaves the texts the form was opened with)."""
        if str(event.value) == self._preset:
            return
        self._preset = str(event.value)
        texts = preset_texts(self.runs_root, self._preset)
        for row in self.query(OptionInput):
            row.control.value = texts[row.option_name]
        self._show_error("")  # an error about the texts replaced no longer applies

    @on(Input.Changed)
    @on(Select.Changed)
    def _edited(self, event: Input.Changed | Select.Changed) -> None:
        """An edit of a field clears the error shown: it was about the texts before the edit
        (the next Launch checks them again)."""
        if event.control.id != "preset" and self._error:
            self._show_error("")

    @on(Input.Submitted)
    def _next_field(self) -> None:
        """Enter in a field moves to the next one, as Tab does (it does not launch)."""
        self.focus_next()

    @on(Button.Pressed, "#launch")
    def _launch_pressed(self) -> None:
        """The Launch button does what ctrl+r does."""
        self.action_launch()

    def _sections(self) -> list[list[Widget]]:
        """The form's rows, section by section, each under its heading."""
        sections: dict[str, list[Widget]] = {}
        for option in option_fields():
            if option.section not in sections:
                sections[option.section] = [Label(option.section, classes="section")]
            sections[option.section].append(OptionInput.for_field(option, self.texts[option.name]))
        return list(sections.values())

    def on_mount(self) -> None:
        self._count_devices()
        grid = self.query_one("#options", Grid)
        mount_in_parts(grid, [sum(self._later_sections, [])], self._filled)

    def _filled(self) -> None:
        self.filled = True

    @work(thread=True, exclusive=True, group="devices")
    def _count_devices(self) -> None:
        """Ask for the devices while the form is filled in, so that Launch finds the answer
        kept (:func:`tui.devices.devices_seen`); a failure is reported by Launch itself."""
        try:
            devices_seen(child_env())
        except TitanError:
            pass

    def action_launch(self) -> None:
        """Validate the form and, when it is valid, start the run in a worker (the Launch
        button, clicked before every row is there, does nothing)."""
        if self._launching or not self.filled:
            return
        rows = list(self.query(OptionInput))
        copies = "1" if self.resume else self.query_one("#copies", Input).value
        try:
            config = config_from_texts({row.option_name: row.text for row in rows})
            configs = copies_of(config, copies)
        except TitanError as err:
            self._show_error(str(err))
            return
        self._show_error("")
        self._launching = True
        self._start(configs)

    @work(thread=True, exclusive=True, group="launch")
    def _start(self, configs: list[TrainConfig]) -> None:
        runs = []
        try:
            devices = devices_seen(child_env())
            for config in configs:
                check_layout(
                    config.parallel, config.data.batch_size, devices.count, devices.backend
                )
            for config in configs:
                runs.append(start_run(config, self.resume))
        except (TitanError, OSError) as err:
            self.post_message(self.LaunchFailed(str(err)))
        if runs:
            self.post_message(self.Launched(runs))

    def on_launch_screen_launched(self) -> None:
        self._launching = False

    def on_launch_screen_launch_failed(self, message: LaunchScreen.LaunchFailed) -> None:
        self._launching = False
        self._show_error(message.error)

    def _show_error(self, error: str) -> None:
        """Show ``error`` under the form (``""`` clears it), notify, and focus the field of the
        flag it names."""
        self._error = error
        self.query_one("#launch-error", Static).update(error)
        flag = _first_flag(error)
        for row in self.query(OptionInput):
            named = row.flag == flag
            row.set_class(named, "-invalid")
            if named:
                row.control.focus()
        if error:
            self.notify(error, title="Cannot launch", severity="error", markup=False)


def _first_flag(message: str) -> str | None:
    """The first ``--flag`` a TitanError or argparse message names (``argument --steps: ...``)."""
    return next((w.rstrip(":,") for w in message.split() if w.startswith("--")), None)
