"""Guarded reads of the files Titan reads: ``--config`` TOML files, run records (``config.json``,
``events.jsonl``), checkpoint metadata, calibration files, Hugging Face configs.

Every read here refuses, in one line naming the file (and, for a document, the field):

- a path that is not a regular file: a directory, a FIFO (opened without blocking, so a FIFO
  with no writer cannot stall the reader), a device, a socket;
- a file larger than its limit (:data:`MAX_DOCUMENT_BYTES` for a whole document), read up to the
  limit only, whatever size the file system reports (``/proc`` files report 0);
- bytes that are not UTF-8;
- JSON that is malformed, or nested deeper than :data:`MAX_JSON_DEPTH` (``json.loads`` itself
  raises ``RecursionError`` a thousand deep, and readers that walk a value recursively would
  fail a little less deep);
- a value of the wrong JSON type where a field is read (:func:`json_field`).

The errors are :class:`titan.errors.TitanError` (the CLI's exit code 2). Lines of a record read
while another process appends to it are parsed leniently instead (:func:`parse_json`: None for a
line that is not a record's). This module imports neither JAX nor Textual.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from titan.errors import TitanError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in JSON: Titan's own documents nest five deep
at most (events, checkpoint metadata), a Hugging Face config three."""
MAX_DOCUMENT_BYTES = 16 * 2**20
"""Largest whole document read (bytes): configs, checkpoint metadata and calibration files are a
few kilobytes, a stage store's listing of a large model's arrays a few hundred; a larger file is
not one of them and is not read into memory."""

# JSON type names as errors give them, by Python type.
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def open_regular(path: Path | str) -> BinaryIO:
    """``path`` opened for reading bytes, refused unless it is a regular file. The file is opened
    non-blocking and checked on its descriptor, so a FIFO is refused rather than waited on.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (``EINVAL``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def lines_from_end(path: Path | str, block: int = 2**20) -> Iterator[bytes]:
    """The complete lines of the regular file ``path``, last first, without their newlines,
    read backwards ``block`` bytes at a time: a reader after the newest line of some kind reads
    only the file's tail, whatever its size. What follows the last newline (a line a writer has
    not finished) is left out.

    Raises:
        OSError: as :func:`open_regular`, or a read fails.
    """
    with open_regular(path) as file:
        segments = _segments_from_end(file, block)
        next(segments)  # after the last newline: empty, or an unfinished line
        yield from segments


def _segments_from_end(file: BinaryIO, block: int) -> Iterator[bytes]:
    """The newline-separated segments of ``file``, last first (the first one yielded is what
    follows the last newline)."""
    end = file.seek(0, os.SEEK_END)
    head = b""  # the start of the segment that the block read last ends in
    while end > 0:
        start = max(0, end - block)
        file.seek(start)
        parts = (file.read(end - start) + head).split(b"\n")
        head = parts.pop(0)
        yield from reversed(parts)
        end = start
    yield head


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def _label(what: str, path: Path | str) -> str:
    return f"{what} {path}" if what else str(path)


def read_bytes(path: Path | str, what: str = "", limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Args:
        what: the flag or role that named the file (``--config``), put before its path in errors.

    Raises:
        TitanError: it cannot be read, is not a regular file, or holds more than ``limit`` bytes.
    """
    try:
        with open_regular(path) as file:
            data = file.read(limit + 1)
    except OSError as err:
        reason = " ".join(str(err.strerror or err).split())
        raise TitanError(f"{_label(what, path)}: cannot read it ({reason})") from None
    if len(data) > limit:
        raise TitanError(f"{_label(what, path)}: larger than {limit:,} bytes (not such a file)")
    return data


