"""Parsers of the compact texts that options take on a command line, shared by every option that
takes one (``titan.config``, ``titan.ops.registry``): ``key=value`` lists, ``A:B`` ranges and
comma-separated counts. Errors are one-line :class:`~titan.errors.TitanError`\\ s naming
``source``, the flag or variable the text came from.
"""

from __future__ import annotations

from titan.errors import TitanError


def parse_assignments(text: str, source: str, shape: str = "key=value") -> dict[str, str]:
    """``"a=x, b=y"`` -> ``{"a": "x", "b": "y"}`` (parts stripped, empty entries skipped).

    Args:
        source: named in errors (``--ops``, ``TITAN_OPS``, ``--model``).
        shape: how an entry should look, named in errors (``op=provider``).

    Raises:
        TitanError: an entry without ``=``, or a key given twice.
    """
    values: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (part.strip() for part in entry.partition("="))
        if not sep:
            raise TitanError(f"{source} entry {entry!r} must look like {shape}")
        if key in values:
            raise TitanError(f"{source} names {shape.partition('=')[0]} {key!r} twice")
        values[key] = value
    return values


def parse_range(text: str, source: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)``, two integers.

    Raises:
        TitanError: not exactly two integers separated by one ``:``.
    """
    parts = text.split(":")
    try:
        first, last = (int(part) for part in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        first = last = None
    if first is None or last is None:
        raise TitanError(f"{source} must be 'A:B' (two step numbers), got {text!r}")
    return first, last


def parse_counts(text: str, source: str) -> tuple[int, ...]:
    """``"3,5,5,3"`` -> ``(3, 5, 5, 3)``; empty text -> ``()``.

    Raises:
        TitanError: a part that is not an integer.
    """
    try:
        return tuple(int(part) for part in filter(None, (p.strip() for p in text.split(","))))
    except ValueError:
        raise TitanError(f"{source} {text!r} must be integers") from None
