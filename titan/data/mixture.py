"""Weighted mixtures of corpora (``--data 'web/*.jsonl.zst:0.7,code/:0.3'``) and the batches
that sample them.

``--data`` is one corpus (:func:`titan.data.text.open_corpus`) or comma-separated parts, each
``SPEC:WEIGHT`` (every part weighted; weights > 0 with a finite sum, normalised to sum to 1).
Each part is its own token stream (tokenized and cached on its own) with its own shuffled epochs
(:class:`titan.data.text.PackedBatches`, salted by the part's index); the tokenizer trains on
the union of the parts' files.

Sampling (:class:`MixtureBatches`): the visiting order is cut into blocks of
:data:`BLOCK_SEQUENCES` places. Each block gives part ``c`` exactly ``n_c`` places, the
largest-remainder rounding of ``w_c x BLOCK_SEQUENCES`` (Hamilton's apportionment), in an order
drawn from ``(seed, block)``; the ``k``-th place of part ``c`` overall takes that part's ``k``-th
sequence in its own order. So each block holds the weights to within ``1 / BLOCK_SEQUENCES``,
every prefix to within the sampling error of a draw without replacement, and the place of
every sequence is a function of (seed, position) alone: the loader state stays the one integer
that checkpoints store, and a resume mid-epoch neither repeats nor skips a sequence.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from titan.data.text import Corpus, Documents, PackedBatches, batch_of, open_corpus
from titan.data.tokenize import TokenStream
from titan.errors import TitanError

BLOCK_SEQUENCES = 4096
MIX_SALT = 0x6D6978  # "mix": the block orders' own seed word, apart from the parts' orders


class Batches(Protocol):
    """What the training loop needs of its batches (:class:`PackedBatches`,
    :class:`MixtureBatches`).

    Attributes:
        position: sequences consumed so far (the loader state saved in checkpoints).
        rows: the rows of each global batch this process materialises (None: all).
    """

    position: int
    rows: np.ndarray | None

    @property
    def num_sequences(self) -> int:
        """Sequences of one epoch (identifies the corpus in checkpoints)."""
        ...

    @property
    def num_tokens(self) -> int:
        """Tokens of the stream(s)."""
        ...

    @property
    def data_digest(self) -> str:
        """Digest of the tokens of the stream(s), kept in checkpoints (empty: not known)."""
        ...

    def next_batch(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The next batch (its rows) and the whole batch's (B,) int64 sequence ids."""
        ...


@dataclass(frozen=True)
class Source:
    """One part of ``--data``: its spec, normalised weight and corpus."""

    spec: str
    weight: float
    corpus: Documents  # a Corpus, or one side of it (titan.data.heldout.open_corpora)


def _weighted(part: str) -> tuple[str, float] | None:
    """``(spec, weight)`` of a ``SPEC:WEIGHT`` part, or None when it names no weight."""
    spec, sep, tail = part.rpartition(":")
    if not sep or not spec:
        return None
    try:
        return spec, float(tail)
    except ValueError:
        return None


def open_sources(data: str, text_field: str = "text") -> list[Source]:
    """Resolve ``--data``: one corpus (weight 1), or a weighted mixture of comma-separated
    ``SPEC:WEIGHT`` parts (weights normalised to sum to 1).

    Raises:
        TitanError: as :func:`mixture_parts`, or a part's files cannot be found
            (:func:`open_corpus`).
    """
    return [Source(spec, w, open_corpus(spec, text_field)) for spec, w in mixture_parts(data)]