def read_text(path: Path | str, what: str = "", limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (:func:`read_bytes`).

    Raises:
        TitanError: as :func:`read_bytes`, or the bytes are not UTF-8 (names the offset).
    """
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TitanError(
            f"{_label(what, path)}: not UTF-8 text (byte {err.start}: {data[err.start]:#04x})"
        ) from None


def depth_within(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the arrays and objects of ``value`` nest at most ``limit`` deep (iteratively:
    the walk itself cannot overflow the stack)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


# A \uD800-\uDFFF escape that is not half of a pair (Python's json.dumps writes one for a
# surrogate-escaped byte of a file name, which no UTF-8 holds): DuckDB's JSON refuses the line.
_LONE_SURROGATE = re.compile(
    r"(?<!\\)\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<![dD][89abAB][0-9a-fA-F]{2})(?<!\\)\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def without_lone_surrogates(text: str) -> str:
    """``text`` (JSON) with each escape of a lone UTF-16 surrogate made ``\ufffd``, so that
    every reader (Python's json, DuckDB's) reads the line, and reads it alike."""
    if "\\u" not in text:
        return text
    return _LONE_SURROGATE.sub(r"\\ufffd", text)


def parse_json(line: str | bytes) -> Any:
    """The JSON value of one record line, or None when it is not a record's: malformed, or
    nested deeper than :data:`MAX_JSON_DEPTH` (no line, however built, gets past here to stop a
    reader). Bytes that are not UTF-8, and escapes of lone surrogates, read as U+FFFD, as the
    database ingest reads them, so that every reader sees the same events."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    try:
        value = json.loads(without_lone_surrogates(line))
    except (ValueError, RecursionError):
        return None
    if line.count("[") + line.count("{") <= MAX_JSON_DEPTH:
        return value  # too few brackets to nest deeper: the walk is spared
    return value if depth_within(value) else None


def json_type(value: Any) -> str:
    """The JSON type of ``value`` as errors name it (``an array``)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def read_json(
    path: Path | str, what: str = "", expect: type = dict, limit: int = MAX_DOCUMENT_BYTES
) -> Any:
    """The JSON document in the regular file ``path``, of type ``expect`` (``dict``: an object).

    Raises:
        TitanError: as :func:`read_text`, malformed JSON (names line and column), nesting deeper
            than :data:`MAX_JSON_DEPTH`, or a document that is not ``expect``.
    """
    text = read_text(path, what, limit)
    too_deep = TitanError(f"{_label(what, path)}: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise TitanError(
            f"{_label(what, path)}: not JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from None
    except RecursionError:
        raise too_deep from None
    if not depth_within(value):
        raise too_deep
    if not isinstance(value, expect) or isinstance(value, bool) and expect is not bool:
        raise TitanError(
            f"{_label(what, path)}: the document is {json_type(value)}, not "
            f"{_JSON_TYPES.get(expect, expect.__name__)}"
        )
    return value


def read_toml(path: Path | str, what: str = "", limit: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """The TOML document in the regular file ``path``, as tables.

    Raises:
        TitanError: as :func:`read_text`, or malformed TOML (tomllib's reason, with its line).
    """
    text = read_text(path, what, limit)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TitanError(f"{_label(what, path)}: {err}") from None
    except RecursionError:
        raise TitanError(f"{_label(what, path)}: nested too deep") from None


def json_field(
    document: object,  # checked: an error unless a dict
    key: str,
    expect: type | tuple[type, ...],
    where: str,
    default: Any = ...,
) -> Any:
    """``document[key]``, checked to be of the JSON type ``expect`` (``dict``, ``list``, ``str``,
    ``int``; ``float`` accepts integers; a boolean is never a number).

    Args:
        where: the file (and the path of ``document`` in it) that errors name:
            ``"--resume runs/r1/config.json"``.
        default: returned when ``key`` is missing (required when not given).

    Raises:
        TitanError: ``document`` is not an object, ``key`` is missing (and required), or its
            value is of another type.
    """
    if not isinstance(document, dict):
        raise TitanError(f"{where}: expected an object holding {key!r}, got {json_type(document)}")
    if key not in document:
        if default is not ...:
            return default
        raise TitanError(f"{where}: field {key!r} is missing")
    value = document[key]
    kinds = expect if isinstance(expect, tuple) else (expect,)
    accepted = (*kinds, int) if float in kinds else kinds
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, accepted):
        wanted = " or ".join(_JSON_TYPES.get(k, k.__name__) for k in kinds)
        raise TitanError(f"{where}: field {key!r} must be {wanted}, got {json_type(value)}")
    return value
