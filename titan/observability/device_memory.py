"""Device memory as the backend reports it: the usable pool and the peak of each device
(``jax.Device.memory_stats()``), and the memory analysis of a compiled program.

Figures come only from the backend: where it reports none (XLA:CPU's ``memory_stats()`` is
None), the readers return None and nothing is recorded. This module takes devices and compiled
programs as arguments and imports no JAX itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# CompiledMemoryStats attribute -> the key recorded in the ``compile`` event (bytes per device).
_ANALYSIS_KEYS = {
    "argument_size_in_bytes": "argument_bytes",
    "output_size_in_bytes": "output_bytes",
    "alias_size_in_bytes": "alias_bytes",
    "temp_size_in_bytes": "temp_bytes",
    "generated_code_size_in_bytes": "generated_code_bytes",
}


def _stats(devices: Iterable[Any], key: str) -> list[int]:
    values = []
    for device in devices:
        stats = device.memory_stats()
        if stats and isinstance(stats.get(key), int):
            values.append(stats[key])
    return values


def usable_bytes(devices: Sequence[Any]) -> int | None:
    """The smallest ``bytes_limit`` (the allocator's pool: what XLA may use) of ``devices``, or
    None when the backend reports none."""
    return min(_stats(devices, "bytes_limit"), default=None)


def peak_bytes(devices: Sequence[Any]) -> int | None:
    """The largest ``peak_bytes_in_use`` (the allocator's peak since the process started) of
    ``devices``, or None when the backend reports none."""
    return max(_stats(devices, "peak_bytes_in_use"), default=None)


def program_memory(compiled: Any) -> dict[str, int] | None:
    """XLA's memory analysis of a compiled program (``jax.stages.Compiled``), per device, as
    the ``compile`` event's ``memory``; None when the backend gives none."""
    try:
        analysis = compiled.memory_analysis()
    except NotImplementedError:
        return None
    if analysis is None:
        return None
    return {key: int(getattr(analysis, attr)) for attr, key in _ANALYSIS_KEYS.items()}


def largest(analyses: Iterable[dict[str, int] | None]) -> dict[str, int] | None:
    """Each figure's largest value over several programs' analyses (None when none has one):
    the programs of a pipeline stage run one at a time."""
    known = [a for a in analyses if a is not None]
    if not known:
        return None
    return {key: max(a[key] for a in known) for key in known[0]}
