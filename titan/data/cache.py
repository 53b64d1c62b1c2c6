"""Where tokenizers and token streams are cached: ``$TITAN_CACHE``, or ``~/.cache/titan``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$TITAN_CACHE``, or ``~/.cache/titan``."""
    return Path(os.environ.get("TITAN_CACHE") or Path.home() / ".cache" / "titan")
