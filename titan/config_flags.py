"""Command-line flags derived from the sections of :class:`titan.config.TrainConfig`, shared by
``titan train`` (every section) and ``titan plan`` (the options marked for the planner)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from typing import Any

from titan.config import CODECS_PLAIN, SECTIONS, Option, option_fields
from titan.shapes import PRESETS


def help_with_default(help: str, default: object) -> str:
    """``help`` with ``(default: 'x')`` appended, unless it names its default already (the
    default is then said once: ``titan train --help`` and the console's forms)."""
    return help if "(default:" in help else f"{help} (default: {default!r})"


def add_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    options: Iterable[Option],
    *,
    explicit: bool,
) -> list[argparse.Action]:
    """Add a flag per option to ``parser``: switches as ``--x`` / ``--no-x``, numbers and names
    with argparse's type and choices (argparse's own one-line errors), composite values as text
    parsed when the config is constructed. ``--model`` also gets ``--preset`` (presets only; the
    two are mutually exclusive). Returns the actions added, in order.

    Args:
        explicit: default every flag to None, so that the options a user typed can be told from
            the defaults (``titan train``, whose help then names each default); else the option's
            default (``titan plan``, whose help formatter shows it).
    """
    types = {"int": int, "float": float}
    added: list[argparse.Action] = []
    for option in options:
        default = option.default
        bounds = bounds_text(option)
        help = f"{option.help} [{bounds}]" if bounds else option.help
        if explicit:
            help = help_with_default(
                help, default if option.kind in CODECS_PLAIN else option.text(default)
            )
        common: dict[str, Any] = {
            "dest": option.name,
            "default": None if explicit else default,
            "help": help,
        }
        if option.kind == "bool":
            added.append(
                parser.add_argument(option.flag, action=argparse.BooleanOptionalAction, **common)
            )
            continue
        if option.kind == "shape":  # --preset is an alias: giving both is refused
            either = parser.add_mutually_exclusive_group()
            added.append(either.add_argument(option.flag, metavar="PRESET|SHAPE", **common))
            common["help"] = "a preset model shape (the same as --model NAME; not with --model)"
            added.append(either.add_argument("--preset", choices=tuple(PRESETS), **common))
            continue
        if option.kind == "settings":  # KEY=VALUE ..., repeatable
            added.append(
                parser.add_argument(
                    option.flag, nargs="+", action="extend", metavar="KEY=VALUE", **common
                )
            )
            continue
        added.append(
            parser.add_argument(
                option.flag,
                type=types.get(option.kind, str),
                choices=option.choices or None,
                metavar=None if option.choices else option.name.upper(),
                **common,
            )
        )
    return added


def section_options(section: str, *, planner: bool = False) -> tuple[Option, ...]:
    """The options of one section, in order; ``planner``: only those ``titan plan`` takes."""
    return tuple(
        o
        for o in option_fields()
        if o.section == section and (not planner or o.metadata.get("planner"))
    )


def bounds_text(option: Option) -> str:
    """The allowed range of ``option``'s bounds (``minimum``, ``maximum``, and the exclusive
    ``above`` and ``below``): ``>= LOW, < HIGH`` and the like, ``LOW to HIGH`` for two
    inclusive ones, or ``""`` for an option without bounds (``titan train --help`` shows it in
    brackets)."""
    meta = option.metadata
    low, high = meta.get("minimum"), meta.get("maximum")
    if low is not None and high is not None:
        return f"{_bound(low)} to {_bound(high)}"
    signs = ((">=", low), ("<=", high), (">", meta.get("above")), ("<", meta.get("below")))
    return ", ".join(f"{sign} {_bound(value)}" for sign, value in signs if value is not None)


def _bound(value: float) -> str:
    """A bound as written: an integer whole (``2,147,483,647``), a float short (``1e-08``)."""
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def section_summary(section: str) -> str:
    """The first paragraph of a section's docstring as plain text, on one line: ``x`` and
    :role:`x` as x (the description of its argument group in ``titan train --help``).

    Raises:
        KeyError: ``section`` is not a :data:`titan.config.SECTIONS` name.
    """
    paragraph = (SECTIONS[section].__doc__ or "").split("\n\n")[0]
    return re.sub(r":\w+:`~?([^`]*)`", r"\1", " ".join(paragraph.split())).replace("``", "")
