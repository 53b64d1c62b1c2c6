"""Where tokenizers and token streams are cached: ``$TITAN_CACHE``, or ``~/.cache/titan``."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``$TITAN_CACHE``, or ``~/.cache/titan``."""
    return Path(os.environ.get("TITAN_CACHE") or Path.home() / ".cache" / "titan")


def writable_dir(path: Path) -> Path:
    """``path``, created if need be, checked writable before any work meant for it is done.

    Raises:
        OSError: it cannot be created, or cannot be written (a read-only file system: EROFS;
            no permission: EACCES), naming it.
    """
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        code = errno.EROFS if os.statvfs(path).f_flag & os.ST_RDONLY else errno.EACCES
        raise OSError(code, os.strerror(code), str(path))
    return path


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Name ``path`` in an :class:`OSError` raised inside that names no file (a ``write`` that
    found the disk full names none), so that the error line says which file system to free.

    Raises:
        OSError: what the block raised, with ``path`` as its file name when it had none.
    """
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from None
