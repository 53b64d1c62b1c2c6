"""The planner form's model: the ``titan plan`` options as text, and back to the planner's result.

The option list is never copied here: it is the actions
:func:`titan.commands.plan.add_plan_arguments` declares, the form's texts are parsed by the parser
it declares them on, and the numbers
come from :func:`titan.commands.plan.request_from_args`, ``planned`` and
:func:`titan.planning.budget.plan` / ``search``: what ``titan plan --json`` prints.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import cache
from typing import Any, NoReturn

from titan.commands.plan import (
    LAYOUT_DESTS,
    PLAN_DEFAULTS,
    add_plan_arguments,
    outcome,
    train_options,
)
from titan.errors import TitanError

# Options of ``titan plan`` the form leaves out: output formatting, calibration and run paths, and
# the batch in sequences (the form names the batch in tokens, --batch-tokens; the CLI takes
# either).
_NOT_IN_FORM = {
    *("help", "json", "top", "wide"),
    *("calibration", "runs_root", "from_run", "run", "batch_size"),
}
# The form opens on a plan that fits (8B on 64 H100s), so its first screen shows a verdict.
FORM_START = {
    "model": "llama3-8b",
    "gpu": "h100",
    "gpus": "64",
    "tokens": "1e12",
    "price": "2.5",
    "batch_tokens": "524288",
    "fsdp": "8",
    "remat": "full",
}
# Rows of the ranked-layouts table of a search.
SEARCH_TOP = 10


class _FormParser(argparse.ArgumentParser):
    """The plan parser with errors raised as :class:`TitanError` (never printed or exiting)."""

    def error(self, message: str) -> NoReturn:
        raise TitanError(message)


@dataclass(frozen=True)
class PlanOption:
    """One ``titan plan`` option as the form shows it.

    Attributes:
        dest: the argparse destination (``gpus_per_node``).
        flag: the option string (``--gpus-per-node``).
        help: its help text.
        default: its default as text (``""`` for none).
        choices: allowed values, or ``()``.
        switch: a ``store_true`` option (``--search``), shown as a checkbox.
    """

    dest: str
    flag: str
    help: str
    default: str
    choices: tuple[str, ...] = ()
    switch: bool = False


@cache
def _plan_parser() -> tuple[_FormParser, tuple[argparse.Action, ...]]:
    parser = _FormParser(prog="titan plan")
    return parser, add_plan_arguments(parser)


def _switch(action: argparse.Action) -> bool:
    """A ``store_true`` option: no value, its constant True."""
    return action.nargs == 0 and action.const is True


@cache
def plan_options() -> tuple[PlanOption, ...]:
    """The form's options, in ``titan plan --help`` order."""
    options = []
    for action in _plan_parser()[1]:
        if action.dest in _NOT_IN_FORM:
            continue
        switch = _switch(action)
        default = PLAN_DEFAULTS.get(action.dest, action.default)
        default = "" if default is None or switch else str(default)
        choices = tuple(str(c) for c in action.choices or ())
        flag = action.option_strings[0]
        options.append(PlanOption(action.dest, flag, action.help or "", default, choices, switch))
    return tuple(options)


def start_texts() -> dict[str, str]:
    """The texts the form opens with: each option's default, then :data:`FORM_START`."""
    return {o.dest: o.default for o in plan_options()} | FORM_START


def plan_argv(texts: dict[str, str]) -> list[str]:
    """``titan plan`` arguments for the form's texts (keyed by dest; empty texts left out, a
    switch given when its text is ``"1"``; the layout options left out with ``--search``, which
    ranks every layout and refuses them)."""
    argv = []
    searching = texts.get("search", "").strip() == "1"
    for option in plan_options():
        text = texts.get(option.dest, "").strip()
        if searching and option.dest in LAYOUT_DESTS:
            continue
        if option.switch:
            argv += [option.flag] if text == "1" else []
        elif text:
            argv += [option.flag, text]
    return argv


def plan_report(texts: dict[str, str]) -> dict[str, Any]:
    """The planner's answer for the form's texts, as ``titan plan`` finds it
    (:func:`titan.commands.plan.outcome`): ``{"search": bool, "layouts_fit": int,
    "plans": [Plan.as_dict(), ...], "verdict": str, "none_fit": str, "notes": [str, ...],
    "train_options": {...} | None}`` (one plan, or the best :data:`SEARCH_TOP` of a search; the
    first's memory verdict in ``titan plan``'s words; why a search found none; the lines
    ``titan plan`` prints under its tables, :meth:`~titan.commands.plan.Outcome.notes`; the
    ``titan train`` options of the first, :func:`titan.commands.plan.train_options`, only when
    ``titan plan`` prints a command).

    Raises:
        TitanError: one line naming the bad option (argparse's wording, or the planner's).
    """
    args = _plan_parser()[0].parse_args(plan_argv(texts))
    found = outcome(args)
    return {
        "search": args.search,
        "layouts_fit": len(found.plans),
        "plans": [p.as_dict() for p in found.plans[:SEARCH_TOP]],
        "verdict": found.verdict_line(),
        "none_fit": "" if found.plans else found.none_fit(),
        "notes": found.notes(),
        "train_options": (
            train_options(args.model, found.plans[0]) if found.command_offered else None
        ),
    }
