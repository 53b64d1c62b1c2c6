"""Record strings as the console shows them: inert, and never read as markup.

Run dir names and every string of a run record reach tables, labels, titles and logs. Each goes
through :func:`titan.inert.inert` (control characters, so terminal escapes, and
bidi overrides written as ``\\x1b``, ``\\u202e``) and is rendered as plain text: a ``[link=...]``
or an unbalanced ``[/]`` shows as typed instead of becoming a hyperlink or a markup error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.text import Text

from titan.inert import inert


class PlainText(Text):
    """A Rich ``Text`` of one line, never parsed as markup, that compares equal to the string it
    shows (so a table's cells read back as their strings, ``cell == "completed"``)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.plain == other
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self.plain)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        """One segment when the text is one unstyled line that fits ``options.max_width``
        unjustified: what Rich's wrapping would give, without it. A table draws every visible
        cell anew after each change, and the wrapping is most of a cell's cost (about half of
        History's time from a new page to its rows drawn, bench/console.py --scale)."""
        if self.one_line(options.max_width, options.justify) is None:
            yield from super().__rich_console__(console, options)
            return
        yield Segment(self.plain)

    def one_line(self, width: int, justify: str | None = None) -> str | None:
        """The text when it is one unstyled line of at most ``width`` cells, drawn left-aligned
        (then it is drawn as it is, in one segment), else None."""
        text = self.plain
        if (
            self.style
            or self._spans
            or "\n" in text
            or "\t" in text
            or (self.justify or justify) not in (None, "default", "left")
            or cell_len(text) > width
        ):
            return None
        return text


# Presets, layouts and statuses longer than these (a custom shape spells out its fields; a
# record may hold any status text) are cut in tables, ending in "…"; a run's detail and its
# monitor show the whole of them.
PRESET_WIDTH, LAYOUT_WIDTH, STATUS_WIDTH = 28, 24, 16


def short(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, its end replaced by "…" when cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def plain(value: object) -> PlainText:
    """``value`` (``str()`` of it) as inert plain text."""
    return PlainText(inert(value), no_wrap=True, end="")


def cell(value: Any) -> Any:
    """A ``DataTable`` cell: numbers and None as they are (the table formats them, no markup),
    anything else as :func:`plain` text (a plain ``str`` cell would be parsed as markup)."""
    if value is None or isinstance(value, int | float):
        return value
    return plain(value)
