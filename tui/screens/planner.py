"""The planner: ``titan plan``'s options as a form, its results as tables, recomputed in a
worker as the fields change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, Select, Static

from titan.errors import TitanError
from tui.planner_form import plan_options, plan_report, start_texts
from tui.widgets.option_input import OptionInput, help_line, row_of
from tui.widgets.plan_tables import PlanTables

# Typing pauses this long before the plan is recomputed.
_DEBOUNCE_S = 0.25
_SWITCH_CHOICES = [("off", ""), ("on", "1")]


class PlannerScreen(Screen[None]):
    """The form (left) and the plan (right). Each change restarts a short timer; when it fires
    a thread worker runs :func:`~tui.planner_form.plan_report` (the code of ``titan plan``) and
    posts :class:`Planned`. A bad field shows the planner's one-line error. ``ctrl+t`` sends the
    plan shown (the best of a search) to the launch form (:class:`TrainPlan`), only while that
    plan is the one of the form's texts: not while a change waits for its plan, nor while a bad
    field leaves the last valid plan on show."""

    CSS_PATH = "planner.tcss"
    # The first field has focus as the form opens, so typed keys go to it (never to bindings).
    AUTO_FOCUS = "OptionInput > Input, OptionInput > Select"
    BINDINGS = [Binding("ctrl+t", "train_plan", "Train this plan")]

    @dataclass
    class Planned(Message):
        """A plan report, or the error that stopped it, for the form's ``texts`` (posted by the
        worker)."""

        texts: dict[str, str]
        report: dict[str, Any] | None
        error: str = ""

    @dataclass
    class TrainPlan(Message):
        """Open the launch form with these ``titan train`` options (by config field name)."""

        options: dict[str, Any]

    def __init__(self) -> None:
        super().__init__()
        self.sub_title = "budget planner (titan plan)"
        self.report: dict[str, Any] | None = None
        # Whether ``report`` is the plan of the form's texts as they stand.
        self.current = False
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        texts = start_texts()
        yield Header()
        with Horizontal():
            with VerticalScroll(id="plan-form"):
                for o in plan_options():
                    choices = _SWITCH_CHOICES if o.switch else [(c, c) for c in o.choices]
                    yield OptionInput(
                        o.dest, o.flag, o.help, texts[o.dest], default=o.default, choices=choices
                    )
            yield PlanTables(id="plan-results")
        yield Static("", id="plan-help", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self._recompute()

    def texts(self) -> dict[str, str]:
        """The form's texts, keyed by option dest."""
        return {row.option_name: row.text for row in self.query(OptionInput)}

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self) -> None:
        self.current = False
        self.refresh_bindings()
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(_DEBOUNCE_S, self._recompute)

    @on(Input.Submitted)
    def _next_field(self) -> None:
        self.focus_next()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The focused field's help, unless a bad field's error is on show (it stays until
        the form plans again)."""
        row = row_of(event.widget)
        help_static = self.query_one("#plan-help", Static)
        if row is not None and not help_static.has_class("-error"):
            help_static.update(help_line(row))

    def _recompute(self) -> None:
        self._plan(self.texts())

    @work(thread=True, exclusive=True, group="plan")
    def _plan(self, texts: dict[str, str]) -> None:
        try:
            self.post_message(self.Planned(texts, plan_report(texts)))
        except TitanError as err:
            self.post_message(self.Planned(texts, None, str(err)))

    def on_planner_screen_planned(self, message: PlannerScreen.Planned) -> None:
        if message.texts != self.texts():  # the form changed since: its own plan follows
            return
        help_static = self.query_one("#plan-help", Static)
        help_static.set_class(bool(message.error), "-error")
        tables = self.query_one(PlanTables)
        tables.set_class(bool(message.error), "-stale")
        if message.error:  # the tables still show the last valid input's plan: dimmed, labelled
            help_static.update(f"{message.error} (the dimmed results are for the last valid input)")
            self.refresh_bindings()
            return
        help_static.update("")
        assert message.report is not None  # a plan without an error
        self.report, self.current = message.report, True
        tables.show(message.report)
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``train_plan`` only with the plan of the form's texts (shown dimmed otherwise)."""
        if action == "train_plan":
            return bool(self.current and self.report and self.report.get("train_options")) or None
        return True

    def action_train_plan(self) -> None:
        assert self.report is not None  # check_action enables it with a plan only
        self.post_message(self.TrainPlan(dict(self.report["train_options"])))
