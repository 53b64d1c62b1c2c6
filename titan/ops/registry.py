"""Provider registry: which implementation serves each semantic operator.

A provider registers an implementation of an op under a name, with a priority, a capability
check (``supports(backend, *args, **kwargs)``, truthy when it can serve the call; it may return an
:class:`Unsupported` carrying the reason) and optionally a preference (``prefer``, same
arguments: where it is known to be the fastest choice). At trace time :class:`OpTable` picks, for
each call, the highest-priority provider that supports the backend and the call's arguments
(shapes, dtypes, features such as segment ids) and prefers them, falling back to ``native``.
An override (``{"attention": "native"}``, from the config or
``TITAN_OPS="attention=native,rms_norm=native"``) forces one provider; if it cannot serve the
call that is an error, never a silent fallback.
The table records which provider served each op, for the ``run_start`` event.

Implementations and checks may be registered as ``"module:function"`` references, imported on
first use: registering the providers (on import of :mod:`titan.ops`) then imports no JAX, so the
CLI starts quickly.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from titan.errors import TitanError
from titan.parsing import parse_assignments

OPS = ("attention", "rms_norm", "rope", "swiglu", "cross_entropy", "modulate", "patch_embed")
NATIVE = "native"
# A function, or "module:function" imported on first use.
Ref = Callable[..., Any] | str


class Unsupported:
    """A falsy answer of a capability check that says why the provider cannot serve a call."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Unsupported({self.reason!r})"


def _always(backend: str, *args: Any, **kwargs: Any) -> bool:
    return True


def load(ref: Ref) -> Callable[..., Any]:
    """The function a :data:`Ref` names (imported on first use)."""
    return ref if callable(ref) else _imported(ref)


@functools.cache
def _imported(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Provider:
    """One implementation of one op.

    Attributes:
        backends: the ``jax.default_backend()`` names it can run on at all (None: every backend);
            asking for it elsewhere fails when the :class:`OpTable` is built, before tracing.
        prefer: where the registry may choose it unasked (None: wherever it supports the call);
            a forced provider needs only ``supports``.
    """

    op: str
    name: str
    impl: Ref
    priority: int
    supports: Ref = _always
    backends: tuple[str, ...] | None = None
    prefer: Ref | None = None

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Call the implementation."""
        return load(self.impl)(*args, **kwargs)

    def serves(self, backend: str, *args: Any, **kwargs: Any) -> Any:
        """The capability check's answer (truthy, or falsy with a reason) for this call."""
        return load(self.supports)(backend, *args, **kwargs)

    def prefers(self, backend: str, *args: Any, **kwargs: Any) -> bool:
        """Whether the registry may choose it for this call unasked."""
        return self.prefer is None or load(self.prefer)(backend, *args, **kwargs)


_PROVIDERS: dict[str, dict[str, Provider]] = {op: {} for op in OPS}


def register(
    op: str,
    name: str,
    impl: Ref,
    *,
    priority: int,
    supports: Ref = _always,
    backends: tuple[str, ...] | None = None,
    prefer: Ref | None = None,
) -> None:
    """Register ``impl`` as provider ``name`` of ``op``. Higher ``priority`` is tried first; a
    priority below ``native``'s 0 makes the provider opt-in: ``native`` serves every call, so
    such a provider is reached only when forced.

    Raises:
        ValueError: for an op that is not one of :data:`OPS`.
    """
    if op not in _PROVIDERS:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}")
    _PROVIDERS[op][name] = Provider(op, name, impl, priority, supports, backends, prefer)


def providers(op: str) -> list[Provider]:
    """Providers of ``op``, highest priority first."""
    return sorted(_PROVIDERS[op].values(), key=lambda p: -p.priority)


def provider(op: str, name: str) -> Provider:
    """The provider ``name`` of ``op`` (KeyError if there is none)."""
    return _PROVIDERS[op][name]


def runs_on(p: Provider, backend: str) -> bool:
    """Whether ``p`` is built for ``backend`` at all (before any capability check)."""
    return p.backends is None or backend in p.backends


def parse_overrides(text: str, source: str = "TITAN_OPS") -> dict[str, str]:
    """Parse ``"attention=native,rms_norm=native"`` into a mapping.

    Args:
        source: where the text comes from (``TITAN_OPS``, ``--ops``), named in errors.

    Raises:
        TitanError: on a malformed entry, an op named twice, an unknown op or an unknown provider.
    """
    overrides = parse_assignments(text, source, shape="op=provider")
    check_overrides(overrides, source=source)
    return overrides


def check_overrides(
    overrides: Mapping[str, str], backend: str | None = None, source: str = "ops override"
) -> None:
    """Raises TitanError naming ``source`` (``TITAN_OPS``, ``--ops``) and an unknown op or
    provider in ``overrides``, or (with ``backend``) a provider that cannot run on that backend
    at all."""
    for op, name in overrides.items():
        if op not in _PROVIDERS:
            raise TitanError(f"{source}: unknown op {op!r}; ops are {', '.join(OPS)}")
        if name not in _PROVIDERS[op]:
            known = ", ".join(p.name for p in providers(op))
            raise TitanError(f"{source}: unknown provider {name!r} for op {op}; known: {known}")
        if backend is not None and not runs_on(_PROVIDERS[op][name], backend):
            here = ", ".join(p.name for p in providers(op) if runs_on(p, backend))
            runs = ", ".join(_PROVIDERS[op][name].backends or ())
            raise TitanError(
                f"unknown provider {name!r} for op {op} on backend {backend} (it runs on "
                f"{runs}); providers here: {here}"
            )


@dataclass
class OpTable:
    """Dispatches semantic ops to providers for one backend; records who served what.

    Args:
        backend: ``jax.default_backend()`` of the devices the model runs on (cpu, gpu, tpu).
        overrides: op -> provider name, forced (an error if that provider cannot serve a call).
        from_env: add the overrides of ``TITAN_OPS`` (those given here win).

    Raises:
        TitanError: an override names an unknown op or provider, or one not built for ``backend``.
    """

    backend: str
    overrides: Mapping[str, str] = field(default_factory=dict)
    served: dict[str, str] = field(default_factory=dict)
    from_env: bool = True

    def __post_init__(self) -> None:
        if self.from_env:
            env = parse_overrides(os.environ.get("TITAN_OPS", ""))
            self.overrides = {**env, **self.overrides}
        check_overrides(self.overrides, self.backend)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` with the provider :meth:`choose` picks (at trace time)."""
        chosen = self.choose(op, *args, **kwargs)
        self.served[op] = chosen.name
        return chosen.run(*args, **kwargs)

    def choose(self, op: str, *args: Any, **kwargs: Any) -> Provider:
        """The provider that serves ``op`` for these arguments (arrays or ShapeDtypeStructs).

        Raises:
            TitanError: the forced provider of ``op`` cannot serve these arguments.
        """
        forced = self.overrides.get(op)
        if forced is not None:
            chosen = _PROVIDERS[op][forced]
            answer = chosen.serves(self.backend, *args, **kwargs)
            if not answer:
                reason = f": {answer.reason}" if isinstance(answer, Unsupported) else ""
                raise TitanError(
                    f"provider {forced!r} was asked for op {op} but cannot serve it on backend "
                    f"{self.backend} with these arguments{reason}"
                )
            return chosen
        for candidate in providers(op):
            if candidate.serves(self.backend, *args, **kwargs) and candidate.prefers(
                self.backend, *args, **kwargs
            ):
                return candidate
        return _PROVIDERS[op][NATIVE]
