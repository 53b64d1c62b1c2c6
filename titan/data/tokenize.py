"""Tokenizing a corpus into its cached token file: streamed, in worker processes, resumable.

The calling process reads the corpus in order, one file open at a time, and cuts its documents
into chunks of at most :data:`CHUNK_DOCS` documents or :data:`CHUNK_CHARS` characters; a
document longer than a chunk (a plain text file is one document) is cut into chunks of its own,
at cuts that leave its ids those of one encoding (:func:`titan.data.long_documents.spans`), BOS
before the first and EOS after the last. With
``workers`` > 0 (``--data-workers``), the chunks are encoded by that many worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`, spawned: the trainer's JAX threads are never
forked), at most ``2 x workers`` chunks in flight, and written in chunk order: the token file is
the same for any number of workers. Memory is bounded by the chunks in flight (about
``2 x workers x CHUNK_CHARS`` characters plus their ids), never by the corpus; a document
longer than a piece is encoded in pieces (:mod:`titan.data.long_documents`). A corpus of one
chunk, or ``workers`` = 0, is encoded in the calling process (with the tokenizer library's
threads).

Resuming: tokens are appended to ``<key>.partial``; after each chunk the file is flushed and
fsynced and the commit ``<key>.commit.json`` (:class:`Commit`: tokens and documents written, the
file being read, its documents done, the characters done of a long document, the drop counts
before it) replaces the previous one. A run that is stopped, killed or crashes leaves both; the
next one truncates the partial file to the committed tokens, skips the files done, re-reads
(without encoding) the documents done of the current one, and goes on (inside a long document,
from its characters done). The finished file becomes ``<key>.u32``; its record ``<key>.json``
(tokens, documents, drop counts, the sha256 of the token bytes, hashed as they are written
and, after an interruption, read back once) is written and fsynced before the rename. A
finished file whose size is not that of its record's tokens (cut short, appended to) or whose
record is unreadable is never used: it is discarded, with one line on stderr, and tokenized
again.
``<key>.lock`` (``flock``) keeps two processes of one host from tokenizing into the same file: the
second waits, then reads the finished one.

Training starts once the whole stream exists: an epoch's order is a permutation of all of its
sequences (:class:`titan.data.text.PackedBatches`), which needs the stream's length. To
tokenize ahead of training, run ``titan tokenize`` with the run's ``--data`` and tokenizer first
(the training run then finds the cache).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import IO, Any

import numpy as np

from titan.data.cache import cache_dir, naming, writable_dir
from titan.data.text import DROP_REASONS, Documents, FilePosition, no_documents
from titan.data.tokenizer import Tokenizer
from titan.errors import TitanError
from titan.formatting import counted
from titan.inert import inert
from titan.reading import json_field, read_json

CHUNK_DOCS = 512
CHUNK_CHARS = 4 << 20
"""Characters of text per chunk (4 Mi: about a second of one core's sentencepiece encoding, so
that a commit, and the work an interruption loses, stays small)."""
IN_FLIGHT_PER_WORKER = 2
HASH_READ_BYTES = 8 << 20
PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class TokenStream:
    """A tokenized corpus.

    Attributes:
        tokens: (N,) uint32 memory-mapped array: BOS doc EOS BOS doc EOS ...
        documents: documents tokenized.
        dropped: records that are not documents, by reason (:data:`DROP_REASONS`, every
            reason present, zeros included).
        digest: sha256 of the token file's bytes (64 hex digits), computed while it is
            written: checkpoints keep it, so that a resume on a corpus whose tokens changed is
            refused even when its number of sequences did not.
    """

    tokens: np.ndarray
    documents: int
    dropped: dict[str, int]
    digest: str

    def summary(self) -> str:
        """``1,234 documents, 567,890 tokens`` and, when records were not documents,
        `` (dropped: 3 empty, 1 bad_json)``."""
        drops = ", ".join(f"{n:,} {reason}" for reason, n in self.dropped.items() if n)
        line = f"{counted(self.documents, 'document')}, {counted(len(self.tokens), 'token')}"
        return f"{line} (dropped: {drops})" if drops else line


@dataclass(frozen=True)
class Commit:
    """How far tokenization is, as committed after a chunk (``<key>.commit.json``).

    Attributes:
        tokens: tokens in the partial file (the file is truncated to this on resume).
        documents: documents encoded into them.
        file: index in :attr:`Corpus.files` of the file the last chunk ended in
            (``len(files)``: every file read).
        file_documents: documents of that file the chunks hold whole.
        document_chars: characters of the next document that the chunks hold (a document
            longer than a chunk is cut into chunks of its own); 0 when none.
        dropped_before_file: drop counts by reason of the files before ``file``.
    """

    tokens: int = 0
    documents: int = 0
    file: int = 0
    file_documents: int = 0
    document_chars: int = 0
    dropped_before_file: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenizeProgress:
    """Where tokenization stands, reported after each chunk written.

    Attributes:
        documents: documents encoded so far (those of an earlier, interrupted run included).
        tokens: tokens written so far (likewise).
        bytes_done: bytes of the corpus files read (on disk: compressed bytes for ``.gz``,
            ``.zst``; Parquet and text files count when finished).
        bytes_total: the corpus files' total size on disk.
        elapsed_s: seconds since this run of the tokenizer started.
        start_tokens, start_bytes: ``tokens`` and ``bytes_done`` when it started (a resume's).
    """

    documents: int
    tokens: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float
    start_tokens: int = 0
    start_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Tokens written per second by this run."""
        return (self.tokens - self.start_tokens) / max(self.elapsed_s, 1e-9)

    @property
    def eta_s(self) -> float | None:
        """Seconds left at this run's rate of bytes read (None before any byte was read)."""
        done = self.bytes_done - self.start_bytes
        if done <= 0:
            return None
        return max(self.bytes_total - self.bytes_done, 0) * self.elapsed_s / done


@dataclass(frozen=True)
class _Clock:
    """When and where this run of the tokenizer started (for rates and the ETA)."""

    started: float
    start_tokens: int
    start_bytes: int
    bytes_total: int

    def report(self, commit: Commit, bytes_done: int) -> TokenizeProgress:
        elapsed_s = time.monotonic() - self.started
        return TokenizeProgress(
            commit.documents,
            commit.tokens,
            bytes_done,
            self.bytes_total,
            elapsed_s,
            self.start_tokens,
            self.start_bytes,
        )


@dataclass(frozen=True)
class _Chunk:
    """Texts encoded together: whole documents, or one piece of a long document (``opens``:
    the piece begins its document, BOS before it; ``closes``: it ends it, EOS after it)."""

    texts: list[str]
    end: Commit  # tokens and documents left at 0: the writer counts them
    bytes_done: int
    opens: bool = True
    closes: bool = True

    @property
    def documents(self) -> int:
        """Documents this chunk completes."""
        return len(self.texts) - (0 if self.closes else 1)


_WORKER_TOKENIZER: list[Tokenizer] = []


def _exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone (killed: a worker blocked on its queue would
    otherwise wait forever, as every worker holds the queue's write end)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _init_worker(model_proto: bytes) -> None:
    """A worker process: the parent decides on stops (signals are its to handle), the worker
    ends with it, and it is one core (its tokenizer library runs one thread)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOKENIZER.append(Tokenizer(model_proto))


def _encode_in_worker(texts: list[str], opens: bool, closes: bool) -> bytes:
    return encode_chunk(_WORKER_TOKENIZER[0], texts, threads=1, opens=opens, closes=closes)


def encode_chunk(
    tokenizer: Tokenizer,
    texts: list[str],
    threads: int = 0,
    opens: bool = True,
    closes: bool = True,
) -> bytes:
    """The chunk's documents as BOS ids EOS each, concatenated: uint32 bytes (native order).

    Args:
        threads: the tokenizer library's threads (0: one per core).
        opens: the first text begins its document (False: the piece of a long document after
            its first, without the BOS).
        closes: the last text ends its document (False: without the EOS).
    """
    if not texts:
        return b""
    ids = np.concatenate(tokenizer.encode_documents(texts, threads))
    return ids[0 if opens else 1 : None if closes else -1].astype(np.uint32).tobytes()


def _encode(tokenizer: Tokenizer, chunk: _Chunk) -> bytes:
    return encode_chunk(tokenizer, chunk.texts, opens=chunk.opens, closes=chunk.closes)


def _chunks(
    corpus: Documents,
    start: Commit,
    chunk_chars: int,
    cut: Callable[[str], list[tuple[int, int]]],
) -> Iterator[_Chunk]:
    """The corpus's documents from ``start`` on, in chunks; the last chunk (maybe empty) ends
    at ``file == len(files)`` with the final drop counts. A document longer than
    ``chunk_chars`` is a run of chunks of its own, one per span ``cut`` gives (spans whose
    ids, joined, are those of the whole text: :func:`titan.data.long_documents.spans`), so
    that a plain text file (one document) is encoded in parallel, reports progress and
    commits as any other corpus."""
    dropped: Counter[str] = Counter(start.dropped_before_file)
    sizes = corpus.file_sizes()
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    texts: list[str] = []
    chars = 0
    for index in range(start.file, len(corpus.files)):
        before, position = dict(dropped), FilePosition()
        skip = start.file_documents if index == start.file else 0
        for number, document in enumerate(corpus.file_documents(index, dropped, position), 1):
            if number <= skip:
                continue
            done = start.document_chars if (index, number) == (start.file, skip + 1) else 0
            if done or len(document) > chunk_chars:  # its rest, however short, without BOS
                if texts:
                    end = Commit(file=index, file_documents=number - 1, dropped_before_file=before)
                    yield _Chunk(texts, end, offsets[index] + position.bytes_read())
                    texts, chars = [], 0
                place = _Place(index, number, before, offsets[index], sizes[index], position)
                yield from _document_chunks(document, done, cut(document[done:]), place)
                continue
            texts.append(document)
            chars += len(document)
            if len(texts) >= CHUNK_DOCS or chars >= chunk_chars:
                end = Commit(file=index, file_documents=number, dropped_before_file=before)
                yield _Chunk(texts, end, offsets[index] + position.bytes_read())
                texts, chars = [], 0
    end = Commit(file=len(corpus.files), dropped_before_file=dict(dropped))
    yield _Chunk(texts, end, offsets[-1])


@dataclass(frozen=True)
class _Place:
    """Where a long document stands: its file's index, its number in the file, the drops
    before the file, the file's offset and size in the corpus's bytes, and how far it is read."""

    file: int
    number: int
    dropped_before_file: dict[str, int]
    offset: int
    size: int
    position: FilePosition


def _document_chunks(
    document: str, done: int, spans: list[tuple[int, int]], at: _Place
) -> Iterator[_Chunk]:
    """One chunk per span of ``document[done:]`` (its first ``done`` characters committed
    before), each committing the characters up to the next span's start; a file read whole
    (Parquet, text: no stream position) counts its bytes in proportion to those characters."""
    for i, (begin, end) in enumerate(spans):
        closes = i == len(spans) - 1
        reached = len(document) if closes else done + spans[i + 1][0]
        commit = Commit(
            file=at.file,
            file_documents=at.number if closes else at.number - 1,
            document_chars=0 if closes else reached,
            dropped_before_file=at.dropped_before_file,
        )
        read = at.position.bytes_read() or at.size * reached // len(document)
        piece = document[done + begin : done + end]
        yield _Chunk([piece], commit, at.offset + read, opens=i == 0 and done == 0, closes=closes)


class _Encoder:
    """Encodes chunks in order: in the calling process while the corpus has shown one chunk,
    then (``workers`` > 0) in spawned worker processes, at most :data:`IN_FLIGHT_PER_WORKER`
    chunks per worker in flight."""

    def __init__(self, tokenizer: Tokenizer, workers: int) -> None:
        self.tokenizer, self.workers = tokenizer, workers
        self.pool: ProcessPoolExecutor | None = None

    def _start(self) -> ProcessPoolExecutor:
        self.pool = ProcessPoolExecutor(
            self.workers,
            mp_context=get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.tokenizer.model_proto,),
        )
        return self.pool

    def ordered(self, chunks: Iterable[_Chunk]) -> Iterator[tuple[_Chunk, bytes]]:
        """Each chunk with its encoding, in order."""
        chunks = iter(chunks)
        first = next(chunks)
        second = next(chunks, None)
        if self.workers <= 0 or second is None or not second.texts:  # one chunk: no workers
            for chunk in (first, second) if second else (first,):
                yield chunk, _encode(self.tokenizer, chunk)
            yield from ((c, _encode(self.tokenizer, c)) for c in chunks)
            return
        pool = self._start()
        pending: deque[tuple[_Chunk, Future[bytes]]] = deque()
        for chunk in itertools.chain((first, second), chunks):
            job = pool.submit(_encode_in_worker, chunk.texts, chunk.opens, chunk.closes)
            pending.append((chunk, job))
            if len(pending) >= IN_FLIGHT_PER_WORKER * self.workers:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()

    def close(self) -> None:
        """Stop the workers (a chunk being encoded is abandoned)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class _Paths:
    tokens: Path
    counts: Path
    partial: Path
    commit: Path
    lock: Path

    @classmethod
    def of(cls, key: str) -> _Paths:
        base = cache_dir() / "tokens" / key
        names = (".u32", ".json", ".partial", ".commit.json", ".lock")
        return cls(*(base.with_name(key + suffix) for suffix in names))

    def done(self) -> bool:
        return self.tokens.is_file() and self.counts.is_file()


def _write_json(path: Path, payload: dict) -> None:
    """``payload`` as ``path``, whole or not at all: written to a temporary file, fsynced,
    renamed over it; the temporary file is removed when that is cut short."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with naming(tmp), open(tmp, "w") as out:  # a write names no file (a full disk)
            out.write(json.dumps(payload))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:  # a stop signal or a full disk between the write and the rename
        tmp.unlink(missing_ok=True)
        raise


def _read_commit(paths: _Paths) -> Commit:
    """The committed state of an interrupted run, or a fresh start."""
    if not (paths.partial.is_file() and paths.commit.is_file()):
        return Commit()
    try:
        commit = Commit(**json.loads(paths.commit.read_text()))
    except (ValueError, TypeError):  # a torn or foreign commit file: start over
        return Commit()
    return commit if paths.partial.stat().st_size >= 4 * commit.tokens else Commit()


def _append(out: IO[bytes], data: bytes) -> None:
    out.write(data)
    out.flush()
    os.fsync(out.fileno())


def _tokenize(
    corpus: Documents,
    tokenizer: Tokenizer,
    paths: _Paths,
    workers: int,
    chunk_chars: int,
    progress: Callable[[TokenizeProgress], None] | None,
) -> None:
    """Tokenize into ``paths.partial`` from its commit on, then publish the finished file."""
    commit = _read_commit(paths)
    sizes = corpus.file_sizes()
    clock = _Clock(time.monotonic(), commit.tokens, sum(sizes[: commit.file]), sum(sizes))
    encoder = _Encoder(tokenizer, workers)
    hasher = hashlib.sha256()
    try:
        with naming(paths.partial), open(paths.partial, "r+b" if commit.tokens else "w+b") as out:
            out.truncate(4 * commit.tokens)
            _hash_written(out, hasher)
        with open(paths.partial, "r+b") as out:
            out.seek(4 * commit.tokens)
            chunks = _chunks(corpus, commit, chunk_chars, lambda t: tokenizer.spans(t, chunk_chars))
            for chunk, data in encoder.ordered(chunks):
                with naming(paths.partial):  # a write names no file (a full disk)
                    _append(out, data)
                hasher.update(data)
                commit = dataclasses.replace(
                    chunk.end,
                    tokens=commit.tokens + len(data) // 4,
                    documents=commit.documents + chunk.documents,
                )
                _write_json(paths.commit, dataclasses.asdict(commit))
                if progress:
                    progress(clock.report(commit, chunk.bytes_done))
    except TitanError:  # an unreadable corpus: a partial file that holds no commit is no start
        if not paths.commit.is_file():
            paths.partial.unlink(missing_ok=True)
        raise
    finally:
        encoder.close()
    _publish(corpus, paths, commit, hasher.hexdigest())


def _hash_written(out: IO[bytes], hasher: Any) -> None:
    """Feed ``hasher`` what ``out`` holds (what an interrupted run committed; read back in
    :data:`HASH_READ_BYTES` slices), leaving ``out`` at its end to append to."""
    out.seek(0)
    while data := out.read(HASH_READ_BYTES):
        hasher.update(data)


class EmptyCorpus(TitanError):
    """The corpus holds no non-empty document (the message counts the records dropped)."""


def _publish(corpus: Documents, paths: _Paths, commit: Commit, digest: str) -> None:
    dropped = {reason: commit.dropped_before_file.get(reason, 0) for reason in DROP_REASONS}
    if commit.documents == 0:
        paths.partial.unlink(missing_ok=True)
        paths.commit.unlink(missing_ok=True)
        raise EmptyCorpus(no_documents(corpus, dropped))
    record = {
        "tokens": commit.tokens,
        "documents": commit.documents,
        "dropped": dropped,
        "digest": digest,
        "mtime_ns": paths.partial.stat().st_mtime_ns,  # kept by the rename below
    }
    _write_json(paths.counts, record)
    os.replace(paths.partial, paths.tokens)
    paths.commit.unlink(missing_ok=True)


def _cached(paths: _Paths) -> TokenStream | str:
    """The finished token file with its record's counts, or why it cannot be used: its
    record is unreadable or lacks a field, the file's size is not 4 bytes per token of the
    record (a file cut short or appended to), or the file was written to after its record
    (its modification time is not the recorded ``mtime_ns``) and its sha256 is no longer the
    recorded digest."""
    where = f"token cache {paths.counts}"
    try:
        record = read_json(paths.counts, "token cache")
        if "tokens" not in record:
            return f"{where}: no token count (written by an older titan)"
        tokens = json_field(record, "tokens", int, where)
        documents = json_field(record, "documents", int, where)
        dropped = json_field(record, "dropped", dict, where)
        digest = json_field(record, "digest", str, where) if "digest" in record else None
        stat = paths.tokens.stat()
        size, mtime_ns = stat.st_size, stat.st_mtime_ns
    except TitanError as err:
        return str(err)
    except OSError as err:
        return f"token cache {paths.tokens}: {err.strerror or err}"
    if tokens <= 0:
        return f"{where}: {tokens} tokens"
    if size != 4 * tokens:
        return (
            f"token cache {paths.tokens}: {size:,} bytes, but its record says {tokens:,} tokens "
            f"({4 * tokens:,} bytes)"
        )
    if digest is None or record.get("mtime_ns") != mtime_ns:
        # an older titan's record, or a file written to since (same size, other bytes): the
        # digest of the file it holds, kept with its time when it is the recorded one
        held = _file_digest(paths.tokens)
        if digest is not None and held != digest:
            return f"token cache {paths.tokens}: changed since it was written (sha256 {held[:12]})"
        digest = held
        with contextlib.suppress(OSError):  # a read-only cache: computed again next time
            _write_json(paths.counts, {**record, "digest": digest, "mtime_ns": mtime_ns})
    tokens_array = np.memmap(paths.tokens, dtype=np.uint32, mode="r")
    return TokenStream(tokens_array, documents, dropped, digest)


def _file_digest(path: Path) -> str:
    """sha256 (hex) of a file, read in :data:`HASH_READ_BYTES` slices."""
    hasher = hashlib.sha256()
    with open(path, "rb") as data:
        _hash_written(data, hasher)
    return hasher.hexdigest()


def _discard(paths: _Paths, reason: str) -> None:
    """Remove a finished token file that :func:`_cached` refused, saying why in one line."""
    print(f"titan: {inert(reason)}: discarded, tokenizing again", file=sys.stderr, flush=True)
    paths.counts.unlink(missing_ok=True)
    paths.tokens.unlink(missing_ok=True)


ENCODING_VERSION = 2
"""Version of :meth:`Tokenizer.encode_documents`'s output, part of the cache key: a token file
written by another version (one where document text spelling ``<s>`` became BOS) is not reused."""


def stream_key(corpus: Documents, tokenizer: Tokenizer) -> str:
    """The cache key of a (corpus, tokenizer) token file: sha256 of both fingerprints and
    :data:`ENCODING_VERSION`."""
    payload = f"{corpus.fingerprint()}:{tokenizer.digest}:{ENCODING_VERSION}"
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def token_stream(
    corpus: Documents,
    tokenizer: Tokenizer,
    progress: Callable[[TokenizeProgress], None] | None = None,
    workers: int = 0,
    chunk_chars: int = CHUNK_CHARS,
) -> TokenStream:
    """The corpus as one flat array of token ids, tokenized once and cached (with its document
    counts beside it, ``<key>.json``); an interrupted tokenization resumes where it stopped.

    Args:
        progress: called after each chunk written; what it raises (a stop signal's exception)
            is passed on, and the work committed so far stays for the next run.
        workers: worker processes that encode chunks (0: the calling process).
        chunk_chars: characters per chunk (tests make it small).

    A cached file that does not match its record (:func:`_cached`: cut short, appended to,
    written over, its record unreadable) is discarded, with one line on stderr, and tokenized again.

    Raises:
        EmptyCorpus: the corpus has no non-empty document (the message counts the drops).
        TitanError: a file of the corpus cannot be read, or the token file just written does
            not match its record (the cache's file system lost it).
        OSError: the cache cannot be written (read-only, full), naming the file.
    """
    paths = _Paths.of(stream_key(corpus, tokenizer))
    if paths.done() and isinstance(stream := _cached(paths), TokenStream):
        return stream
    writable_dir(paths.lock.parent)
    with open(paths.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        if paths.done():  # another process may have finished it meanwhile
            if isinstance(stream := _cached(paths), TokenStream):
                return stream
            _discard(paths, stream)
        _tokenize(corpus, tokenizer, paths, workers, chunk_chars, progress)
        stream = _cached(paths)
    if not isinstance(stream, TokenStream):
        raise TitanError(stream)
    return stream
