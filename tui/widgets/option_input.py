"""One ``TrainConfig`` option of the launch form: its CLI flag and a field for its value."""

from __future__ import annotations

import dataclasses

from textual.app import ComposeResult
from textual.containers import HorizontalGroup
from textual.widgets import Input, Label, Select

# Input types that keep a numeric option's field from taking letters.
_INPUT_TYPES = {"int": "integer", "float": "number", "str": "text"}


class OptionInput(HorizontalGroup):
    """A form row for one option: a Select when the option has ``choices``, else an Input.

    The option's help text (from the field metadata) is the field's tooltip; the launch screen
    also shows it while the field has focus.

    Args:
        option: a field of :class:`titan.config.TrainConfig`.
        text: the value to show first.
    """

    def __init__(self, option: dataclasses.Field, text: str) -> None:
        super().__init__(id=f"option-{option.name}")
        self.option = option
        choices = option.metadata.get("choices")
        self.control: Input | Select[str] = (
            Select([(c, c) for c in choices], value=text, allow_blank=False, compact=True)
            if choices
            else Input(text, type=_INPUT_TYPES[str(option.type)], compact=True)
        )
        self.control.tooltip = self.help

    @property
    def help(self) -> str:
        """The option's help text."""
        return self.option.metadata["help"]

    @property
    def text(self) -> str:
        """The value as typed (or chosen), not yet parsed."""
        return str(self.control.value)

    def compose(self) -> ComposeResult:
        yield Label(self.option.metadata["flag"])
        yield self.control
