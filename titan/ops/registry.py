"""Provider registry: which implementation serves each semantic operator.

A provider registers an implementation of an op under a name, with a priority and a capability
check (``supports(backend, *args, **kwargs) -> bool``). At trace time :class:`OpTable` picks, for
each call, the highest-priority provider whose check accepts the backend and the call's arguments
(shapes, dtypes, features such as segment ids), falling back to ``native``. An override
(``{"attention": "native"}``, from the config or ``TITAN_OPS="attention=native,rms_norm=native"``)
forces one provider; if it cannot serve the call that is an error, never a silent fallback.
The table records which provider served each op, for the ``run_start`` event.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from titan.errors import TitanError

OPS = ("attention", "rms_norm", "rope", "swiglu", "cross_entropy")
NATIVE = "native"


def _always(backend: str, *args: Any, **kwargs: Any) -> bool:
    return True


@dataclass(frozen=True)
class Provider:
    """One implementation of one op."""

    op: str
    name: str
    impl: Callable[..., Any]
    priority: int
    supports: Callable[..., bool] = _always


_PROVIDERS: dict[str, dict[str, Provider]] = {op: {} for op in OPS}


def register(
    op: str,
    name: str,
    impl: Callable[..., Any],
    *,
    priority: int,
    supports: Callable[..., bool] = _always,
) -> None:
    """Register ``impl`` as provider ``name`` of ``op``. Higher ``priority`` is tried first.

    Raises:
        ValueError: for an op that is not one of :data:`OPS`.
    """
    if op not in _PROVIDERS:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}")
    _PROVIDERS[op][name] = Provider(op, name, impl, priority, supports)


def providers(op: str) -> list[Provider]:
    """Providers of ``op``, highest priority first."""
    return sorted(_PROVIDERS[op].values(), key=lambda p: -p.priority)


def parse_overrides(text: str) -> dict[str, str]:
    """Parse ``"attention=native,rms_norm=native"`` into a mapping.

    Raises:
        TitanError: on a malformed entry, an unknown op or an unknown provider.
    """
    overrides = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        op, sep, name = entry.partition("=")
        if not sep:
            raise TitanError(f"TITAN_OPS entry {entry!r} must look like op=provider")
        overrides[op.strip()] = name.strip()
    check_overrides(overrides)
    return overrides


def check_overrides(overrides: Mapping[str, str]) -> None:
    """Raises TitanError naming an unknown op or provider in ``overrides``."""
    for op, name in overrides.items():
        if op not in _PROVIDERS:
            raise TitanError(f"unknown op {op!r} in ops override; ops are {', '.join(OPS)}")
        if name not in _PROVIDERS[op]:
            known = ", ".join(p.name for p in providers(op))
            raise TitanError(f"unknown provider {name!r} for op {op}; known: {known}")


@dataclass
class OpTable:
    """Dispatches semantic ops to providers for one backend; records who served what.

    Args:
        backend: ``jax.default_backend()`` of the devices the model runs on (cpu, gpu, rocm, tpu).
        overrides: op -> provider name, forced (an error if that provider cannot serve a call).
    """

    backend: str
    overrides: Mapping[str, str] = field(default_factory=dict)
    served: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        env = parse_overrides(os.environ.get("TITAN_OPS", ""))
        self.overrides = {**env, **self.overrides}
        check_overrides(self.overrides)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` with the provider chosen for these arguments (chosen at trace time)."""
        provider = self._choose(op, args, kwargs)
        self.served[op] = provider.name
        return provider.impl(*args, **kwargs)

    def _choose(self, op: str, args: tuple, kwargs: dict) -> Provider:
        forced = self.overrides.get(op)
        if forced is not None:
            provider = _PROVIDERS[op][forced]
            if not provider.supports(self.backend, *args, **kwargs):
                raise TitanError(
                    f"provider {forced!r} was asked for op {op} but cannot serve it on backend "
                    f"{self.backend} with these arguments"
                )
            return provider
        for provider in providers(op):
            if provider.supports(self.backend, *args, **kwargs):
                return provider
        return _PROVIDERS[op][NATIVE]
