"""Text data: corpora, the tokenized token stream, and packed, shuffled, resumable batches.

Corpora (``--data``): ``stdlib`` (the ``.py`` sources of the running Python's standard library,
real text present on every machine), a text file, a directory (every UTF-8 text file below it),
a ``.jsonl`` file (one JSON object per line with a ``text`` field) or a ``.parquet`` file with a
``text`` column (read through DuckDB).

Tokenization happens once per (corpus, tokenizer) ahead of training, into a cached flat token
file: every document contributes BOS, its ids, EOS, exactly once. Packing cuts the stream into
sequences of ``seq_len + 1`` tokens (inputs and shifted targets), sequence ``k`` covering tokens
``[k * seq_len, k * seq_len + seq_len]``. Each epoch visits every sequence once in an order drawn
from ``(seed, epoch)``. The loader's whole state is one integer, the number of sequences
consumed, which checkpoints store: a resumed run neither repeats nor skips a sequence.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from titan.data.cache import cache_dir
from titan.errors import TitanError


class DocumentEncoder(Protocol):
    """What :func:`token_stream` needs of a tokenizer (:class:`titan.data.tokenizer.Tokenizer`).

    Attributes:
        digest: identifies the tokenizer's model (part of the cache key).
    """

    digest: str

    def encode_documents(self, documents: list[str]) -> list[np.ndarray]:
        """Each document as BOS ids EOS, int32."""
        ...


STDLIB = "stdlib"
ENCODE_CHUNK_DOCS = 512


def _read_text_file(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError as err:  # a read error names no file: this one
        raise OSError(err.errno, err.strerror, str(path)) from None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def _stat_fingerprint(paths: list[Path]) -> list[tuple[str, int, int]]:
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]


@dataclass(frozen=True)
class Corpus:
    """A set of documents named by ``--data``.

    Attributes:
        spec: the ``--data`` value.
        files: the files read, in order.
        kind: ``files`` (one document per file), ``lines`` (plain text file: one document),
            ``jsonl`` or ``parquet`` (one document per record).
    """

    spec: str
    files: tuple[Path, ...]
    kind: str

    def documents(self) -> Iterator[str]:
        """The documents' texts, in a fixed order.

        Raises:
            TitanError: a file cannot be read (names it and the OS's reason).
        """
        try:
            yield from self._documents()
        except OSError as err:
            where = err.filename or self.spec
            raise TitanError(
                f"--data {self.spec}: cannot read {where}: {err.strerror or err}"
            ) from None

    def _documents(self) -> Iterator[str]:
        if self.kind == "jsonl":
            yield from _jsonl_documents(self.files[0])
        elif self.kind == "parquet":
            yield from _parquet_documents(self.files[0])
        else:
            for path in self.files:
                text = _read_text_file(path)
                if text and text.strip():
                    yield text

    def fingerprint(self) -> str:
        """Identity of the corpus for caches: sha256 over (path, size, mtime) of its files."""
        payload = json.dumps([self.kind, _stat_fingerprint(list(self.files))])
        return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _jsonl_documents(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:  # a UnicodeDecodeError is a ValueError
                text = json.loads(line.decode("utf-8"))["text"]
            except (ValueError, KeyError, TypeError):
                raise TitanError(
                    f"--data {path}: line {number} is not a UTF-8 JSON object with a 'text' field"
                ) from None
            if isinstance(text, str) and text.strip():
                yield text


def _parquet_documents(path: Path) -> Iterator[str]:
    import duckdb

    try:
        rows = duckdb.execute("SELECT text FROM read_parquet(?)", [str(path)]).fetchall()
    except duckdb.Error as err:
        reason = str(err).splitlines()[0]
        raise TitanError(f"--data {path}: cannot read a 'text' column ({reason})") from None
    for (text,) in rows:
        if isinstance(text, str) and text.strip():
            yield text


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())


def open_corpus(spec: str) -> Corpus:
    """Resolve ``--data``.

    Raises:
        TitanError: the path does not exist or holds no files.
    """
    if spec == STDLIB:
        return Corpus(spec, tuple(_stdlib_files()), "files")
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise TitanError(f"--data {spec}: directory holds no files")
        return Corpus(spec, tuple(files), "files")
    if not path.is_file():
        raise TitanError(f"--data {spec}: no such file or directory (or 'stdlib')")
    kind = {".jsonl": "jsonl", ".parquet": "parquet"}.get(path.suffix.lower(), "files")
    return Corpus(spec, (path,), kind)


def check_inputs(data: str, tokenizer: str) -> None:
    """The file checks ``titan train`` makes of ``--data`` and ``--tokenizer`` before it creates
    a run dir, for callers that create one first (the console).

    Raises:
        TitanError: ``data`` does not exist or holds no files; ``tokenizer`` is given and is not
            a file.
    """
    open_corpus(data)
    if tokenizer and not Path(tokenizer).is_file():
        raise TitanError(f"--tokenizer {tokenizer}: no such file")


def _batched(items: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def token_stream(
    corpus: Corpus,
    tokenizer: DocumentEncoder,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """The corpus as one flat array of token ids, tokenized once and cached.

    Args:
        progress: called with the number of documents done after each chunk; what it raises (a
            stop signal's exception) is passed on, and no partial file stays in the cache.

    Returns:
        (N,) uint32 memory-mapped array: BOS doc EOS BOS doc EOS ...

    Raises:
        TitanError: the corpus has no non-empty document, or a file of it cannot be read.
    """
    key = hashlib.sha256(f"{corpus.fingerprint()}:{tokenizer.digest}".encode()).hexdigest()[:24]
    path = cache_dir() / "tokens" / f"{key}.u32"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            documents = _write_tokens(corpus, tokenizer, tmp, progress)
            if documents == 0:
                raise TitanError(f"--data {corpus.spec}: no non-empty document")
            os.replace(tmp, path)
        except BaseException:  # an error or a stop signal: no partial file stays in the cache
            tmp.unlink(missing_ok=True)
            raise
    return np.memmap(path, dtype=np.uint32, mode="r")


def _write_tokens(
    corpus: Corpus,
    tokenizer: DocumentEncoder,
    out_path: Path,
    progress: Callable[[int], None] | None,
) -> int:
    """Write the corpus's token ids to ``out_path`` (uint32); returns the documents done."""
    documents = 0
    with open(out_path, "wb") as out:
        for chunk in _batched(corpus.documents(), ENCODE_CHUNK_DOCS):
            for ids in tokenizer.encode_documents(chunk):
                out.write(ids.astype(np.uint32).tobytes())
            documents += len(chunk)
            if progress:
                progress(documents)
    return documents


@dataclass
class PackedBatches:
    """Fixed-length sequences of a token stream, shuffled per epoch, served in batches.

    Args:
        tokens: (N,) token stream from :func:`token_stream`.
        seq_len: tokens per input sequence (each sequence holds ``seq_len + 1`` tokens).
        batch_size: sequences per batch.
        seed: shuffling seed.
        bos_id: id that starts a document (segment ids count BOS tokens).
        position: sequences consumed so far (the loader state saved in checkpoints).
        rows: the rows of each batch to materialise (sorted; None: all), for a process that
            holds only some rows of the global batch; the ids are always the whole batch's.

    Raises:
        TitanError: the stream holds fewer sequences than one batch.
    """

    tokens: np.ndarray
    seq_len: int
    batch_size: int
    seed: int
    bos_id: int
    position: int = 0
    rows: np.ndarray | None = None
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_sequences < self.batch_size:
            raise TitanError(
                f"--data has {len(self.tokens)} tokens: {self.num_sequences} sequences of "
                f"--seq-len {self.seq_len}, fewer than --batch-size {self.batch_size}"
            )

    @property
    def num_sequences(self) -> int:
        return max(len(self.tokens) - 1, 0) // self.seq_len

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, epoch])
            self._orders = {epoch: rng.permutation(self.num_sequences)}
        return self._orders[epoch]

    def sequence_ids(self, position: int) -> np.ndarray:
        """(batch_size,) int64 ids of the sequences of the batch starting at ``position``."""
        ids = np.empty(self.batch_size, dtype=np.int64)
        for i, index in enumerate(range(position, position + self.batch_size)):
            epoch, offset = divmod(index, self.num_sequences)
            ids[i] = self._order(epoch)[offset]
        return ids

    def next_batch(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The next batch (its :attr:`rows`) and the whole batch's sequence ids; advances
        :attr:`position`.

        Returns:
            ({"tokens": (R, S + 1) int32, "segment_ids": (R, S) int32}, (B,) int64 ids), with
            R = B, or the number of :attr:`rows`
        """
        ids = self.sequence_ids(self.position)
        starts = (ids if self.rows is None else ids[self.rows]) * self.seq_len
        window = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        tokens = np.asarray(self.tokens[window], dtype=np.int32)
        segment_ids = np.cumsum(tokens[:, :-1] == self.bos_id, axis=1, dtype=np.int32)
        self.position += self.batch_size
        return {"tokens": tokens, "segment_ids": segment_ids}, ids


def batch_digest(sequence_ids: np.ndarray) -> str:
    """crc32 (8 hex digits) of a batch's sequence ids: compares data order between runs."""
    return f"{zlib.crc32(np.ascontiguousarray(sequence_ids, dtype=np.int64).tobytes()):08x}"
