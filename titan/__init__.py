"""Titan: a JAX stack for training Llama-class language models.

The distribution on the package index is ``titan-jax`` (:data:`DISTRIBUTION`); the import names
are ``titan`` and ``tui``. :data:`__version__` is the one place the version is written:
pyproject.toml reads it (setuptools' dynamic version).
"""

import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "titan-jax"
__version__ = "0.1.0"


def cli_command(*args: str) -> list[str]:
    """The command line of the ``titan`` CLI in a child process: this interpreter running
    ``titan.cli`` with ``args``, with ``-P`` (Python 3.11's safe path: the working directory is
    not put first on ``sys.path``) unless this package is the working directory's own (a
    checkout run without installing), so that a ``titan/`` folder or ``titan.py`` there never
    shadows the package that runs."""
    here = Path(__file__).resolve().parent.parent
    safe = [] if here == Path.cwd().resolve() else ["-P"]
    return [sys.executable, *safe, "-m", "titan.cli", *args]


def installed_version() -> str:
    """The installed distribution's version; :data:`__version__` when run from a checkout that is
    not installed. Shown by ``titan --version`` and ``titan-console --version``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return __version__