def mixture_parts(data: str) -> list[tuple[str, float]]:
    """``--data``'s parts and their weights normalised to sum to 1, read from its text:
    ``[(data, 1.0)]`` for one corpus, which is also what a path that exists names (a file
    ``c:0.5`` is that file, never ``c`` at weight 0.5, as a name with brackets is never a glob).

    Raises:
        TitanError: ``data`` is empty, a part names no weight while another does, a part is
            named twice, a weight is not a finite number > 0, the weights' sum is not finite, or
            a part's weight is too small to be sampled (:func:`apportion` gives it no place in a
            block of :data:`BLOCK_SEQUENCES`).
    """
    if not data.strip():
        raise TitanError("--data is empty")
    parts = data.split(",")
    weighted = [_weighted(part) for part in parts]
    if len(parts) == 1 and (weighted[0] is None or Path(data).exists()):
        return [(data, 1.0)]
    for part, pair in zip(parts, weighted, strict=True):
        if pair is None:
            spec, sep, tail = part.rpartition(":")
            if sep and spec:
                raise TitanError(
                    f"--data {data}: part '{part}': the weight '{tail}' is not a number"
                )
            raise TitanError(f"--data {data}: part '{part}' has no ':WEIGHT' (give every part one)")
        if not (math.isfinite(pair[1]) and pair[1] > 0):
            raise TitanError(
                f"--data {data}: part '{part}' needs a finite weight > 0, got {pair[1]}"
            )
    pairs = [pair for pair in weighted if pair is not None]  # all of them, checked above
    specs = [spec for spec, _ in pairs]
    twice = next((spec for spec in specs if specs.count(spec) > 1), None)
    if twice is not None:
        raise TitanError(
            f"--data {data}: part '{twice}' is named twice (give it once, with the weights' sum)"
        )
    total = sum(weight for _, weight in pairs)
    if not math.isfinite(total):
        raise TitanError(
            f"--data {data}: the weights sum past the largest float "
            f"({sys.float_info.max:.3g}); scale them down (only their ratios count)"
        )
    quota = apportion([w / total for _, w in pairs], BLOCK_SEQUENCES)
    for part, places in zip(parts, quota, strict=True):
        if not places:
            raise TitanError(
                f"--data {data}: part '{part}' would never be sampled: a part gets its share of "
                f"each {BLOCK_SEQUENCES} sequences, rounded, and this one's rounds to none "
                f"(give it at least 1/{BLOCK_SEQUENCES} of the weights' sum)"
            )
    return [(spec, w / total) for spec, w in pairs]


def check_inputs(data: str, tokenizer: str) -> None:
    """The file checks ``titan train`` makes of ``--data`` and ``--tokenizer`` before it creates
    a run dir, for callers that create one first (the console).

    Raises:
        TitanError: ``data`` does not exist, holds no files or is a malformed mixture;
            ``tokenizer`` is given and is not a file.
    """
    open_sources(data)
    if tokenizer and not Path(tokenizer).is_file():
        raise TitanError(f"--tokenizer {tokenizer}: no such file")


def union_corpus(data: str, sources: list[Source]) -> Documents:
    """All the sources' files as one corpus (what the tokenizer trains on)."""
    if len(sources) == 1:
        return sources[0].corpus
    files = dict.fromkeys(f for source in sources for f in source.corpus.files)
    return Corpus(data, tuple(files), sources[0].corpus.text_field)


def apportion(weights: list[float], places: int) -> np.ndarray:
    """(C,) int64 places per part: ``floor(w_c x places)``, the places left going to the
    largest remainders (Hamilton's method; ties to the lower index). Sums to ``places``."""
    quotas = np.asarray(weights, dtype=np.float64) * places
    counts = np.floor(quotas).astype(np.int64)
    left = places - int(counts.sum())
    order = sorted(range(len(weights)), key=lambda c: (-(quotas[c] - counts[c]), c))
    counts[order[:left]] += 1
    return counts


