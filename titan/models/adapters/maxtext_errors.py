"""MaxText's config and build errors as Titan's one-line errors, and MaxText kept quiet while
its config and model are built.

MaxText (``maxtext`` 0.2.5) logs while it is imported and configured (absl's ``MAXTEXT CONFIG
ERROR`` block, ``maxtext.configs.pyconfig``'s warnings, ``transformers``' advisories);
:func:`quiet` turns Python logging off for that time and restores it. Its errors name a key
(pydantic's ``ValidationError``) or, for a model it cannot build, often none:
:func:`config_error` and :func:`build_error` name the ``--maxtext-set`` keys they can find.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from titan.errors import TitanError

# MaxText's attention kernels for training (maxtext/layers/attention_op.py, apply_attention);
# its others ("paged", "vllm_rpa", ...) serve inference only.
TRAINING_ATTENTION = ("dot_product", "autoselected", "flash", "cudnn_flash_te", "cudnn_flash_jax")
# Those that need an accelerator, and the jax.default_backend() names they run on: "flash" is
# tokamax's Pallas kernels (GPU and TPU), the cudnn_* ones cuDNN's fused attention (NVIDIA GPUs).
ACCELERATOR_ATTENTION = {
    "flash": ("gpu", "cuda", "rocm", "tpu"),
    "cudnn_flash_te": ("gpu", "cuda"),
    "cudnn_flash_jax": ("gpu", "cuda"),
}
# Widths and counts of a MaxText config that must be positive.
POSITIVE_KEYS = (
    "base_emb_dim",
    "base_num_query_heads",
    "base_num_kv_heads",
    "base_mlp_dim",
    "base_num_decoder_layers",
    "head_dim",
    "vocab_size",
)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Python logging off up to ERROR inclusive (``logging.disable``), restored afterwards."""
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


def check_keys(settings: Mapping[str, Any], known: Collection[str]) -> None:
    """Refuse a ``--maxtext-set`` key that is not one of MaxText's config keys (``known``),
    with at most three close matches (``difflib``).

    Raises:
        TitanError: names the first unknown key.
    """
    for key in settings:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise TitanError(f"--maxtext-set {key}: not a MaxText key{hint}")


def _setting(key: str, settings: Mapping[str, str]) -> str:
    return f"{key}={settings[key]}" if key in settings else key


def config_error(err: Exception, settings: Mapping[str, str]) -> TitanError:
    """The one-line error of MaxText rejecting a config: pydantic's first error as
    ``--maxtext-set KEY=VALUE: reason`` (its ``errors()``), else :func:`build_error`."""
    errors_of = getattr(err, "errors", None)  # a pydantic ValidationError's
    errors = errors_of() if callable(errors_of) else []
    if not errors:
        return build_error(err, settings)
    first = errors[0]
    reason = str(first.get("msg", err))
    key = ".".join(str(part) for part in first.get("loc", ()))
    # a check across keys (a pydantic model validator) has no location: the keys it names
    shown = _setting(key, settings) if key else _named(reason, settings)
    return TitanError(f"--maxtext-set {shown}: {reason}")


def _named(reason: str, settings: Mapping[str, str]) -> str:
    """The ``--maxtext-set`` settings that ``reason`` names (a word of it is the key or the
    key without ``base_``), else all of them, as ``KEY=VALUE`` words."""
    words = set(re.findall(r"\w+", reason))
    named = [k for k in settings if k in words or k.removeprefix("base_") in words]
    return " ".join(_setting(k, settings) for k in named or settings)


def build_error(err: Exception, settings: Mapping[str, str]) -> TitanError:
    """The one-line error of MaxText failing to build a model: its first line, after the
    ``--maxtext-set`` settings it names (:func:`_named`)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reason = lines[0] if lines else type(err).__name__
    return TitanError(
        f"--maxtext-set {_named(reason, settings)}: MaxText cannot build the model: {reason}"
    )


def check_shape(config: Any, settings: Mapping[str, str]) -> None:
    """Refuse what MaxText would only fail on while building or running the model: a width or
    count that is not positive (:data:`POSITIVE_KEYS`), query heads that are not a multiple of
    the key/value heads (grouped-query attention), an attention kernel that does not train.

    Raises:
        TitanError: names the ``--maxtext-set`` key.
    """
    for key in POSITIVE_KEYS:
        if not getattr(config, key) > 0:
            raise TitanError(f"--maxtext-set {key}={getattr(config, key)}: must be > 0")
    if config.num_query_heads % config.num_kv_heads:
        raise TitanError(
            f"--maxtext-set base_num_query_heads={config.base_num_query_heads}: not a multiple "
            f"of base_num_kv_heads={config.base_num_kv_heads} (grouped-query attention)"
        )
    if config.attention not in TRAINING_ATTENTION:
        raise TitanError(
            f"--maxtext-set attention={config.attention}: not one of MaxText's attention "
            f"kernels for training ({', '.join(TRAINING_ATTENTION)})"
        )


def check_attention_backend(attention: str, backend: str) -> None:
    """Refuse a MaxText attention kernel (``--maxtext-set attention=...``) that cannot run on
    ``backend`` (:data:`ACCELERATOR_ATTENTION`), before MaxText fails deep in its first step.

    Raises:
        TitanError: names the setting, where it runs and the kernel that runs everywhere.
    """
    runs_on = ACCELERATOR_ATTENTION.get(attention)
    if runs_on is not None and backend not in runs_on:
        raise TitanError(
            f"--maxtext-set attention={attention}: needs a GPU"
            + (" or TPU" if "tpu" in runs_on else "")
            + f", not {backend} (attention=dot_product runs everywhere)"
        )
