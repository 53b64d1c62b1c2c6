"""Titan: a JAX stack for training Llama-class language models.

The distribution on the package index is ``titan-jax`` (:data:`DISTRIBUTION`); the import names
are ``titan`` and ``tui``. :data:`__version__` is the one place the version is written:
pyproject.toml reads it (setuptools' dynamic version).
"""

from importlib import metadata

DISTRIBUTION = "titan-jax"
__version__ = "0.1.0"


def installed_version() -> str:
    """The installed distribution's version; :data:`__version__` when run from a checkout that is
    not installed. Shown by ``titan --version`` and ``titan-console --version``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return __version__
