"""Held-out data for validation: documents split off the corpus, and the fixed eval batches.

``--eval-split F`` holds out the documents whose text hashes below F: document d goes to the
held-out side when the first 8 bytes of sha256(UTF-8 of d), read as a big-endian integer, are
below F x 2^64. The choice depends on the document alone (not on its place in the corpus or on
the seed), so it is the same in every run and on every process, a duplicated document lands on
one side only, and about F of the documents are held out. The training side
(:class:`SplitCorpus` with ``held_out=False``) is what the tokenizer is trained on and what is
tokenized for training: no held-out document is ever in a training batch. ``--eval-data PATH``
reads a separate corpus instead (:func:`titan.data.text.open_corpus`).

The eval batches (:class:`EvalBatches`) are the held-out stream's first sequences, in order,
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
from pathlib import Path

import numpy as np

from titan.data.mixture import Source, open_sources, union_corpus
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
    """The ``--data`` parts to train on and the held-out documents (None without
    ``--eval-data`` or ``--eval-split``)."""

    sources: list[Source]
    held_out: Documents | None


def open_corpora(data: str, text_field: str, eval_data: str, eval_split: float) -> Corpora:
    """The parts of ``--data`` (scanned, not read: :func:`titan.data.mixture.open_sources`)
    split by ``--eval-split`` or ``--eval-data``: with a split, each part keeps its training
    side and the held-out side is that of all the parts' files together (the same documents:
    the split is per document).

    Raises:
        TitanError: a corpus (``--data``'s, ``--eval-data``'s) does not exist or holds no
            files, or a weight is bad.
    """
    sources = open_sources(data, text_field)
    if not eval_split:
        return Corpora(sources, split_corpus(sources[0].corpus, eval_data, 0.0)[1])
    train = [
        dataclasses.replace(s, corpus=SplitCorpus(s.corpus, eval_split, False)) for s in sources
    ]
    everything = union_corpus(data, sources)
    return Corpora(train, SplitCorpus(everything, eval_split, True))


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
    """The eval batches: sequence k of the held-out stream is tokens ``[k * seq_len,
    k * seq_len + seq_len]``, batch j holds sequences ``j * B`` to ``j * B + B - 1``; as many
    batches as ``--eval-batches`` asks, or as the stream holds whole.

    Args:
        tokens: (N,) held-out token stream.
        seq_len, batch_size: as training's; bos_id: the tokenizer's BOS.
        batches: ``--eval-batches``.
        rows: the rows of each batch this process materialises (None: all).

    Raises:
        TitanError: the stream holds fewer sequences than one batch.
    """

    tokens: np.ndarray
    seq_len: int
    batch_size: int
    bos_id: int
    batches: int
    rows: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.count == 0:
            raise TitanError(
                f"the held-out data has {len(self.tokens)} tokens, fewer than one batch of "
                f"--batch-size {self.batch_size} x --seq-len {self.seq_len} (+1): hold out more "
                "(--eval-split, --eval-data)"
            )

    @property
    def count(self) -> int:
        """Batches evaluated: min(--eval-batches, whole batches in the stream)."""
        sequences = max(len(self.tokens) - 1, 0) // self.seq_len
        return min(self.batches, sequences // self.batch_size)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """Batch ``index`` (its :attr:`rows`): ``{"tokens": (R, S + 1) int32, "segment_ids":
        (R, S) int32}``, as :meth:`titan.data.text.PackedBatches.next_batch` makes them."""
        ids = index * self.batch_size + np.arange(self.batch_size)
        if self.rows is not None:
            ids = ids[self.rows]
        window = ids[:, None] * self.seq_len + np.arange(self.seq_len + 1)[None, :]
        tokens = np.asarray(self.tokens[window], dtype=np.int32)
        return batch_of(tokens, self.bos_id)
