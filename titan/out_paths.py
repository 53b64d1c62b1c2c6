"""Checks on a new output directory or file (``--out``) before anything is written there, so
that a bad path fails at once in one line naming the flag and the path given, not a temporary
path or an error from a writer's background thread. Writability is tried, not only read from the
permission bits: a probe file is made and removed in the nearest existing directory."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from titan.errors import TitanError

CHECKPOINT_DIR = "checkpoints"  # a run's checkpoints folder (titan.checkpoint.checkpointer)


def path_argument(text: str) -> str:
    """The ``type`` of a path option (every ``--out``, ``--config``): the path as given, unless
    it is empty (which an unset default would otherwise stand in for, or which would name the
    current directory).

    Raises:
        argparse.ArgumentTypeError: an empty or all-blank path.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name a file or directory")
    return text


def path_of(text: str) -> Path:
    """The ``type`` of a path option read as a :class:`~pathlib.Path` (``--from``,
    ``--runs-root``): :func:`path_argument`'s check, then the path.

    Raises:
        argparse.ArgumentTypeError: an empty or all-blank path.
    """
    return Path(path_argument(text))


class GivenOnce(argparse.Action):
    """An option's ``action`` that refuses the option given twice (argparse keeps the last, and
    would drop the first without a word)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            raise argparse.ArgumentError(self, "given twice; give it once")
        setattr(namespace, self.dest, values)


def check_new_dir(out: Path, flag: str = "--out") -> Path:
    """``out`` made absolute, after checking it can be created as a new directory.

    Raises:
        TitanError: ``out`` exists, or its nearest existing ancestor is not a writable
            directory (one line naming ``flag`` and ``out``).
    """
    out = Path(out).absolute()
    if out.exists():
        raise TitanError(f"{flag} {out} exists already; give a new path")
    _check_parent(out, flag)
    return out


def check_file(out: Path, flag: str = "--out") -> Path:
    """``out`` made absolute, after checking a file can be written there (an existing file is
    replaced; missing parent directories are created by the writer).

    Raises:
        TitanError: ``out`` is a directory or another file than a regular one (a device, FIFO
            or socket), or its nearest existing ancestor is not a writable directory (one line
            naming ``flag`` and ``out``).
    """
    out = Path(out).absolute()
    if out.is_dir():
        raise TitanError(f"{flag} {out}: is a directory (give the file's path)")
    if out.exists() and not out.is_file():
        raise TitanError(f"{flag} {out}: is not a regular file (a device, FIFO or socket)")
    _check_parent(out, flag)
    return out


def check_dir(out: Path, flag: str = "--out") -> Path:
    """``out`` made absolute, after checking files can be written in it (it exists and is a
    writable directory, or can be created).

    Raises:
        TitanError: ``out`` is not a directory, or cannot be written or created (one line
            naming ``flag`` and ``out``).
    """
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise TitanError(f"{flag} {out}: is not a directory")
    _check_parent(out / "probe", flag)
    return out


def check_outside_run(
    out: Path, run_dir: Path, own: Path | None = None, flag: str = "--out"
) -> None:
    """Refuse an output that would replace a file the run wrote (its ``events.jsonl``, its
    config, a checkpoint's file) or lie in its checkpoints folder (a folder there is taken for a
    checkpoint, and deleted with the run's old ones). Links are followed: a link to the run's
    ``events.jsonl`` is that file. ``own``: the command's own output in the run dir (its
    default), which it may replace.

    Raises:
        TitanError: one line naming ``flag`` and ``out``.
    """
    whole, run = Path(out).resolve(), Path(run_dir).resolve()
    if whole.is_relative_to(run / CHECKPOINT_DIR):
        raise TitanError(
            f"{flag} {out}: is inside the run's {CHECKPOINT_DIR}/; give a path outside it"
        )
    theirs = whole.is_file() and (own is None or whole != Path(own).resolve())
    if theirs and whole.is_relative_to(run):
        raise TitanError(
            f"{flag} {out}: is a file of the run {run_dir} (an output never replaces the "
            "run's own files); give a path outside it"
        )


def _check_parent(out: Path, flag: str) -> None:
    ancestor = out.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise TitanError(f"{flag} {out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise TitanError(f"{flag} {out}: {ancestor} is not writable")
    try:  # the permission bits say yes in /proc or /sys to root: make (and remove) a file there
        probe, name = tempfile.mkstemp(prefix=".titan-probe-", dir=ancestor)
    except OSError as err:
        raise TitanError(f"{flag} {out}: {ancestor} is not writable ({err.strerror})") from None
    os.close(probe)
    os.unlink(name)


def make_dir(path: Path, out: Path, flag: str = "--out") -> None:
    """``mkdir -p path`` (``out`` or a staging sibling of it).

    Raises:
        TitanError: the directory cannot be made (one line naming ``flag`` and ``out``).
    """
    try:
        path.mkdir(parents=True)
    except OSError as err:
        raise TitanError(f"{flag} {out}: cannot create it ({err.strerror})") from None


@contextmanager
def removed_on_failure(directory: Path, ours: Callable[[str], bool]) -> Iterator[None]:
    """The block writes into ``directory`` the entries whose names ``ours`` accepts; when it
    fails (a stop signal among the failures), what it added is removed: the directory itself
    when the block made it, else those of its entries that were not there before (an entry it
    replaced in place stays, and so does what another writer added meanwhile: a run's new
    checkpoint, another export)."""
    created = not directory.exists()
    before = set() if created else _entries(directory)
    try:
        yield
    except BaseException:
        new = _entries(directory) - before
        added = [directory] if created else [path for path in new if ours(path.name)]
        for path in added:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):  # never made (its parent is a file, say)
                    path.unlink()
        raise


def _entries(directory: Path) -> set[Path]:
    """The entries of ``directory``; none when it cannot be listed."""
    try:
        return set(directory.iterdir())
    except OSError:
        return set()


def remove_orphaned_stagings(folder: Path, prefix: str) -> None:
    """Remove the entries of ``folder`` named ``<prefix><pid>`` whose process is gone: the
    stagings a killed command left (a live process's is kept)."""
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            pid = path.name.removeprefix(prefix)
            if path.name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts: signalling it is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
