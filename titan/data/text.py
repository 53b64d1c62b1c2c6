"""Text data: corpora, the tokenized token stream, and packed, shuffled, resumable batches.

Corpora (``--data``): ``stdlib`` (the ``.py`` sources of the running Python's standard library,
real text present on every machine), a file, a directory (every file below it) or a glob. Each
file's format comes from its name (:func:`file_format`): ``.jsonl`` or ``.ndjson``, plain or
compressed (``.gz``, ``.zst``, ``.bz2``, ``.xz``; one JSON object per line, the text in
``--text-field``; a UTF-8 byte order mark is skipped), ``.parquet`` (the ``--text-field``
column, read through DuckDB in batches), anything else plain UTF-8 text (one document per
file). Everything is streamed, one file open at a time. A record that is not a document is
counted by reason (:data:`DROP_REASONS`), never dropped silently. A compressed file that is cut
short or corrupt is an error naming it (:data:`CORRUPT_ERRORS`), never a shorter corpus.

Tokenization happens once per (corpus, tokenizer) ahead of training, into a cached flat token
file (:mod:`titan.data.tokenize`: streamed, in worker processes, resumable): every document
contributes BOS, its ids, EOS, exactly once. Packing cuts the stream, read
as a cycle, into sequences of ``seq_len + 1`` tokens (inputs and shifted targets), sequence
``k`` covering tokens ``[k * seq_len, k * seq_len + seq_len]`` (mod the stream's length). Each
epoch visits its sequences once in an order drawn from ``(seed, epoch)`` and starts in the
stream where the previous one ended, so the tail that does not fill a sequence opens the next
epoch and no token goes untrained (:class:`PackedBatches`). The loader's whole state is one
integer, the number of sequences consumed, which checkpoints store: a resumed run neither
repeats nor skips a sequence.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import sysconfig
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol

import numpy as np
import zstandard

from titan.errors import TitanError

STDLIB = "stdlib"
PARQUET_BATCH_ROWS = 1024
GLOB_CHARS = frozenset("*?[")
DROP_REASONS = ("empty", "non_text", "nul_bytes", "bad_json")
"""Why a record is not a document: ``empty`` (nothing but whitespace), ``non_text`` (the text
field is missing, or holds no string), ``nul_bytes`` (a NUL byte: a binary file), ``bad_json``
(a ``.jsonl`` line that is not a JSON object, or is nested deeper than the parser's stack, or
whose text holds a lone surrogate escape such as ``"\\ud800"``: no Unicode text, so no
tokenizer can encode it; strict parsers, I-JSON's RFC 7493, refuse the line)."""


def no_documents(corpus: Documents, dropped: Mapping[str, int]) -> str:
    """The line for a corpus without a non-empty document: its label, the records dropped by
    reason (:data:`DROP_REASONS`) and, when records lack a text, the field they lack."""
    summary = ", ".join(f"{n:,} {reason}" for reason, n in dropped.items() if n) or "none"
    line = f"{corpus.label}: no non-empty document (dropped: {summary})"
    if dropped.get("non_text"):
        line += f"; non_text: records without a string {corpus.text_field!r} (--text-field)"
    return line


SURROGATE = re.compile(r"[\ud800-\udfff]")
"""A lone surrogate: what ``json.loads`` makes of a ``\\uD800``-``\\uDFFF`` escape that is
not half of a pair."""
ZSTD_READ_BYTES = 1 << 10
"""Compressed bytes handed to the zstd decoder at a time. Its output for them is unbounded (the
decoder returns all of it), and zstd reaches ratios of thousands on repetitive text (8000:1 on
the test corpus of one repeated word): 1 KiB keeps one call's output to a few MB, at a few
microseconds of Python per call (seconds per compressed GB)."""
CORRUPT_ERRORS: tuple[type[Exception], ...] = (
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    zstandard.ZstdError,
    lzma.LZMAError,
)
"""What reading a cut-short or corrupt compressed file raises (:func:`_text_lines`; ``bz2``
raises a plain :class:`OSError`, named as a read error)."""
JSONL_SUFFIXES = tuple(
    base + compression
    for base in (".jsonl", ".ndjson")
    for compression in ("", ".gz", ".zst", ".bz2", ".xz")
)
"""File names read as JSON lines (:func:`file_format`)."""


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:  # a read error names no file: this one
        raise OSError(err.errno, err.strerror, str(path)) from None


def _plain_text(data: bytes, dropped: Counter[str]) -> Iterator[str]:
    """The one document of a plain text file (UTF-8, undecodable bytes replaced)."""
    if b"\0" in data:
        dropped["nul_bytes"] += 1
        return
    yield from _checked(data.decode("utf-8-sig", errors="replace"), dropped)


def _checked(text: object, dropped: Counter[str]) -> Iterator[str]:
    if not isinstance(text, str):
        dropped["non_text"] += 1
    elif "\0" in text:
        dropped["nul_bytes"] += 1
    elif not text.strip():
        dropped["empty"] += 1
    else:
        yield text


class FilePosition:
    """How far the file being read is, in bytes of the file on disk (compressed bytes for
    ``.gz`` and ``.zst``): what progress and its ETA are measured in."""

    def __init__(self) -> None:
        self.raw: IO[bytes] | None = None

    def bytes_read(self) -> int:
        """Bytes of the current file read so far (0 when it is not a stream: Parquet, text)."""
        try:
            return self.raw.tell() if self.raw is not None and not self.raw.closed else 0
        except (OSError, ValueError):
            return 0


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a zstd stream, frame after frame (``zstd -T``, ``pzstd`` and
    concatenated files hold several), that notices where the stream ends: inside a frame is a
    file cut short.

    Reading raises :class:`EOFError` when the stream ends inside a frame (as
    :class:`gzip.GzipFile` does) and :class:`zstandard.ZstdError` on bytes that are not zstd.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._in_frame = False  # the current frame has had bytes, not its end
        self._out = memoryview(b"")  # decompressed, not yet read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        """Up to ``len(buffer)`` decompressed bytes into ``buffer``: how many (0 at the end)."""
        while not self._out:
            if not self._decode_more():
                return 0
        size = min(len(buffer), len(self._out))
        memoryview(buffer).cast("B")[:size] = self._out[:size]
        self._out = self._out[size:]
        return size

    def _decode_more(self) -> bool:
        """Decode the next :data:`ZSTD_READ_BYTES` of the stream; False at its end."""
        data = self._raw.read(ZSTD_READ_BYTES)
        if not data:
            if self._in_frame:
                raise EOFError("the file ends inside a zstd frame")
            return False
        out = []
        while data:
            out.append(self._frame.decompress(data))
            self._in_frame = not self._frame.eof
            if self._in_frame:
                break
            data = self._frame.unused_data  # the next frame's first bytes
            self._frame = self._decompressor.decompressobj()
        self._out = memoryview(b"".join(out))
        return True


def _text_lines(path: Path, raw: IO[bytes]) -> IO[str]:
    """The raw bytes of a JSON lines file (:data:`JSONL_SUFFIXES`) as text lines, decompressed
    while read, a leading byte order mark skipped; reading a cut-short or corrupt compressed
    file raises one of :data:`CORRUPT_ERRORS`."""
    name = path.name.lower()
    binary: IO[bytes] | gzip.GzipFile | bz2.BZ2File | lzma.LZMAFile
    if name.endswith(".gz"):
        binary = gzip.GzipFile(fileobj=raw, mode="rb")
    elif name.endswith(".zst"):
        binary = io.BufferedReader(_ZstdFrames(raw))
    elif name.endswith(".bz2"):
        binary = bz2.BZ2File(raw, mode="rb")
    elif name.endswith(".xz"):
        binary = lzma.LZMAFile(raw, mode="rb")
    else:
        binary = raw
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors="replace")


