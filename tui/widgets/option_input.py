"""One option of a form (launch, planner): its CLI flag and a field for its value."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from textual import events
from textual.app import ComposeResult
from textual.containers import HorizontalGroup
from textual.widget import Widget
from textual.widgets import Input, Label, Select

from titan.config import Option
from titan.config_flags import help_with_default
from tui.typed_keys import KeyQueue

# Input types that keep a numeric option's field from taking letters.
NumberType = Literal["integer", "number"]  # Textual's numeric input types
_INPUT_TYPES: dict[str, NumberType] = {"int": "integer", "float": "number"}
# What a refused character is told as, by input type.
_TYPE_NAMES = {"integer": "a whole number", "number": "a number"}
# The choices of a switch (a boolean option), as its texts.
_SWITCH_CHOICES = (("true", "true"), ("false", "false"))


class NumberInput(Input):
    """A numeric field (Textual's ``integer`` or ``number`` input) that says so when it refuses
    a character: the bell, then a warning naming the field and what it takes.

    Args:
        value: the first text.
        type: ``integer`` or ``number``.
        flag: the field's name in the warning (``--steps``, ``copies``).
    """

    def __init__(self, value: str, type: NumberType, flag: str, **kwargs: Any) -> None:
        super().__init__(value, type=type, compact=True, **kwargs)
        self.flag = flag

    def restricted(self) -> None:
        """Ring the bell and tell what the field takes (Textual calls this on a refused key)."""
        super().restricted()
        self.notify(
            f"{self.flag} takes {_TYPE_NAMES[self.type]}: character refused",
            severity="warning",
            timeout=3,
            markup=False,
        )


class FieldSelect(Select[str]):
    """A form's choice field: a typed character opens its list and searches it (Textual's
    type-to-search, from that first character on) instead of reaching the screen's bindings
    (``n``, ``p``, ``h``, ``q``), as a text field keeps what is typed into it; the footer then
    leaves those bindings out."""

    def check_consume_key(self, key: str, character: str | None = None) -> bool:
        """Printable keys are the field's while it has focus (the footer asks)."""
        return character is not None and character.isprintable()

    def on_key(self, event: events.Key) -> None:
        """Open the list on a printable key, and hand it that key to search with."""
        if event.is_printable and not self.expanded:
            event.stop()
            event.prevent_default()
            self.expanded = True
            typed = events.Key(event.key, event.character)
            # the open list (its widget type, SelectOverlay, by a CSS type selector) searches it
            self.call_after_refresh(self.query_one("SelectOverlay").post_message, typed)


class OptionInput(HorizontalGroup):
    """A form row for one option: a Select when the option has choices, else an Input.

    The option's help text is the field's tooltip; the forms also show it while the field has
    focus. The row's id is ``option-<name>``.

    Args:
        name: the option's name (a field or argparse dest).
        flag: its CLI flag (``--steps``).
        help: its help text.
        text: the value to show first.
        default: the default, shown in the help line.
        choices: ``(label, value)`` pairs of a Select, or empty for an Input.
        input_type: ``int``, ``float`` (numeric fields), anything else: text.
    """

    def __init__(
        self,
        name: str,
        flag: str,
        help: str,
        text: str,
        *,
        default: object = "",
        choices: Sequence[tuple[str, str]] = (),
        input_type: str = "str",
    ) -> None:
        super().__init__(id=f"option-{name}")
        self.option_name, self.flag, self.help, self.default = name, flag, help, default
        self.control: Input | Select[str]
        if choices:
            self.control = FieldSelect(choices, value=text, allow_blank=False, compact=True)
        elif input_type in _INPUT_TYPES:
            self.control = NumberInput(text, _INPUT_TYPES[input_type], flag)
        else:
            self.control = Input(text, compact=True)
        self.control.tooltip = help

    @classmethod
    def for_field(cls, option: Option, text: str) -> OptionInput:
        """The row of a :class:`titan.config.TrainConfig` option (a Select for choices and
        switches)."""
        choices = [(c, c) for c in option.choices]
        return cls(
            option.name,
            option.flag,
            option.help,
            text,
            default=option.text(option.default),
            choices=list(_SWITCH_CHOICES) if option.kind == "bool" else choices,
            input_type=option.kind,
        )

    @property
    def text(self) -> str:
        """The value as typed (or chosen), not yet parsed."""
        return str(self.control.value)

    def compose(self) -> ComposeResult:
        yield Label(self.flag)
        yield self.control


def row_of(widget: Widget) -> OptionInput | None:
    """The form row ``widget`` is in (a focused field's), or None outside any row."""
    return next((n for n in widget.ancestors_with_self if isinstance(n, OptionInput)), None)


def help_line(row: OptionInput) -> str:
    """What a form shows under its fields while ``row`` has focus: the flag, its help and its
    default (:func:`titan.config_flags.help_with_default`)."""
    return f"{row.flag}: {help_with_default(row.help, row.default)}"


def mount_in_parts(
    container: Widget, parts: Sequence[Sequence[Widget]], done: Callable[[], None]
) -> None:
    """Mount ``parts`` (a form's rows, section by section) in ``container``, one part per screen
    refresh, then call ``done``: the form shows its first rows at once, and a screen of 74 rows
    opens in a fraction of the time (Textual styles and lays out every widget it mounts). The
    app's keys that could act beyond the focused field (:meth:`tui.typed_keys.KeyQueue.hold`)
    are held meanwhile, so that one typed before the last part is there (a tab past the rows
    shown) acts on the whole form; characters typed into the first field go in at once."""
    keys = getattr(container.app, "keys", None)
    holder = object()
    if isinstance(keys, KeyQueue):
        keys.hold(holder)
    remaining = list(parts)

    async def mount_next() -> None:
        if remaining and container.is_attached:
            await container.mount_all(remaining.pop(0))
            container.call_after_refresh(mount_next)
            return
        if isinstance(keys, KeyQueue):
            keys.release(holder)
        if container.is_attached:
            done()

    container.call_after_refresh(mount_next)
