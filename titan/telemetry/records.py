"""Run records: the append-only ``events.jsonl`` of a run and its readers.

Layout of a run dir ``<runs root>/<run id>/``:

- ``events.jsonl``: one JSON object per line, flushed per event: the typed events of
  :mod:`titan.telemetry.events`, documented field by field in ``docs/events.md``.
- ``profile/``: the JAX profiler trace of ``--profile-steps`` (:mod:`titan.telemetry.profile`).
- ``report/``: ``titan report``'s Markdown report and figures (:mod:`titan.analysis.report`).
- ``config.json``: the run's options and model shape.
- ``tokenizer.model``: the sentencepiece model the run used.
- ``checkpoints/``: orbax checkpoints.

This module imports neither JAX nor Textual: the console reads records through it.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from titan.data.cache import naming
from titan.errors import TitanError
from titan.reading import open_regular, parse_json
from titan.telemetry.events import SCHEMA_VERSION, Event, parse_events

EventT = TypeVar("EventT", bound=Event)  # an event type: emit returns what it was given

SCHEMA = SCHEMA_VERSION
EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.json"


def default_runs_root(explicit: str = "") -> Path:
    """The runs root: ``explicit`` if given, else ``$TITAN_RUNS``, else ``./runs``."""
    return Path(explicit or os.environ.get("TITAN_RUNS") or "runs")


def runs_root_source(explicit: str = "") -> str:
    """What chose the runs root of :func:`default_runs_root`, as errors name it:
    ``--runs-root`` when ``explicit`` is given (or nothing is set), else ``$TITAN_RUNS``."""
    return "$TITAN_RUNS" if not explicit and os.environ.get("TITAN_RUNS") else "--runs-root"


def check_runs_root(root: Path, *, created: bool = False) -> Path:
    """``root`` after checking it is a runs root: a directory, or (``created``: one the first
    run creates) a path whose nearest existing ancestor is a directory.

    Raises:
        TitanError: ``root`` exists and is not a directory, or does not exist (when not
            ``created``; else when its nearest existing ancestor is not a directory).
    """
    if root.exists() and not root.is_dir():
        raise TitanError(f"runs root {root} is not a directory")
    if not root.exists() and not created:
        raise TitanError(f"runs root {root} does not exist (give RUNS_ROOT or set $TITAN_RUNS)")
    ancestor = root.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise TitanError(f"runs root {root}: {ancestor} is not a directory")
    return root


def new_run_id(preset: str) -> str:
    """A fresh run id: ``<preset>-<UTC yyyymmdd-hhmmss>-<4 hex>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{preset}-{stamp}-{secrets.token_hex(2)}"


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _ends_mid_line(path: Path) -> bool:
    """Whether a non-empty file's last byte is not a newline."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _open_appending(path: Path) -> int:
    """A descriptor of ``path`` (created if missing) for appending, refused unless it is a
    regular file: opened non-blocking, so a FIFO with no reader fails at once (ENXIO) instead
    of waiting for one.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (``EINVAL``).
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class RunRecord:
    """Appends events to a run's ``events.jsonl``, one line per event, each written to the OS
    whole or not at all.

    The file is opened for appending, so a resumed run continues the same record; a torn last
    line (a process killed mid-write) is ended first, so the next event starts a line of its
    own and readers skip only the torn one. A write that fails (a full disk) is cut back off
    the file: the record never ends in a torn line of this writer's.

    Raises:
        OSError: ``events.jsonl`` cannot be opened or its torn last line ended.
    """

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.path = run_dir / EVENTS_FILE
        self._fd: int | None = _open_appending(self.path)
        self._lock = threading.Lock()
        try:
            if _ends_mid_line(self.path):
                self._append(b"\n")
        except OSError:
            self.close()
            raise

    def emit(self, event: EventT) -> EventT:
        """Write one event, stamped with the current ``time`` and this record's ``run_id``, as
        one line handed to the OS (non-finite numbers, e.g. a diverged loss, are written as
        null; thread-safe: the watchdog writes from its own thread). Returns the event as
        written.

        Raises:
            OSError: the line could not be written (then none of it is in the file).
        """
        event = dataclasses.replace(event, time=time.time(), run_id=self.run_id)
        line = json.dumps(_finite(event.to_json()), default=str, allow_nan=False) + "\n"
        with self._lock:
            self._append(line.encode("utf-8"))
        return event

    def _append(self, data: bytes) -> None:
        """Append ``data`` whole; on a failed or short write, cut the file back to its end
        before (ftruncate needs no free space) and raise the error naming the file."""
        fd = self._fd
        if fd is None:  # closed: an OSError, as for any write that cannot be done
            raise OSError(errno.EBADF, "the record is closed", str(self.path))
        end = os.fstat(fd).st_size
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError as err:
            os.ftruncate(fd, end)
            raise OSError(err.errno, err.strerror, str(self.path)) from None

    def close(self) -> None:
        """Close the file (again is a no-op)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


DISK_FULL = "disk full (ENOSPC)"


class DiskFull(Exception):
    """A write found the disk full; the message is :func:`disk_full`'s line."""


