"""Held-out data for validation: documents split off the corpus, and the fixed eval batches.

``--eval-split F`` holds out the documents whose text hashes below F: document d goes to the
held-out side when the first 8 bytes of sha256(UTF-8 of d), read as a big-endian integer, are
below F x 2^64. The choice depends on the document alone (not on its place in the corpus or on
the seed), so it is the same in every run and on every process, a duplicated document lands on
one side only, and about F of the documents are held out. The training side
(:class:`SplitCorpus` with ``held_out=False``) is what the tokenizer is trained on and what is
tokenized for training: no held-out document is ever in a training batch. ``--eval-data PATH``
reads a separate corpus instead (:func:`titan.data.text.open_corpus`).

With a weighted mixture (``--data 'web/:0.7,code/:0.3'``) each part holds out its own
documents and is evaluated in its weight's share: the loss estimates the mixture's, as the
training batches sample it (:class:`EvalBatches`).

The eval batches (:class:`EvalBatches`) are the held-out streams' first sequences, in order,
the same every evaluation, packed like training sequences (:class:`titan.data.text.PackedBatches`:
``seq_len + 1`` tokens each, document ids counting BOS tokens).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from titan.data.mixture import Source, apportion, open_sources, union_corpus
from titan.data.text import Documents, FilePosition, batch_of, open_corpus
from titan.errors import TitanError

HASH_BYTES = 8


def held_out(text: str, fraction: float) -> bool:
    """Whether ``text`` is a held-out document at ``--eval-split fraction``."""
    digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).digest()
    return int.from_bytes(digest[:HASH_BYTES], "big") < fraction * 2 ** (8 * HASH_BYTES)


@dataclass(frozen=True)
class SplitCorpus:
    """One side of a corpus split by :func:`held_out`; reads like a
    :class:`titan.data.text.Corpus` (what the tokenizer and :func:`titan.data.text.token_stream`
    take), with its own fingerprint, so each side has its own cached tokens.

    Attributes:
        corpus: the whole corpus; fraction: ``--eval-split``; held_out: which side this is.
    """

    corpus: Documents
    fraction: float
    held_out: bool

    @property
    def spec(self) -> str:
        """The corpus's ``--data`` naming this side, as messages about it name the data: a
        training side that ``--eval-split`` emptied then says so."""
        return f"{self.corpus.spec} {self._side}"

    @property
    def label(self) -> str:
        """How messages name this side: the corpus's label and the side."""
        return f"{self.corpus.label} {self._side}"

    @property
    def _side(self) -> str:
        side = "held out by" if self.held_out else "left by"
        return f"(the documents {side} --eval-split {self.fraction})"

    @property
    def files(self) -> tuple[Path, ...]:
        return self.corpus.files

    @property
    def text_field(self) -> str:
        return self.corpus.text_field

    def documents(self, dropped: Counter[str] | None = None) -> Iterator[str]:
        """The documents of this side, in the corpus's order (records that are not documents
        counted in ``dropped`` as by the corpus).

        Raises:
            TitanError: as :meth:`titan.data.text.Corpus.documents`.
        """
        counts = Counter() if dropped is None else dropped
        for index in range(len(self.files)):
            yield from self.file_documents(index, counts)

    def file_documents(
        self, index: int, dropped: Counter[str], position: FilePosition | None = None
    ) -> Iterator[str]:
        """This side's documents of ``files[index]`` (:meth:`titan.data.text.Corpus.
        file_documents`, which ``position`` follows).

        Raises:
            TitanError: as :meth:`titan.data.text.Corpus.documents`.
        """
        for text in self.corpus.file_documents(index, dropped, position):
            if held_out(text, self.fraction) == self.held_out:
                yield text

    def file_sizes(self) -> list[int]:
        """The corpus's file sizes (bytes): progress follows the bytes read of both sides."""
        return self.corpus.file_sizes()

    def fingerprint(self) -> str:
        """The corpus's fingerprint with the split's fraction and side."""
        payload = json.dumps([self.corpus.fingerprint(), self.fraction, self.held_out])
        return hashlib.sha256(payload.encode()).hexdigest()[:24]


def split_corpus(
    corpus: Documents, eval_data: str, eval_split: float
) -> tuple[Documents, Documents | None]:
    """(what to train on, what to evaluate on or None) for ``--eval-data`` / ``--eval-split``.

    Raises:
        TitanError: ``eval_data`` does not exist or holds no files.
    """
    if eval_split:
        return SplitCorpus(corpus, eval_split, False), SplitCorpus(corpus, eval_split, True)
    if eval_data:
        return corpus, open_corpus(eval_data, corpus.text_field, "--eval-data")
    return corpus, None


@dataclass(frozen=True)
class Corpora:
    """The ``--data`` parts to train on and the held-out parts (None without ``--eval-data``
    or ``--eval-split``): with ``--eval-split`` each ``--data`` part's held-out side, with its
    weight; with ``--eval-data`` that corpus, weight 1."""

    sources: list[Source]
    held_out: list[Source] | None


