"""Model chunks: the model cut into runs of consecutive layers, one per (virtual) stage.

SPMD trains one chunk (the whole model). MPMD cuts the model into ``pp * virtual_stages``
chunks; chunk c runs on stage c % pp as its virtual chunk c // pp (the interleaved placement of
Narayanan et al. 2021, Sec. 2.2.2).

Re-cutting (:func:`join_layers`, :func:`cut_layers`) moves a model's arrays from one chunking to
another: layer-stacked arrays are joined along the family's layer axis in model order and cut
at the new boundaries; every other array belongs to the one chunk that has it (the embedding to
the first, the head to the last). MPMD cuts its chunks from the whole model's initial values
this way, and checkpoints re-cut across layouts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from titan.errors import TitanError

PyTree = Any
IsStacked = Callable[[tuple], bool]  # a key path -> whether that array stacks layers


@dataclass(frozen=True)
class Chunk:
    """A model chunk: layers [start, end), with the model's input end if first and its loss
    end if last.

    Attributes:
        index: position in the model, 0 .. chunks - 1.
        stage: the pipeline stage that runs it (index % pp).
    """

    index: int
    stage: int
    start: int
    end: int
    first: bool
    last: bool

    @property
    def n_layers(self) -> int:
        return self.end - self.start


def whole_model(n_layers: int) -> Chunk:
    """The single chunk of the whole model, on stage 0."""
    return Chunk(0, 0, 0, n_layers, True, True)


def chunk_ranges(chunks: Sequence[Chunk]) -> tuple[tuple[int, int], ...]:
    """The ``(start, end)`` layer range of each chunk, in order (the inverse of
    :func:`chunks_from_ranges`)."""
    return tuple((c.start, c.end) for c in chunks)


def chunks_from_ranges(ranges: Sequence[Sequence[int]], pp: int = 1) -> list[Chunk]:
    """Chunks of consecutive layer ranges ``[[start, end], ...]`` (as recorded in checkpoints),
    chunk c on stage c % pp."""
    last = len(ranges) - 1
    return [
        Chunk(c, c % pp, int(start), int(end), c == 0, c == last)
        for c, (start, end) in enumerate(ranges)
    ]


def plan_chunks(
    n_layers: int,
    pp: int,
    virtual_stages: int,
    stage_layers: Sequence[int] = (),
    model_label: str = "the model",
) -> list[Chunk]:
    """Cut ``n_layers`` into pp x virtual_stages chunks: an even split, or the given counts
    (``--stage-layers``). ``model_label`` names the model in errors (``--preset tiny``).

    Raises:
        TitanError: counts that do not sum to the layers, fewer layers than chunks, or layers
            that do not split evenly.
    """
    chunks = pp * virtual_stages
    if stage_layers:
        counts = list(stage_layers)
        if len(counts) != chunks or sum(counts) != n_layers or min(counts) < 1:
            listed = ",".join(str(c) for c in counts)
            raise TitanError(
                f"--stage-layers {listed} must give {chunks} positive counts summing "
                f"to the {n_layers} layers of {model_label}"
            )
    elif n_layers < chunks:
        raise TitanError(
            f"{n_layers} layers of {model_label} cannot fill --pp {pp} x --virtual-stages "
            f"{virtual_stages} = {chunks} chunks: each chunk needs a layer"
        )
    elif n_layers % chunks:
        raise TitanError(
            f"{n_layers} layers of {model_label} do not split evenly into "
            f"--pp {pp} x --virtual-stages {virtual_stages} chunks (see --stage-layers)"
        )
    else:
        counts = [n_layers // chunks] * chunks
    bounds = np.cumsum([0, *counts])
    return chunks_from_ranges([(bounds[c], bounds[c + 1]) for c in range(chunks)], pp)


def join_layers(trees: Sequence[PyTree], is_stacked: IsStacked, axis: int) -> dict[str, Any]:
    """Key path (``jax.tree_util.keystr``) -> array of the whole model, from its chunks' trees
    in model order: layer-stacked arrays concatenated along ``axis`` (host arrays), the others
    taken from the first chunk that has them."""
    pieces: dict[str, list[Any]] = {}
    stacked: dict[str, bool] = {}
    for tree in trees:
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = jax.tree_util.keystr(path)
            pieces.setdefault(name, []).append(leaf)
            stacked[name] = is_stacked(path)
    return {
        name: np.concatenate([np.asarray(p) for p in parts], axis)
        if stacked[name] and len(parts) > 1
        else parts[0]
        for name, parts in pieces.items()
    }


def cut_layers(
    joined: dict[str, Any], target: PyTree, chunk: Chunk, is_stacked: IsStacked, axis: int
) -> PyTree:
    """``chunk``'s arrays from a whole model (:func:`join_layers`), cast and placed like
    ``target`` (a tree of ``jax.ShapeDtypeStruct`` carrying shardings).

    Raises:
        TitanError: an array of ``target`` has no counterpart in ``joined``.
    """
    layers = (slice(None),) * axis + (slice(chunk.start, chunk.end),)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    placed = []
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path)
        if name not in joined:
            raise TitanError(f"checkpoint has no array {name} for chunk {chunk.index}")
        value = joined[name][layers] if is_stacked(path) else joined[name]
        # from host memory: every process places its own shards (no cross-process transfer)
        placed.append(jax.device_put(np.asarray(value, leaf.dtype), leaf.sharding))
    return jax.tree_util.tree_unflatten(treedef, placed)


def chunk_item(index: int) -> str:
    """The checkpoint item name of chunk ``index``."""
    return f"chunk_{index}"
