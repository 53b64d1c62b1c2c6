"""Titan: a JAX stack for training Llama-class language models.

The distribution on the package index is ``titan-jax`` (:data:`DISTRIBUTION`); the import names
are ``titan`` and ``tui``. :data:`__version__` is the one place the version is written:
pyproject.toml reads it (setuptools' dynamic version).
"""

DISTRIBUTION = "titan-jax"
__version__ = "0.1.0"