def open_corpora(data: str, text_field: str, eval_data: str, eval_split: float) -> Corpora:
    """The parts of ``--data`` (scanned, not read: :func:`titan.data.mixture.open_sources`)
    split by ``--eval-split`` or ``--eval-data``: with a split, each part keeps its training
    side and holds out its own documents (the split is per document).

    Raises:
        TitanError: a corpus (``--data``'s, ``--eval-data``'s) does not exist or holds no
            files, or a weight is bad.
    """
    sources = open_sources(data, text_field)
    if not eval_split:
        held = split_corpus(sources[0].corpus, eval_data, 0.0)[1]
        return Corpora(sources, None if held is None else [Source(eval_data, 1.0, held)])
    train = [
        dataclasses.replace(s, corpus=SplitCorpus(s.corpus, eval_split, False)) for s in sources
    ]
    held_out = [
        dataclasses.replace(s, corpus=SplitCorpus(s.corpus, eval_split, True)) for s in sources
    ]
    return Corpora(train, held_out)


def training_corpus(data: str, sources: list[Source]) -> Documents:
    """All the training parts' documents as one corpus, what the tokenizer trains on: with
    ``--eval-split``, the training side of all the parts' files together, so that no held-out
    document shapes the vocabulary either."""
    splits = [s.corpus for s in sources if isinstance(s.corpus, SplitCorpus)]
    if len(sources) == 1 or not splits:
        return union_corpus(data, sources)
    # open_corpora splits every part or none
    pairs = zip(sources, splits, strict=True)
    whole = [dataclasses.replace(s, corpus=split.corpus) for s, split in pairs]
    return SplitCorpus(union_corpus(data, whole), splits[0].fraction, False)


@dataclass(frozen=True)
class EvalBatches:
    """The eval batches: ``count x batch_size`` sequences, each part's share by the parts'
    weights (:func:`titan.data.mixture.apportion` of the whole, Hamilton's method), each share
    its part's first sequences in order (sequence k of a stream is tokens ``[k * seq_len,
    k * seq_len + seq_len]``), laid out part after part; batch j holds sequences ``j * B`` to
    ``j * B + B - 1``. ``count`` is the most batches, up to ``--eval-batches``, of which every
    part holds its share. One part (one corpus, ``--eval-data``): the stream's first sequences.

    Args:
        streams: (N_c,) held-out token stream of each part.
        weights: each part's weight (they sum to 1).
        seq_len, batch_size: as training's; bos_id: the tokenizer's BOS.
        batches: ``--eval-batches``.
        rows: the rows of each batch this process materialises (None: all).
        names: each part's ``--data`` spec (for messages).

    Raises:
        TitanError: a part holds fewer sequences than its share of one batch.
    """

    streams: tuple[np.ndarray, ...]
    weights: tuple[float, ...]
    seq_len: int
    batch_size: int
    bos_id: int
    batches: int
    rows: np.ndarray | None = None
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.count:
            return
        if len(self.streams) == 1:
            raise TitanError(
                f"the held-out data has {self.tokens} tokens, fewer than one batch of "
                f"--batch-size {self.batch_size} x --seq-len {self.seq_len} (+1): hold out more "
                "(--eval-split, --eval-data)"
            )
        short = int(np.argmax(self.shares(1) - self._held))
        raise TitanError(
            f"the held-out documents of --data part '{self.names[short]}' have "
            f"{len(self.streams[short])} tokens, fewer than its share of one batch "
            f"({int(self.shares(1)[short])} of --batch-size {self.batch_size} sequences of "
            f"--seq-len {self.seq_len} + 1): hold out more (--eval-split)"
        )

    @property
    def _held(self) -> np.ndarray:
        """(C,) whole sequences each part's stream holds."""
        return np.array([max(len(s) - 1, 0) // self.seq_len for s in self.streams])

    def shares(self, count: int) -> np.ndarray:
        """(C,) int64 sequences of each part in ``count`` batches."""
        return apportion(list(self.weights), count * self.batch_size)

    @cached_property
    def count(self) -> int:
        """Batches evaluated: the most, up to --eval-batches, whose shares every part holds."""
        held = self._held
        fits = (n for n in range(self.batches, 0, -1) if np.all(self.shares(n) <= held))
        return next(fits, 0)

    @property
    def tokens(self) -> int:
        """Held-out tokens of every part."""
        return sum(len(s) for s in self.streams)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """Batch ``index`` (its :attr:`rows`): ``{"tokens": (R, S + 1) int32, "segment_ids":
        (R, S) int32}``, as :meth:`titan.data.text.PackedBatches.next_batch` makes them."""
        ids = index * self.batch_size + np.arange(self.batch_size)
        if self.rows is not None:
            ids = ids[self.rows]
        starts = np.concatenate([[0], np.cumsum(self.shares(self.count))])
        parts = np.searchsorted(starts, ids, side="right") - 1
        window = np.arange(self.seq_len + 1)
        tokens = np.stack(
            [
                self.streams[part][(i - starts[part]) * self.seq_len + window]
                for part, i in zip(parts, ids, strict=True)
            ]
        ).astype(np.int32)
        return batch_of(tokens, self.bos_id)
