"""The check of the weights before each save: whether every parameter and optimizer moment is
finite, and each chunk's digest, saved in the checkpoint's meta and compared after a restore.

Before each save, :class:`FiniteCheck` checks that the weights are finite, with a program
compiled ahead of time, beside the step (a ``compile`` event ``finite_check``), so that nothing
compiles inside the loop; a state whose shapes or shardings differ from those compiled for
compiles it again, with a ``compile`` event whose ``cause`` names the first difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from titan.errors import CheckpointDamaged
from titan.layouts.contract import TrainState
from titan.parallel.distributed import on_every_process, one_thread
from titan.telemetry.events import Compile


def _words(leaf: jax.Array) -> jax.Array:
    """The leaf's bits as unsigned words of its own width (8-byte values as two 32-bit words),
    widened to uint32."""
    if leaf.dtype == jnp.bool_:
        return leaf.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16}.get(leaf.dtype.itemsize, jnp.uint32)
    return jax.lax.bitcast_convert_type(leaf, unsigned).astype(jnp.uint32)


def _digest(tree: Any) -> jax.Array:
    """The digest of ``tree`` (uint32 scalar): the sum, modulo 2^32, over leaves ``i`` of
    ``(2 i + 1)`` x the sum of the leaf's words (:func:`_words`). A flipped bit ``k`` moves a
    leaf's sum by 2^k, and an odd weight keeps that nonzero modulo 2^32, so any single flipped
    bit changes the digest; distinct weights catch most leaves swapped for others."""
    sums = [jnp.sum(_words(leaf), dtype=jnp.uint32) for leaf in jax.tree.leaves(tree)]
    weighted = (total * jnp.uint32(2 * i + 1) for i, total in enumerate(sums))
    return sum(weighted, start=jnp.uint32(0))


def _finite_and_digest(chunk: Any, digest: bool) -> tuple[jax.Array, jax.Array]:
    """(whether every leaf of ``chunk`` is finite, uint32[2]: the digest (:func:`_digest`) of
    the whole chunk and of its ``params`` alone). One pass of reads over the state, in the
    program the finite check runs anyway (XLA computes each leaf's sum once for both). Without
    ``digest`` (several processes, whose gloo collectives have no unsigned sums) the digests
    are 0."""
    leaves = jax.tree.leaves(chunk)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))
    if not digest:
        return finite, jnp.zeros(2, jnp.uint32)
    return finite, jnp.stack([_digest(chunk), _digest(chunk["params"])])


DIGESTS = "digests"
"""The meta field of a checkpoint's chunk digests (:func:`_digest` of each whole chunk), taken
before the save and compared after a restore (:func:`check_digests`)."""
PARAMS_DIGESTS = "params_digests"
"""The meta field of the digest of each chunk's parameters alone, compared by a restore that
reads only them (``titan generate``, ``titan export hf``, ``--init-from``)."""
_CHECKED = {  # what each digest covers, in check_digests' message
    DIGESTS: "chunk {chunk} does not match the digest saved with it",
    PARAMS_DIGESTS: "the parameters of chunk {chunk} do not match the digest saved with them",
}


def check_digests(step: int, meta: dict[str, Any], restored: dict[str, list[int]]) -> None:
    """Compare the digests of checkpoint ``step``'s chunks as restored (``restored``: meta
    field -> one digest per chunk) with those saved in its ``meta`` (a field not saved: older,
    or of several processes; nothing to compare).

    Raises:
        CheckpointDamaged: a digest differs (a file changed or corrupt on disk; names the
            checkpoint and the chunk), or the meta's field is no list of one 32-bit digest per
            chunk.
    """
    for name, digests in restored.items():
        saved = meta.get(name)
        if saved is None:
            continue
        if not _digest_list(saved, len(digests)):
            raise CheckpointDamaged(
                f"checkpoint {step}: its meta's {name} is not {len(digests)} digest(s) of "
                "32 bits: the meta changed or corrupt on disk"
            )
        for chunk, (before, after) in enumerate(zip(saved, digests, strict=True)):
            if before != after:
                raise CheckpointDamaged(
                    f"checkpoint {step}: {_CHECKED[name].format(chunk=chunk)} "
                    f"({after:08x}, saved {before:08x}): a file changed or corrupt on disk"
                )


def _digest_list(saved: Any, chunks: int) -> bool:
    """Whether ``saved`` is a list of ``chunks`` unsigned 32-bit integers (JSON's, no bools)."""
    return (
        isinstance(saved, list)
        and len(saved) == chunks
        and all(type(d) is int and 0 <= d < 2**32 for d in saved)
    )


_CHECK = jax.jit(_finite_and_digest, static_argnames="digest")
""":func:`_finite_and_digest` compiled once per chunk signature for the whole process."""


def read_digests(chunks: list[Any], partial: bool = False) -> dict[str, list[int]]:
    """The digests of each of ``chunks`` (:func:`_finite_and_digest`), as :class:`FiniteCheck`
    takes them on the devices before a save: meta field -> one digest per chunk. ``partial``:
    the chunks hold their ``params`` alone, whose digests are the only ones read."""
    pairs = [_CHECK(chunk, digest=True)[1].tolist() for chunk in chunks]
    if partial:
        return {PARAMS_DIGESTS: [params for _, params in pairs]}
    return _by_field(pairs)


def _by_field(pairs: list[list[int]]) -> dict[str, list[int]]:
    """Each chunk's (whole, params) digests as meta field -> one digest per chunk."""
    return {DIGESTS: [whole for whole, _ in pairs], PARAMS_DIGESTS: [p for _, p in pairs]}


def _held(state: TrainState) -> list[Any]:
    """The chunks of ``state`` on this process's devices (a pipeline stage of another process
    is only a handle here)."""
    return [chunk for chunk in state.chunks if jax.tree.leaves(chunk)[0].addressable_shards]


def _signature(chunk: Any) -> tuple:
    """What a compiled program is specialised to: each leaf's path, shape, dtype and sharding."""
    leaves = jax.tree_util.tree_leaves_with_path(chunk)
    return tuple((jax.tree_util.keystr(k), x.shape, x.dtype, x.sharding) for k, x in leaves)


def _difference(compiled: list[tuple], new: tuple) -> str:
    """The first difference between ``new`` and the signature compiled for that is closest to
    it (the most leaves in common), as the ``compile`` event's ``cause``."""
    if not compiled:
        return "first compile"
    names = ("shape", "dtype", "sharding")
    nearest = max(compiled, key=lambda old: sum(a == b for a, b in zip(old, new, strict=False)))
    if [leaf[0] for leaf in nearest] != [leaf[0] for leaf in new]:
        return "the state's tree of arrays changed"
    for old_leaf, new_leaf in zip(nearest, new, strict=True):
        for name, before, after in zip(names, old_leaf[1:], new_leaf[1:], strict=True):
            if before != after:
                return f"{new_leaf[0] or 'a leaf'}: {name} {before} -> {after}"
    return "a state not seen before"


@dataclass
class FiniteCheck:
    """Whether every parameter and optimizer moment of a state is finite, and each chunk's
    digest (:func:`_finite_and_digest`: one reduction per chunk on its own devices, then a host
    read: before a save and after a restore, never per step), with programs compiled ahead of
    time: :meth:`compile` beside the step, then a call per save that compiles only for a state
    unlike every one compiled for (its shapes, dtypes or shardings).

    With several processes each checks the chunks it holds and all agree on the answer (an
    all-gather of one flag); digests are then not taken (None): a chunk of another process
    is not readable here.
    """

    _programs: dict[tuple, Any] = field(default_factory=dict)
    _events: list[Compile] = field(default_factory=list)  # compiled before compile() asked

    def _compile(self, chunks: list[Any]) -> Compile | None:
        """Compile for the chunks not compiled for yet; their ``compile`` event, or None."""
        new = {_signature(c): c for c in chunks if _signature(c) not in self._programs}
        if not new:
            return None
        causes = [_difference(list(self._programs), key) for key in new]
        start = time.perf_counter()
        for key, chunk in new.items():
            self._programs[key] = _CHECK.lower(chunk, digest=jax.process_count() == 1).compile()
        seconds = time.perf_counter() - start
        cause = None if causes == ["first compile"] * len(causes) else "; ".join(causes)
        return Compile(what="finite_check", seconds=seconds, reason=cause)

    def compile(self, state: TrainState) -> list[Compile]:
        """Compile for the chunks of ``state`` (the restored or initial state, shaped as every
        later one). Returns the ``compile`` event (none when already compiled)."""
        event = self._compile(_held(state))
        events, self._events = [*self._events, *([event] if event else [])], []
        return events

    def __call__(
        self, state: TrainState
    ) -> tuple[bool, dict[str, list[int]] | None, list[Compile]]:
        """(whether ``state`` is finite, its chunks' digests with one process (meta field -> one
        digest per chunk, :func:`read_digests`; else None), the ``compile`` event of a
        recompilation with its ``cause``, if ``state`` needed one)."""
        one_thread("the finite-weights check")  # its reductions span the processes
        held = _held(state)
        event = self._compile(held)
        results = [self._programs[_signature(chunk)](chunk) for chunk in held]
        finite = all(bool(ok) for ok, _ in results)
        if jax.process_count() > 1:
            return on_every_process(finite), None, [event] if event else []
        digests = _by_field([digest.tolist() for _, digest in results])
        return finite, digests, [event] if event else []

    def digests(self, state: TrainState) -> dict[str, list[int]] | None:
        """The digests of a restored ``state``'s chunks (None with several processes); a
        program compiled for it now is reported by the next :meth:`compile`."""
        _, digests, events = self(state)
        self._events += events
        return digests


FINITE_CHECK_FUNCTION = _finite_and_digest.__name__  # its compilations: FiniteCheck's own events