def _jsonl_documents(
    path: Path, field_name: str, dropped: Counter[str], position: FilePosition
) -> Iterator[str]:
    with open(path, "rb") as raw, _text_lines(path, raw) as lines:
        position.raw = raw
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # nested deeper than the parser's stack
                dropped["bad_json"] += 1
                continue
            if not isinstance(record, dict):
                dropped["bad_json"] += 1
                continue
            text = record.get(field_name)
            if isinstance(text, str) and "\\u" in line and SURROGATE.search(text):
                dropped["bad_json"] += 1
                continue
            yield from _checked(text, dropped)


def _parquet_documents(
    path: Path, field_name: str, dropped: Counter[str], label: str
) -> Iterator[str]:
    """The ``field_name`` column, read through DuckDB in batches of
    :data:`PARQUET_BATCH_ROWS` rows (never the whole file at once). DuckDB is imported here,
    by the corpora that need it: training on text needs no database. Errors begin with the
    corpus's ``label`` (:attr:`Corpus.label`)."""
    import duckdb

    column = '"' + field_name.replace('"', '""') + '"'
    try:
        query = f"SELECT {column} FROM read_parquet(?)"
        result = duckdb.connect().execute(query, [_literal_glob(str(path))])
        while rows := result.fetchmany(PARQUET_BATCH_ROWS):
            for (text,) in rows:
                yield from _checked(text, dropped)
    except duckdb.Error as err:
        reason = str(err).splitlines()[0]
        raise TitanError(
            f"{label}: {path}: cannot read a '{field_name}' column ({reason})"
        ) from None