@dataclass
class MixtureBatches:
    """Batches sampled from several token streams in proportion to their weights (see the
    module's docstring for the rule); the same interface as :class:`PackedBatches`.

    A sequence's id is ``local_id x C + c``: its id in part ``c``'s own stream
    (:meth:`PackedBatches.sequence_id`) and the part, over C parts.

    Args:
        parts: one :class:`PackedBatches` per part (batch size 1; its ``salt`` its index).
        weights: (C,) weights summing to 1.
        batch_size: sequences per batch.
        seed: the run's seed (orders of the blocks).
        position: sequences consumed so far (the loader state saved in checkpoints).
        rows: as :class:`PackedBatches`.
    """

    parts: list[PackedBatches]
    weights: list[float]
    batch_size: int
    seed: int
    position: int = 0
    rows: np.ndarray | None = None
    _block: tuple[int, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.quota = apportion(self.weights, BLOCK_SEQUENCES)

    @property
    def num_sequences(self) -> int:
        """Sequences of one epoch of every part (identifies the corpus in checkpoints)."""
        return sum(part.num_sequences for part in self.parts)

    @property
    def num_tokens(self) -> int:
        return sum(part.num_tokens for part in self.parts)

    @property
    def data_digest(self) -> str:
        """sha256 (hex) of the parts' digests in order (empty when one is not known)."""
        digests = [part.digest for part in self.parts]
        return hashlib.sha256(" ".join(digests).encode()).hexdigest() if all(digests) else ""

    def _block_places(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(part, place within the part overall) of each place of ``block``."""
        if self._block is None or self._block[0] != block:
            rng = np.random.default_rng([self.seed, block, MIX_SALT])
            part = rng.permutation(np.repeat(np.arange(len(self.parts)), self.quota))
            local = np.empty(BLOCK_SEQUENCES, dtype=np.int64)
            for c in range(len(self.parts)):
                mine = part == c
                local[mine] = block * self.quota[c] + np.arange(int(self.quota[c]))
            self._block = (block, part, local)
        return self._block[1], self._block[2]

    def places(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(B,) part and (B,) place within that part of the batch starting at ``position``."""
        parts = np.empty(self.batch_size, dtype=np.int64)
        local = np.empty(self.batch_size, dtype=np.int64)
        for i, index in enumerate(range(position, position + self.batch_size)):
            block, offset = divmod(index, BLOCK_SEQUENCES)
            block_parts, block_local = self._block_places(block)
            parts[i], local[i] = block_parts[offset], block_local[offset]
        return parts, local

    def next_batch(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """As :meth:`PackedBatches.next_batch`."""
        parts, local = self.places(self.position)
        part_ids = np.array(
            [self.parts[c].sequence_id(int(k)) for c, k in zip(parts, local, strict=True)],
            dtype=np.int64,
        )
        rows = np.arange(self.batch_size) if self.rows is None else self.rows
        tokens = np.empty((len(rows), self.parts[0].seq_len + 1), dtype=np.int32)
        for c, part in enumerate(self.parts):
            mine = parts[rows] == c
            if mine.any():
                tokens[mine] = part.windows(part_ids[rows][mine])
        self.position += self.batch_size
        return batch_of(tokens, self.parts[0].bos_id), part_ids * len(self.parts) + parts


def make_batches(
    sources: list[Source],
    streams: list[TokenStream],
    seq_len: int,
    batch_size: int,
    seed: int,
    bos_id: int,
) -> PackedBatches | MixtureBatches:
    """The batches of ``--data``: :class:`PackedBatches` of one corpus, or a
    :class:`MixtureBatches` over the parts' streams (``streams[c]`` of ``sources[c]``).

    Raises:
        TitanError: the corpus holds fewer sequences than a batch, or a part holds none.
    """
    if len(sources) == 1:
        stream = streams[0]
        return PackedBatches(stream.tokens, seq_len, batch_size, seed, bos_id, digest=stream.digest)
    parts = []
    for c, (source, stream) in enumerate(zip(sources, streams, strict=True)):
        if (len(stream.tokens) - 1) // seq_len < 1:
            raise TitanError(
                f"--data part {source.spec} has {len(stream.tokens)} tokens: not one sequence "
                f"of --seq-len {seq_len}"
            )
        parts.append(
            PackedBatches(stream.tokens, seq_len, 1, seed, bos_id, salt=(c,), digest=stream.digest)
        )
    return MixtureBatches(parts, [s.weight for s in sources], batch_size, seed)


def data_record(
    data: str, sources: list[Source], streams: list[TokenStream], batches: Batches
) -> dict[str, Any]:
    """``run_start``'s ``data``: source, tokens, sequences, documents and drops by reason (summed
    over the parts), and for a mixture ``parts``: each one's spec, weight, tokens, documents
    and drops."""
    dropped: Counter[str] = Counter()
    for stream in streams:
        dropped.update(stream.dropped)
    record: dict[str, Any] = {
        "source": data,
        "tokens": batches.num_tokens,
        "sequences": batches.num_sequences,
        "documents": sum(stream.documents for stream in streams),
        "dropped": {reason: dropped[reason] for reason in streams[0].dropped},
    }
    if len(sources) > 1:
        record["parts"] = [
            {
                "source": source.spec,
                "weight": source.weight,
                "tokens": len(stream.tokens),
                "documents": stream.documents,
                "dropped": stream.dropped,
            }
            for source, stream in zip(sources, streams, strict=True)
        ]
    return record
