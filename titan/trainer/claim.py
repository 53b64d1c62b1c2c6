"""The claim on a run dir: one live process writes a run's record at a time.

The writer of a run (process 0) takes an exclusive ``fcntl.flock`` on ``<run dir>/run.lock``
at the very start of ``titan train``, before the tokenizer, and holds it for the life of the
run. A second ``titan train`` with the same ``--run-id``, or a second ``--resume`` of a live
run, fails to take it and is refused with one line, however close in time the two started. The
kernel drops the lock when its holder dies, so a dir left by a crashed run can be resumed. The
lock file holds the holder's pid (for the refusal's message) and is removed when the run ends.

A fresh run that finds ``events.jsonl`` once it holds the lock is refused: the dir holds a run.
A fresh run whose start-up fails (bad input, an interrupt) before ``run_start`` removes the run
dir if this claim created it (:meth:`RunClaim.__exit__`): nothing is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from pathlib import Path
from types import TracebackType

from titan.config import RunOptions
from titan.errors import TitanError
from titan.telemetry.records import EVENTS_FILE, default_runs_root, runs_root_source
from titan.trainer.processes import agreed_run_id

LOCK_FILE = "run.lock"
_ATTEMPTS = 5  # a lock file unlinked under us by an ending run: open it afresh


def refuse_recorded(run_dir: Path) -> None:
    """Refuse a fresh run into ``run_dir`` when it already holds a run's record.

    Raises:
        TitanError: ``run_dir`` has an ``events.jsonl``.
    """
    if (run_dir / EVENTS_FILE).exists():
        raise TitanError(
            f"--run-id {run_dir.name}: {run_dir} already holds a run (use --resume {run_dir})"
        )


def run_dir_of(run: RunOptions, preset: str, resuming: bool) -> Path:
    """The run dir: ``--run-id`` (else an id drawn from the ``preset``'s name, the same on
    every process) under ``--runs-root``. A fresh run's dir must hold no record yet (checked
    early, on every process; the writer's claim checks again).

    Raises:
        TitanError: ``--runs-root`` is not a directory, or a fresh run's dir holds a run.
    """
    root = default_runs_root(run.runs_root)
    if root.exists() and not root.is_dir():
        raise TitanError(f"{runs_root_source(run.runs_root)} {root} is not a directory")
    run_dir = root / (run.run_id or agreed_run_id(preset))
    if not resuming:
        refuse_recorded(run_dir)
    return run_dir


class RunClaim:
    """The exclusive claim on ``run_dir`` (a context manager; a no-op when not ``enabled``, on
    the processes that do not write the record).

    Args:
        run_dir: the run's dir; created when ``fresh`` and missing.
        fresh: a new run (refused if the dir holds a record) rather than a ``--resume``.
        enabled: whether this process claims (the record's writer).
        root_source: what chose the runs root, as an error names it (:func:`~titan.telemetry.
            records.runs_root_source`).

    Raises (on entry):
        TitanError: another live process holds the dir, a fresh run's dir already holds a run,
            or the dir cannot be created.
    """

    def __init__(
        self, run_dir: Path, fresh: bool, enabled: bool = True, root_source: str = "--runs-root"
    ) -> None:
        self.run_dir, self.fresh, self.enabled = Path(run_dir), fresh, enabled
        self.root_source = root_source
        self.created = False
        self._made_parents: list[Path] = []  # the folders above the run dir it made, deepest first
        self.recorded = False  # set once run_start is written: the dir is then never removed
        self._fd: int | None = None

    def __enter__(self) -> RunClaim:
        if not self.enabled:
            return self
        if self.fresh:
            self._make_dir()
        try:
            self._lock()
            if self.fresh:
                refuse_recorded(self.run_dir)
        except BaseException:
            self._release(remove_dir=self.created)
            raise
        return self

    def __exit__(
        self, kind: type | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            self._release(remove_dir=err is not None and self.created and not self.recorded)

    def _make_dir(self) -> None:
        try:
            self._made_parents = _missing_parents(self.run_dir)
            self.run_dir.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(self.run_dir)
            self.created = True
        except FileExistsError:
            if not self.run_dir.is_dir():
                raise TitanError(
                    f"--run-id {self.run_dir.name}: {self.run_dir} is not a directory"
                ) from None
        except OSError as err:
            why = f"cannot create {self.run_dir}: {err.strerror}"
            raise TitanError(f"{self.root_source}: {why}") from None

    def _lock(self) -> None:
        path = self.run_dir / LOCK_FILE
        for _ in range(_ATTEMPTS):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise TitanError(f"cannot claim {self.run_dir}: {err.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _read_pid(fd)
                os.close(fd)
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise TitanError(f"cannot claim {self.run_dir}: {err.strerror}") from None
                raise TitanError(
                    f"{self.run_dir} is in use by a live run{holder}: "
                    + ("choose another --run-id" if self.fresh else "stop it before --resume")
                ) from None
            if _same_file(fd, path):  # not a file the previous holder unlinked as it ended
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
                return
            os.close(fd)
        raise TitanError(f"cannot claim {self.run_dir}: its lock file keeps changing")

    def _release(self, remove_dir: bool) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                (self.run_dir / LOCK_FILE).unlink()  # before the unlock: no one locks it after
            os.close(self._fd)
            self._fd = None
        if remove_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for parent in self._made_parents:
                try:
                    parent.rmdir()  # only when empty
                except OSError:
                    break


def _missing_parents(run_dir: Path) -> list[Path]:
    """The folders above ``run_dir`` that do not exist yet, deepest first."""
    missing = []
    parent = run_dir.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def _read_pid(fd: int) -> str:
    """`` (pid N)`` from a held lock file, or nothing when it cannot be read yet."""
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def _same_file(fd: int, path: Path) -> bool:
    try:
        held, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