def disk_full(err: BaseException) -> str | None:
    """One line for a write that found the disk full (``ENOSPC`` in ``err`` or the errors it
    came from), naming the path when the error does; None for any other error. Libraries that
    wrap the OS error (orbax, tensorstore) keep its text, ``No space left on device``."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, DiskFull):
            return str(item)
        if isinstance(item, OSError) and item.errno == errno.ENOSPC:
            where = f": cannot write {item.filename}" if item.filename else ""
            return f"{DISK_FULL}{where}"
        text = str(item)
        if os.strerror(errno.ENOSPC) in text:
            paths = re.findall(r'"(/[^"]+)"', text)  # tensorstore quotes the file it wrote
            where = f"cannot write {paths[-1]}" if paths else text.strip().splitlines()[0]
            return f"{DISK_FULL}: {where}"
        pending += [item.__cause__, item.__context__, *getattr(item, "exceptions", ())]
    return None


# One read of :meth:`EventTail.iter_to_end`.
WHOLE_READ_SLICE_BYTES = 8 << 20


@dataclass
class EventTail:
    """Incremental reader of an ``events.jsonl`` that another process is appending to.

    Each :meth:`read_new` returns the complete lines added since the last call. A partial last
    line (the writer is mid-write, or crashed mid-line) is left for the next call; a line that is
    complete but not a JSON object with ``type`` and ``time`` is skipped and counted in
    ``bad_lines``. A file that cannot be read (missing, unreadable, a directory) gives no lines;
    ``error`` then says why (None once a read succeeds).
    """

    path: Path
    offset: int = 0
    bad_lines: int = 0
    error: str | None = None
    # The partial last line, in the pieces read: joined once its end is read, so that a line
    # read in many slices costs its length once (not once per slice).
    _pending: list[bytes] = field(default_factory=list, repr=False)

    def read_new(self, max_bytes: int = -1) -> list[dict[str, Any]]:
        """The complete lines appended since the last call, as JSON objects; with
        ``max_bytes`` >= 0, of at most that many bytes read (a reader that keeps up with a fast
        writer in bounded slices: the rest is read by the next calls)."""
        try:
            with open_regular(self.path) as f:
                f.seek(self.offset)
                chunk = f.read(max_bytes)
        except OSError as err:
            self.error = f"{type(err).__name__}: {err.strerror or err}"
            return []
        self.error = None
        self.offset += len(chunk)
        end = chunk.rfind(b"\n")
        if end < 0:
            self._pending.append(chunk)
            return []
        lines = b"".join([*self._pending, chunk[:end]]).split(b"\n")
        self._pending = [chunk[end + 1 :]]
        events, bad = _objects(lines)
        self.bad_lines += bad
        return events

    @property
    def pending_bytes(self) -> int:
        """Bytes of the partial last line read so far (0 when the last read ended a line)."""
        return sum(map(len, self._pending))

    def iter_to_end(
        self, progress: Callable[[int, int], None] | None = None
    ) -> Iterator[dict[str, Any]]:
        """:meth:`read_new` up to the file's end as it is now, in slices of
        :data:`WHOLE_READ_SLICE_BYTES` (one slice's objects are held at a time), calling
        ``progress(MiB read, MiB in all)`` after each (a record of hundreds of MB takes a
        minute to parse)."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = 0  # the read below says why in ``error``
        while True:  # one read at least, which opens the file: an unreadable one sets error
            before = self.offset
            left = size - before  # none (a size of 0, as /proc files say): read to the end
            yield from self.read_new(min(WHOLE_READ_SLICE_BYTES, left) if left > 0 else -1)
            if progress is not None:
                progress(self.offset >> 20, size >> 20)
            if self.offset >= size or self.offset == before:
                break

    def check_read(self) -> None:
        """Raise when the last read failed, for a command that reads a run's record whole.

        Raises:
            TitanError: the file could not be read (names the run dir and the reason).
        """
        if self.error is not None:
            raise TitanError(
                f"RUN_DIR {self.path.parent}: cannot read {EVENTS_FILE} ({self.error})"
            )

    def read_new_events(self, max_bytes: int = -1) -> list[Event]:
        """:meth:`read_new`, each object parsed by :func:`~titan.telemetry.events.
        parse_event`; an object that is not an event (e.g. a non-numeric ``time``) is skipped
        and counted in ``bad_lines``. Unknown types come back as ``UnknownEvent``."""
        events, skipped = parse_events(self.read_new(max_bytes))
        self.bad_lines += skipped
        return events


def _objects(lines: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    """(the lines that are JSON objects with ``type`` and ``time``, parsed; how many are not)."""
    events = []
    for line in lines:
        event = parse_json(line)
        if isinstance(event, dict) and {"type", "time"} <= event.keys():
            events.append(event)
    return events, len(lines) - len(events)


def read_last_events(path: Path, end: int, max_bytes: int) -> tuple[int, list[Event]]:
    """The events of the complete lines among the ``max_bytes`` bytes of a record that end at
    offset ``end``: what a reader far behind its writer shows first. A line cut by the start of
    that window, a torn line at ``end`` and lines that are not events are left out.

    Returns:
        (the offset where the first line read starts, its events in file order); ``(end, [])``
        when no whole line fits in the window or the file cannot be read.
    """
    start = max(0, end - max_bytes)
    try:
        with open_regular(path) as f:
            f.seek(start)
            data = f.read(end - start)
    except OSError:
        return end, []
    if start > 0:
        cut = data.find(b"\n") + 1
        data, start = data[cut:], start + cut
    lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]
    if not lines:
        return end, []
    return start, parse_events(_objects(lines)[0])[0]


def read_first_events(path: Path, max_bytes: int) -> list[dict[str, Any]]:
    """The events of the complete lines among the first ``max_bytes`` bytes of a record, as the
    JSON objects written; lines that are not events are left out.

    Raises:
        OSError: the record cannot be read (missing, not a regular file: a FIFO is refused,
            never waited on).
    """
    with open_regular(path) as f:
        data = f.read(max_bytes)
    return _objects(data.split(b"\n")[:-1])[0]


def run_record_tail(run_dir: Path) -> EventTail:
    """A reader of ``run_dir``'s ``events.jsonl`` from its start, for a command that reads a
    run's record whole (``titan report``, ``titan export``; :meth:`EventTail.check_read` after
    reading). A name that is there but no regular file (a FIFO, a directory, a dangling link)
    is for the read to refuse, with its reason.

    Raises:
        TitanError: ``run_dir`` is not a directory, or holds no ``events.jsonl``.
    """
    if not run_dir.is_dir():
        raise TitanError(f"RUN_DIR {run_dir} is not a directory")
    path = run_dir / EVENTS_FILE
    if not os.path.lexists(path):
        raise TitanError(f"RUN_DIR {run_dir}: no {EVENTS_FILE} there (not a run dir)")
    return EventTail(path)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """All complete events of a run as the JSON objects written, in order (a torn last line is
    ignored)."""
    return EventTail(Path(run_dir) / EVENTS_FILE).read_new()


def load_events(run_dir: Path) -> list[Event]:
    """All complete events of a run, typed (:meth:`EventTail.read_new_events`), in order."""
    return EventTail(Path(run_dir) / EVENTS_FILE).read_new_events()


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename, so readers never see half
    (and a failed write leaves ``path`` as it was and no temporary file).

    Raises:
        OSError: the write or the rename failed (naming the temporary file).
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with naming(tmp):  # a full disk's error names the file
            tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk, a signal: no half-written temporary file stays
        tmp.unlink(missing_ok=True)
        raise
