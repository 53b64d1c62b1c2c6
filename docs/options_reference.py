"""Write ``docs/options.md``, the reference of ``titan train``'s options, from their one
declaration: the sections of :class:`titan.config.TrainConfig` (TOML keys, types, defaults,
bounds, choices, help, marks) and the parser that ``titan train --help`` prints (each option's
flags, and the flags of the command line that are not options of the config).

Run from the repository root: ``.venv/bin/python docs/options_reference.py``.
``tests/unit/test_options_docs.py`` fails when the page is stale. A script beside the pages, as
``console_screenshots.py`` is, rather than a function of ``titan``: nothing but this page needs
the Markdown, so the package does not ship it. Imports no JAX.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
if str(DOCS.parent) not in sys.path:
    sys.path.insert(0, str(DOCS.parent))

from titan.commands.train import add_parser  # noqa: E402
from titan.config import CODECS, CODECS_PLAIN, SECTIONS, Option, options_by_name  # noqa: E402
from titan.config_files import toml_key  # noqa: E402
from titan.config_flags import bounds_text, section_options, section_summary  # noqa: E402
from titan.inert import markdown_text  # noqa: E402

PAGE = DOCS / "options.md"
COMMAND = ".venv/bin/python docs/options_reference.py"
EMPTY = "—"  # an empty value: a default or a choice of ""
OPTION_COLUMNS = ["flag", "marks", "TOML key", "type", "default", "allowed", "help"]


def _train_parser() -> argparse.ArgumentParser:
    """``titan train``'s parser, as ``titan train --help`` prints it."""
    subparsers = argparse.ArgumentParser(prog="titan").add_subparsers()
    add_parser(subparsers)
    return subparsers.choices["train"]


def _code(text: str) -> str:
    """``text`` as a code span of a table cell (``|`` escaped), or :data:`EMPTY` for ``""``."""
    return "`" + text.replace("|", "\\|") + "`" if text else EMPTY


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [f"| {' | '.join(row)} |" for row in (header, ["---"] * len(header), *rows)]


def _flags(parser: argparse.ArgumentParser, dest: str) -> str:
    """Every flag that sets ``dest`` (``--model``, ``--preset``; ``--x``, ``--no-x``)."""
    return ", ".join(
        _code(flag) for a in parser._actions if a.dest == dest for flag in a.option_strings
    )


def _marks(option: Option) -> str:
    marks = (("R", option.resumable), ("P", option.perf_key), ("planner", option.planner))
    return " ".join(mark for mark, on in marks if on)


def _allowed(option: Option) -> str:
    """The choices of ``option``, else its bounds (``>= 1``, ``0 to 256``), else nothing."""
    return ", ".join(_code(choice) for choice in option.choices) or bounds_text(option)


def _option_row(option: Option, parser: argparse.ArgumentParser) -> list[str]:
    return [
        _flags(parser, option.name),
        _marks(option),
        _code(f"{option.section}.{toml_key(option)}"),
        _code(option.kind),
        _code(option.text(option.default)),
        _allowed(option),
        markdown_text(option.help),
    ]


def _section(section: str, parser: argparse.ArgumentParser) -> list[str]:
    rows = [_option_row(option, parser) for option in section_options(section)]
    summary = markdown_text(section_summary(section))
    return [f"## {section}", "", summary, "", *_table(OPTION_COLUMNS, rows), ""]


def _command_line_groups(parser: argparse.ArgumentParser) -> list[argparse._ArgumentGroup]:
    """The argument groups of ``titan train`` that hold flags but no option of the config
    (``--config``, ``--resume``, ``--distributed``, ...), in ``--help`` order."""
    config = {*options_by_name(), "help"}
    groups = [g for g in parser._action_groups if g._group_actions]
    return [g for g in groups if not any(a.dest in config for a in g._group_actions)]


def _takes(action: argparse.Action) -> str:
    """What a flag of the command line takes: its choices, its metavar, or nothing (a switch)."""
    if action.nargs == 0:
        return EMPTY
    if action.choices:
        return ", ".join(_code(str(choice)) for choice in action.choices)
    return _code(str(action.metavar or action.dest.upper()))


def _command_line_section(group: argparse._ArgumentGroup) -> list[str]:
    rows = [
        [", ".join(map(_code, a.option_strings)), _takes(a), markdown_text(a.help or "")]
        for a in group._group_actions
    ]
    title = markdown_text(group.title or "")
    note = "Flags of the command line only: not options of the config, not in TOML files."
    return [f"## {title}", "", note, "", *_table(["flag", "takes", "help"], rows), ""]


def _preamble() -> list[str]:
    composite = ", ".join(_code(kind) for kind in CODECS if kind not in CODECS_PLAIN)
    return [
        "# Options of `titan train`",
        "",
        "This page is generated from the one declaration of each option, the sections of "
        "`TrainConfig` in `titan/config.py`, from which `titan train --help`, `--config` TOML "
        f"files and `--print-config` are derived too; `{COMMAND}` regenerates it (do not edit "
        "it by hand).",
        "",
        "Each section below is a table of the TOML file that `--config FILE.toml` reads and "
        "`--print-config` writes; **TOML key** names an option as `table.key` "
        "(`data.batch_size` is `batch_size = 8` under `[data]`). **type**: `int`, `float`, "
        "`str`, `bool` (a switch: `--x` or `--no-x`), or a composite value written as its help "
        f"says ({composite}). **default**: the value as the command line takes it, {EMPTY} "
        "for empty (none). **allowed**: the choices or the bounds a value is checked against.",
        "",
        "**marks**: **R**, may change when a run is resumed (`titan train --resume RUN_DIR "
        "--steps 400`); an option without it must match the saved run. **P**, part of the "
        "performance database's key: runs that differ in it are not compared. **planner**, "
        "`titan plan` takes it too.",
        "",
    ]


def render() -> str:
    """``docs/options.md`` as generated from the declarations of the options."""
    parser = _train_parser()
    lines = _preamble()
    for section in SECTIONS:
        lines += _section(section, parser)
    for group in _command_line_groups(parser):
        lines += _command_line_section(group)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    """Write :data:`PAGE`; returns the exit code."""
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
