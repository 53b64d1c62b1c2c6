"""What the trainer compiles: JAX's persistent compilation cache, and the programs compiled twice.

The cache (``--compilation-cache``, on by default) lives in ``$TITAN_CACHE/xla`` (default
``~/.cache/titan/xla``), beside the tokenizers and token streams
(:func:`titan.data.cache.cache_dir`), so that every run of a host, whatever its runs root,
shares it: a second start of the same configuration loads its compiled step from there
instead of compiling it. Every program is cached, however fast it compiled
(``jax_persistent_cache_min_compile_time_secs`` 0). The settings hold for one run and are put
back afterwards.

:class:`CompileWatch` counts XLA compilations per function name (JAX's
``/jax/core/compile/backend_compile_duration`` monitoring event) and explains each new trace of a
function it has traced before (``jax_explain_cache_misses``); a function compiled a second time
becomes a ``compile`` event whose ``reason`` is JAX's explanation (which input's type, shape or
sharding changed).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from titan.data.cache import cache_dir
from titan.telemetry.events import Compile

CACHE_SUBDIR = "xla"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # jax._src.compiler
_EXPLAIN_LOGGER = "jax._src.interpreters.partial_eval"  # where JAX logs TRACING CACHE MISS
# where JAX logs, as warnings once misses are explained, each persistent-cache miss and write
_CACHE_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
_CACHE_LINES = (
    "PERSISTENT COMPILATION CACHE MISS",
    "Writing ",
    "Not writing persistent cache entry since process_id != 0",  # process 0 writes it
)
_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_explain_cache_misses",
)


def compilation_cache_dir() -> Path:
    """``$TITAN_CACHE/xla`` (default ``~/.cache/titan/xla``)."""
    return cache_dir() / CACHE_SUBDIR


def _apply(settings: dict[str, object]) -> None:
    # An attribute that JAX's Config makes at runtime (read() refuses a context-manager flag).
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current != settings["jax_compilation_cache_dir"]:
        jax_cache.reset_cache()  # the next compilation opens the cache at the new path
    for name, value in settings.items():
        jax.config.update(name, value)


@contextmanager
def compilation_settings(cache: bool) -> Iterator[Path | None]:
    """JAX's persistent compilation cache in :func:`compilation_cache_dir` (``cache``), and
    explained tracing-cache misses, for the body; JAX's previous settings afterwards.

    Yields:
        The cache folder, or None when ``cache`` is False.
    """
    directory = compilation_cache_dir() if cache else None
    previous = {name: getattr(jax.config, name) for name in _SETTINGS}
    _apply(
        {
            "jax_compilation_cache_dir": str(directory) if directory else None,
            "jax_persistent_cache_min_compile_time_secs": 0.0,
            "jax_explain_cache_misses": True,
        }
    )
    try:
        yield directory
    finally:
        _apply(previous)


def _quiet_cache_lines(record: logging.LogRecord) -> bool:
    """Logging filter: drops JAX's line per persistent-cache miss and write (every program of a
    cold start; the ``compile`` event counts the hits), and, on the processes other than 0, per
    write left to process 0."""
    return not record.getMessage().startswith(_CACHE_LINES)


# JAX's explanation when the inputs' tree differs: a program of another structure (each MPMD
# stage's chunk has its own parameters), compiled once for it, not the same program again.
_OTHER_TREE = "different input pytree"


class CompileWatch:
    """Counts compilations and persistent-cache hits while active (a context manager; one
    active at a time), and turns every second compilation of a function into a ``compile``
    event (:meth:`drain`).

    A function's name can be shared by different functions (lambdas, the same helper defined
    in two places); a compilation counts as a repeat only when JAX's last tracing-cache miss for
    that name was of a function it had traced before (module docstring).
    """

    def __init__(self, recorded_elsewhere: frozenset[str] = frozenset()) -> None:
        """``recorded_elsewhere``: names of functions compiled ahead of time by a caller that
        records their ``compile`` events itself (the finite check, once per distinct chunk)."""
        self._recorded_elsewhere = recorded_elsewhere
        self._lock = threading.Lock()
        self._compiles: Counter[str] = Counter()
        self._explained: dict[str, str] = {}  # function name -> why its last trace missed
        self._events: list[Compile] = []
        self.cache_hits = 0

    def __enter__(self) -> CompileWatch:
        _Listeners.install()
        _Listeners.active = self
        logging.getLogger(_EXPLAIN_LOGGER).addFilter(self._explanation)
        for name in _CACHE_LOGGERS:
            logging.getLogger(name).addFilter(_quiet_cache_lines)
        return self

    def __exit__(self, *exc: object) -> None:
        _Listeners.active = None
        logging.getLogger(_EXPLAIN_LOGGER).removeFilter(self._explanation)
        for name in _CACHE_LOGGERS:
            logging.getLogger(name).removeFilter(_quiet_cache_lines)

    def _explanation(self, record: logging.LogRecord) -> bool:
        """Logging filter: keeps JAX's explanation of a tracing-cache miss (and drops it from
        the log: the event says it)."""
        lines = record.getMessage().splitlines()
        if not lines or not lines[0].startswith("TRACING CACHE MISS"):
            return True
        with self._lock:
            if len(lines) > 1 and lines[1].strip().startswith("for "):
                name = lines[1].strip()[4:].split(" defined at ")[0]
                why = " ".join(line.strip() for line in lines[2:])
                if _OTHER_TREE in why:  # another chunk's program (an MPMD stage), not a repeat
                    self._explained.pop(name, None)
                else:
                    self._explained[name] = why
            elif len(lines) > 2 and lines[1].strip() == "never seen function:":
                self._explained.pop(lines[2].split()[0], None)
        return False

    def compiled(self, fun_name: str, seconds: float) -> None:
        """One XLA compilation of ``fun_name`` (JAX's ``jit(<name>)``) that took ``seconds``."""
        name = fun_name.removeprefix("jit(").removesuffix(")")
        if name in self._recorded_elsewhere:
            return
        with self._lock:
            self._compiles[name] += 1
            if self._compiles[name] > 1 and name in self._explained:
                reason = f"compiled again ({self._compiles[name]} times): "
                reason += self._explained.pop(name)
                self._events.append(Compile(what=name, seconds=seconds, reason=reason))

    def hit(self) -> None:
        """One program loaded from the persistent cache."""
        with self._lock:
            self.cache_hits += 1

    def drain(self) -> list[Compile]:
        """The repeat compilations since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events


class _Listeners:
    """JAX's monitoring listeners (registered once per process; JAX cannot remove them),
    forwarding to the active :class:`CompileWatch`."""

    active: CompileWatch | None = None
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        jax.monitoring.register_event_duration_secs_listener(cls._duration)
        jax.monitoring.register_event_listener(cls._event)
        cls._installed = True

    @classmethod
    def _duration(cls, event: str, duration_secs: float, **kwargs: object) -> None:
        watch = cls.active
        if watch is not None and event == BACKEND_COMPILE_EVENT:
            watch.compiled(str(kwargs.get("fun_name", "?")), duration_secs)

    @classmethod
    def _event(cls, event: str, **kwargs: object) -> None:
        watch = cls.active
        if watch is not None and event == CACHE_HIT_EVENT:
            watch.hit()