def _literal_glob(path: str) -> str:
    """``path`` as a DuckDB glob that matches that file alone: ``read_parquet`` takes every
    name as a pattern, where ``part[1].parquet`` is ``part1.parquet``; each ``[``, ``*`` and
    ``?`` becomes a one-character class of itself (``[[]``)."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in path)


def file_format(path: Path) -> str:
    """A corpus file's format by its name: ``jsonl`` (:data:`JSONL_SUFFIXES`), ``parquet``
    (``.parquet``) or ``text`` (anything else: one document)."""
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def _stat_fingerprint(paths: tuple[Path, ...]) -> list[tuple[str, int, int]]:
    """(absolute path, size, mtime) of each file, as make and rsync judge a file changed: the
    same on every host that mounts the corpus at the same path (a node-local copy made with
    ``rsync -a`` too), whichever directory names it relatively (``c.txt`` in two folders is two
    files), and cheap for 10^5 files. A file rewritten to the same size with its mtime put back
    is not seen (``touch`` it)."""
    return [(os.path.abspath(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]


@dataclass(frozen=True)
class Corpus:
    """A set of documents named by ``--data`` (or ``--eval-data``).

    Attributes:
        spec: the option's value.
        files: the files read, in order; each one's format by its name (:func:`file_format`).
        text_field: the field (``.jsonl``) or column (``.parquet``) holding a record's text.
        option: the option that named it, which messages about it name.
    """

    spec: str
    files: tuple[Path, ...]
    text_field: str = "text"
    option: str = "--data"

    @property
    def label(self) -> str:
        """How messages name the corpus: ``--data SPEC``."""
        return f"{self.option} {self.spec}"

    def documents(self, dropped: Counter[str] | None = None) -> Iterator[str]:
        """The documents' texts, in a fixed order, streamed (one file open at a time).

        Args:
            dropped: counts the records that are not documents, by reason
                (:data:`DROP_REASONS`), when given.

        Raises:
            TitanError: a ``.parquet`` file has no ``text_field`` column, a file cannot be
                read (names it and the OS's reason), or a ``.gz`` or ``.zst`` file is cut short
                or corrupt (names it and the decoder's reason).
        """
        counts = Counter() if dropped is None else dropped
        for index in range(len(self.files)):
            yield from self.file_documents(index, counts)

    def file_documents(
        self, index: int, dropped: Counter[str], position: FilePosition | None = None
    ) -> Iterator[str]:
        """The documents of ``files[index]`` (as :meth:`documents`), ``position`` following
        the bytes of the file read so far.

        Raises:
            TitanError: as :meth:`documents`.
        """
        path, position = self.files[index], position or FilePosition()
        kind = file_format(path)
        try:
            if kind == "jsonl":
                yield from _jsonl_documents(path, self.text_field, dropped, position)
            elif kind == "parquet":
                yield from _parquet_documents(path, self.text_field, dropped, self.label)
            else:
                yield from _plain_text(_read_bytes(path), dropped)
        except CORRUPT_ERRORS as err:  # BadGzipFile is an OSError: this comes first
            raise TitanError(f"{self.label}: {path} is cut short or corrupt ({err})") from None
        except OSError as err:
            where = err.filename or path
            raise TitanError(f"{self.label}: cannot read {where}: {err.strerror or err}") from None

    def file_sizes(self) -> list[int]:
        """Each file's size on disk (bytes), in :attr:`files` order."""
        return [p.stat().st_size for p in self.files]

    def fingerprint(self) -> str:
        """Identity of the corpus for caches: sha256 over the text field and (path, size,
        mtime) of its files (:func:`_stat_fingerprint`)."""
        payload = json.dumps([self.text_field, _stat_fingerprint(self.files)])
        return hashlib.sha256(payload.encode()).hexdigest()[:24]


class Documents(Protocol):
    """What reads like a :class:`Corpus` (what the tokenizer and
    :func:`titan.data.tokenize.token_stream` read): a corpus, or one side of it
    (:class:`titan.data.heldout.SplitCorpus`). The members are :class:`Corpus`'s."""

    @property
    def spec(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def files(self) -> tuple[Path, ...]: ...
    @property
    def text_field(self) -> str: ...
    def documents(self, dropped: Counter[str] | None = None) -> Iterator[str]: ...
    def file_documents(
        self, index: int, dropped: Counter[str], position: FilePosition | None = None
    ) -> Iterator[str]: ...
    def file_sizes(self) -> list[int]: ...
    def fingerprint(self) -> str: ...


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())


def _files_below(path: Path, label: str) -> list[Path]:
    """``path`` itself when a file, else the files below it, sorted: hidden files and
    directories (a ``.git``) left out, symbolic links to directories followed, each directory
    once (a link back up is not a loop).

    Raises:
        TitanError: a directory below cannot be listed (names it and the OS's reason), or an
            entry is no regular file (:func:`_not_a_file`), the message beginning with
            ``label`` (``--data SPEC``).
    """
    if path.is_file():
        return [path]
    if not path.is_dir():  # a glob's match: a dangling link, a loop of links, a FIFO
        if _named_through_too_many_links(path):  # ** down a link back up, whose files the
            return []  # glob also matches by shorter names
        _not_a_file(path, label)

    def refuse(err: OSError) -> None:
        raise TitanError(f"{label}: cannot read {err.filename}: {err.strerror or err}")

    files: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for root, dirs, names in os.walk(path, onerror=refuse, followlinks=True):
        status = os.stat(root)
        if (status.st_dev, status.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((status.st_dev, status.st_ino))
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [Path(root, n) for n in names if not n.startswith(".")]
    regular = [f for f in files if f.is_file()]  # one stat each
    for entry in sorted(set(files) - set(regular)):  # never left out without a word
        if not _named_through_too_many_links(entry):
            _not_a_file(entry, label)
    return sorted(regular)


def _named_through_too_many_links(path: Path) -> bool:
    """Whether ``path`` is a usable file or directory that its name alone cannot reach: the
    directories on its way pass more links than the OS follows in one lookup (40 on Linux),
    while the same entry, named from its folder's resolved path, is found."""
    short = Path(os.path.realpath(path.parent)) / path.name
    return short != path and (short.is_file() or short.is_dir())


def _not_a_file(path: Path, label: str) -> NoReturn:
    """Refuse ``path``, an entry of ``--data`` (``label``) that is no regular file: a link whose
    target is missing (an unmounted shard, say), a loop of links, a FIFO or a device.

    Raises:
        TitanError: always, naming ``path`` and what it is.
    """
    _check_exists(path, f"{label}: {path}")
    raise TitanError(f"{label}: {path}: not a regular file (a FIFO, a device)")


def _check_exists(path: Path, label: str) -> None:
    """Raise unless ``path`` can be stat'ed (its links followed).

    Raises:
        TitanError: no such path (a link whose target is missing says so), or the OS's reason
            it cannot be reached (a loop of links, a directory on the way that cannot be read).
    """
    try:
        path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise TitanError(
                f"{label}: a link to {os.readlink(path)}, which does not exist"
            ) from None
        raise TitanError(f"{label}: no such file or directory (or 'stdlib')") from None
    except OSError as err:
        raise TitanError(f"{label}: cannot read it: {err.strerror or err}") from None


def _distinct(files: list[Path]) -> tuple[Path, ...]:
    """``files`` in order, each file once however many names reach it (links, a glob's
    ``**`` through a link back up)."""
    seen: dict[tuple[int, int], Path] = {}
    for f in files:
        status = f.stat()
        seen.setdefault((status.st_dev, status.st_ino), f)
    return tuple(seen.values())


def open_corpus(spec: str, text_field: str = "text", option: str = "--data") -> Corpus:
    """Resolve ``--data`` (or another ``option`` naming a corpus, which its messages name):
    ``stdlib``, a file, a directory (every file below it, hidden files and directories
    excepted: :func:`_files_below`) or a glob (``shards/*.jsonl.zst``, ``**`` recursive;
    directories it matches are read whole; a path that exists is never read as a glob, so
    ``part[1].jsonl`` names that file). A file reached by several names is read once.

    Raises:
        TitanError: the path does not exist, is neither a regular file nor a directory (a
            FIFO, a device), a directory below cannot be listed, or the directory or glob holds
            no files.
    """
    label = f"{option} {spec}"
    if spec == STDLIB:
        return Corpus(spec, tuple(_stdlib_files()), text_field, option)
    path = Path(spec)
    if GLOB_CHARS & set(spec) and not path.exists():  # a name with brackets is itself first
        files = [
            f
            for match in sorted(glob.glob(spec, recursive=True))
            for f in _files_below(Path(match), label)
        ]
        if not files:
            raise TitanError(f"{label}: the pattern matches no files")
        return Corpus(spec, _distinct(files), text_field, option)
    _check_exists(path, label)
    if not (path.is_file() or path.is_dir()):
        raise TitanError(f"{label}: not a regular file or directory (a FIFO, a device)")
    files = _files_below(path, label)
    if not files:
        raise TitanError(f"{label}: directory holds no files")
    return Corpus(spec, _distinct(files), text_field, option)


@dataclass
class PackedBatches:
    """Fixed-length sequences of a token stream, shuffled per epoch, served in batches.

    The stream is read as a cycle of its N tokens. An epoch is K = (N - 1) // seq_len
    sequences, visited in an order drawn from ``(seed, epoch)``; sequence ``g`` (ids count on
    across epochs: epoch ``e`` holds ``e * K`` to ``e * K + K - 1``) is the ``seq_len + 1``
    tokens from stream index ``(g * seq_len) mod N`` on, wrapping past the end to the start.
    Epoch 0 therefore covers tokens ``[0, K * seq_len]``, and each later epoch starts where the
    one before ended: the tail that one epoch leaves out opens the next, and every token is an
    input within ``ceil(N / (K * seq_len))`` epochs (2 whenever N >= 2 * seq_len, as
    K * seq_len > N - 1 - seq_len). The order and the windows are
    functions of (seed, position) alone, so resuming at a saved :attr:`position` is exact.

    Args:
        tokens: (N,) token stream from :func:`token_stream`.
        seq_len: tokens per input sequence (each sequence holds ``seq_len + 1`` tokens).
        batch_size: sequences per batch.
        seed: shuffling seed.
        bos_id: id that starts a document (segment ids count BOS tokens).
        position: sequences consumed so far (the loader state saved in checkpoints).
        rows: the rows of each batch to materialise (sorted; None: all), for a process that
            holds only some rows of the global batch; the ids are always the whole batch's.
        salt: more seed words of the order (a mixture's part index); ``()`` for one corpus.
        digest: the stream's content digest (:attr:`titan.data.tokenize.TokenStream.digest`),
            which checkpoints keep to tell, on resume, a corpus whose tokens changed.

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
    salt: tuple[int, ...] = ()
    digest: str = ""
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

    @property
    def num_tokens(self) -> int:
        """Tokens of the stream."""
        return len(self.tokens)

    @property
    def data_digest(self) -> str:
        """The stream's content digest (:attr:`digest`; empty: not known)."""
        return self.digest

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, epoch, *self.salt])
            self._orders = {epoch: rng.permutation(self.num_sequences)}
        return self._orders[epoch]

    def sequence_id(self, index: int) -> int:
        """The id of the sequence at place ``index`` of the visiting order (all epochs): the
        sequence at place ``j`` of epoch ``e`` has id ``e * K + order_e[j]`` (K sequences per
        epoch, ``order_e`` the epoch's permutation)."""
        epoch, offset = divmod(index, self.num_sequences)
        return epoch * self.num_sequences + int(self._order(epoch)[offset])

    def sequence_ids(self, position: int) -> np.ndarray:
        """(batch_size,) int64 ids of the sequences of the batch starting at ``position``
        (:meth:`sequence_id` of each place)."""
        places = range(position, position + self.batch_size)
        return np.array([self.sequence_id(i) for i in places], dtype=np.int64)

    def sequence_starts(self, ids: np.ndarray) -> np.ndarray:
        """Stream index of each sequence's first token: ``(id * seq_len) mod N``."""
        return (ids * self.seq_len) % len(self.tokens)

    def windows(self, ids: np.ndarray) -> np.ndarray:
        """(R, seq_len + 1) int32 tokens of the sequences ``ids`` (R,), wrapping at the end."""
        starts = self.sequence_starts(ids)
        window = (starts[:, None] + np.arange(self.seq_len + 1)[None, :]) % len(self.tokens)
        return np.asarray(self.tokens[window], dtype=np.int32)

    def next_batch(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The next batch (its :attr:`rows`) and the whole batch's sequence ids; advances
        :attr:`position`.

        Returns:
            ({"tokens": (R, S + 1) int32, "segment_ids": (R, S) int32}, (B,) int64 ids), with
            R = B, or the number of :attr:`rows`
        """
        ids = self.sequence_ids(self.position)
        tokens = self.windows(ids if self.rows is None else ids[self.rows])
        self.position += self.batch_size
        return batch_of(tokens, self.bos_id), ids


def batch_of(tokens: np.ndarray, bos_id: int) -> dict[str, np.ndarray]:
    """A batch from (R, S + 1) int32 sequences: ``tokens``, and their :func:`document_ids` as
    ``segment_ids`` (documents are the attention segments)."""
    return {"tokens": tokens, "segment_ids": document_ids(tokens, bos_id)}


def document_ids(tokens: np.ndarray, bos_id: int) -> np.ndarray:
    """(R, S) int32 document ids of the inputs of (R, S + 1) packed ``tokens``: the BOS tokens
    up to and including each input position (attention stays within a document)."""
    return np.cumsum(tokens[:, :-1] == bos_id, axis=1, dtype=np.int32)


def batch_digest(sequence_ids: np.ndarray) -> str:
    """crc32 (8 hex digits) of a batch's sequence ids: compares data order between runs."""
    return f"{zlib.crc32(np.ascontiguousarray(sequence_ids, dtype=np.int64).tobytes()):08x}"
