"""Tokenizers: load a sentencepiece model, a Hugging Face ``tokenizer.json`` or Llama 3's
tiktoken ``tokenizer.model`` behind one interface (:class:`Tokenizer`), or train a
Llama-convention sentencepiece model on the corpus (cached); decode in chunks
(:class:`StreamDecoder`).

BOS and EOS: their ids are each tokenizer's own (sentencepiece's ``bos_id``/``eos_id``, the
``bos_token``/``eos_token`` of a ``tokenizer.json``'s config, Llama 3's ``<|begin_of_text|>`` and
``<|end_of_text|>``), and whether :meth:`Tokenizer.encode` adds them (``add_special_tokens``)
comes from the ``add_bos_token``/``add_eos_token`` of the ``tokenizer_config.json`` beside the
file, else each kind's own default: the ``tokenizer.json``'s post-processor template, BOS only
for sentencepiece (transformers' ``LlamaTokenizer``) and tiktoken (Llama 3). Training documents
always get one BOS and one EOS (:meth:`Tokenizer.encode_documents`): the packer counts BOS
tokens as document boundaries.

End tokens (where generation stops, :attr:`Tokenizer.end_ids`): EOS, and the ids named by the
``eos_token_id`` (an id or a list) of the ``generation_config.json`` and ``config.json`` beside
the file (a Hugging Face model directory's: Llama 3 Instruct names 128001 and 128009), and for
tiktoken Meta's stop tokens ``<|end_of_text|>`` and ``<|eot_id|>``.

Text is always ordinary text, on every path: a document or prompt that holds ``<s>``, ``</s>``
or ``<|eot_id|>`` encodes those characters as ordinary pieces, never as the special tokens of
the same name (sentencepiece never matches its control symbols in text; a ``tokenizer.json`` is
loaded with ``encode_special_tokens`` set, so its special added tokens are not split out;
tiktoken encodes with ``encode_ordinary``, as Meta's Llama 3 tokenizer does by default). Special
tokens come only from configuration: the BOS and EOS added around each document.

Trained convention (Llama 1/2 ``tokenizer.model``): unk = 0, bos = 1, eos = 2, no pad, byte
fallback so that no text is ever out of vocabulary. Trained tokenizers use BPE (as Llama does)
with identity normalisation and whitespace kept, so that source code round-trips, and split
digits.

Training reads a deterministic sample of the corpus, streamed (:func:`training_sample`: at most
:data:`SAMPLE_BYTES` bytes of lines of documents drawn in a seeded order, long lines split rather
than dropped) and takes seconds. The result is cached under
``$TITAN_CACHE`` (default ``~/.cache/titan``) keyed by the corpus fingerprint and every trainer
setting, so a second run on the same corpus reuses it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import io
import json
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import sentencepiece as spm
import tiktoken
import tokenizers as hf_tokenizers

from titan.cpus import usable_cpus
from titan.data.cache import cache_dir, naming, writable_dir
from titan.data.long_documents import LONG_DOCUMENT_CHARS, encode_long, spans
from titan.data.text import Documents, no_documents
from titan.errors import TitanError
from titan.inert import inert
from titan.reading import read_json

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SAMPLE_BYTES = 4_000_000
"""Budget of the tokenizer's training sample (UTF-8 bytes): about 1M BPE tokens of English or
code, enough for a stable 8k-32k vocabulary, and a few seconds of sentencepiece training."""
SAMPLE_SEED = 0
REPORT_EVERY_LINES = 4096
MAX_SENTENCE_BYTES = 4192
"""sentencepiece's ``max_sentence_length`` default (bytes; ``trainer_spec.proto``): it skips longer
sentences, so :func:`split_line` cuts lines to this length."""
TRAINER_SETTINGS: dict[str, Any] = {  # keyword arguments of SentencePieceTrainer.train
    "model_type": "bpe",
    "byte_fallback": True,
    "unk_id": UNK_ID,
    "bos_id": BOS_ID,
    "eos_id": EOS_ID,
    "pad_id": -1,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "split_digits": True,
    "allow_whitespace_only_pieces": True,
    "character_coverage": 0.9999,
    "input_sentence_size": 0,
    "max_sentence_length": MAX_SENTENCE_BYTES,
}


class Backend(Protocol):
    """What :class:`Tokenizer` needs of a tokenizer library (sentencepiece, Hugging Face)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    @property
    def add_bos(self) -> bool:
        """encode(add_special_tokens=True) puts BOS first."""
        ...

    @property
    def add_eos(self) -> bool:
        """... and EOS last."""
        ...

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Ids that end a generation besides EOS (its config's)."""
        ...

    def encode(self, texts: list[str], threads: int) -> list[list[int]]:
        """Ids of each text as ordinary text: no special tokens added, none parsed from it."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens included."""
        ...

    def token_id(self, text: str) -> int | None:
        """The id of the one token whose text is ``text`` (a special token's name included),
        else None."""
        ...


@dataclass(frozen=True)
class SentencePieceBackend:
    """A sentencepiece model: BOS and EOS are its own ``bos_id`` / ``eos_id``."""

    processor: spm.SentencePieceProcessor
    add_bos: bool = True
    add_eos: bool = False
    end_ids: tuple[int, ...] = ()

    @property
    def vocab_size(self) -> int:
        return self.processor.vocab_size()

    @property
    def bos_id(self) -> int:
        return self.processor.bos_id()

    @property
    def eos_id(self) -> int:
        return self.processor.eos_id()

    def encode(self, texts: list[str], threads: int) -> list[list[int]]:
        return self.processor.encode(texts, num_threads=threads)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)

    def token_id(self, text: str) -> int | None:
        piece = self.processor.piece_to_id(text)  # the unknown piece's id when there is none
        return piece if self.processor.id_to_piece(piece) == text else None


@dataclass(frozen=True)
class HuggingFaceBackend:
    """A Hugging Face ``tokenizer.json`` (the ``tokenizers`` library), with the BOS and EOS
    tokens that :func:`load_tokenizer` took from its configuration; its ``encode_special_tokens``
    is set, so that text spelling a special token encodes as ordinary text, and the truncation
    and padding its file may set are off (a document is encoded whole, never cut or padded)."""

    tokenizer: hf_tokenizers.Tokenizer
    bos_id: int
    eos_id: int
    add_bos: bool
    add_eos: bool
    end_ids: tuple[int, ...] = ()

    @property
    def vocab_size(self) -> int:
        """The largest id + 1 (ids may have gaps, so the count of tokens can be smaller)."""
        return max(self.tokenizer.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, texts: list[str], threads: int) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_id(self, text: str) -> int | None:
        return self.tokenizer.token_to_id(text)


@dataclass(frozen=True)
class TiktokenBackend:
    """A tiktoken BPE (Llama 3's ``tokenizer.model``: base64 byte sequences and their ranks),
    its special tokens numbered after the ranks."""

    encoding: tiktoken.Encoding
    bos_id: int
    eos_id: int
    add_bos: bool
    add_eos: bool
    end_ids: tuple[int, ...] = ()

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, texts: list[str], threads: int) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=max(threads, 1))

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)  # an incomplete UTF-8 sequence decodes to U+FFFD

    def token_id(self, text: str) -> int | None:
        try:
            return self.encoding.encode_single_token(text)
        except KeyError:
            return None


HF_ENVELOPE = "titan.huggingface"
"""``format`` of the JSON that holds a Hugging Face tokenizer in :attr:`Tokenizer.model_proto`:
``{"format", "tokenizer": <tokenizer.json text>, "bos_token", "eos_token", "add_bos",
"add_eos", "end_ids"}`` (``add_*`` absent in older run dirs: the template's; ``end_ids``, the
ids that end a generation besides EOS, absent: none)."""
TIKTOKEN_ENVELOPE = "titan.tiktoken"
"""``format`` of the JSON that holds a tiktoken BPE: ``{"format", "ranks": <the file's text>,
"pattern", "special_tokens": [names, numbered from the number of ranks], "bos_token",
"eos_token", "add_bos", "add_eos", "end_ids"}``."""
SENTENCEPIECE_ENVELOPE = "titan.sentencepiece"
"""``format`` of the JSON that holds a sentencepiece model whose ``tokenizer_config.json`` set
other rules than the default (add BOS, not EOS), or whose configs name end tokens besides EOS:
``{"format", "model": <base64 of the .model>, "add_bos", "add_eos", "end_ids"}``. Without one,
:attr:`Tokenizer.model_proto` is the ``.model`` itself."""

# Meta's Llama 3 tokenizer (llama_models/llama3/tokenizer.py): the pre-tokenizer pattern, and
# 256 special tokens numbered from the number of ranks (128000 in Llama 3).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_NAMED_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
LLAMA3_SPECIAL_TOKENS = LLAMA3_NAMED_SPECIALS + tuple(
    f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_NAMED_SPECIALS))
)
LLAMA3_STOP_TOKENS = ("<|end_of_text|>", "<|eot_id|>")
"""Where Meta's Llama 3 tokenizer stops a generation (``stop_tokens`` of
llama3/tokenizer.py)."""


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: a sentencepiece model, a Hugging Face ``tokenizer.json`` or a
    tiktoken BPE.

    Attributes:
        model_proto: what defines it, copied into each run dir as ``tokenizer.model``: the
            sentencepiece ``.model`` bytes, or the UTF-8 JSON of :data:`HF_ENVELOPE`,
            :data:`TIKTOKEN_ENVELOPE` or :data:`SENTENCEPIECE_ENVELOPE` (the tokenizer with its
            BOS and EOS tokens and rules), told apart by content.
    """

    model_proto: bytes

    @property
    def backend(self) -> Backend:
        return _backend(self.model_proto)

    @property
    def processor(self) -> spm.SentencePieceProcessor:
        """The sentencepiece processor (sentencepiece tokenizers only)."""
        backend = self.backend
        if not isinstance(backend, SentencePieceBackend):
            raise TypeError("not a sentencepiece tokenizer")
        return backend.processor

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    @property
    def bos_id(self) -> int:
        return self.backend.bos_id

    @property
    def eos_id(self) -> int:
        return self.backend.eos_id

    @property
    def end_ids(self) -> tuple[int, ...]:
        """The ids that end a generation, sorted: EOS and those its configs name (the module's
        docstring)."""
        return tuple(sorted({self.eos_id, *self.backend.end_ids}))

    def token_id(self, text: str) -> int | None:
        """The id of the one token whose text is ``text`` (``<|eom_id|>``), else None."""
        return self.backend.token_id(text)

    @property
    def add_bos(self) -> bool:
        """Whether :meth:`encode` with ``add_special_tokens`` puts BOS first (its config's)."""
        return self.backend.add_bos

    @property
    def add_eos(self) -> bool:
        """Whether :meth:`encode` with ``add_special_tokens`` puts EOS last (its config's)."""
        return self.backend.add_eos

    @property
    def digest(self) -> str:
        """sha256 of the model bytes (hex, 16 chars): identifies the tokenizer in cache keys."""
        return hashlib.sha256(self.model_proto).hexdigest()[:16]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``; with ``add_special_tokens``, BOS first and EOS last as the
        tokenizer's config says (:attr:`add_bos`, :attr:`add_eos`), else neither."""
        ids = self.backend.encode([text], 1)[0]
        if not add_special_tokens:
            return ids
        return [self.bos_id] * self.add_bos + ids + [self.eos_id] * self.add_eos

    def encode_documents(self, texts: list[str], threads: int = 0) -> list[np.ndarray]:
        """Token ids of each training document with exactly one BOS before and one EOS after,
        whatever the config's rules (the packer counts BOS tokens as document boundaries); the
        text between them is ordinary text, so the BOS tokens are exactly the documents.

        Returns:
            One int32 array per document, shape (len + 2,).

        Raises:
            TitanError: the tokenizer encodes a document's ordinary text to the BOS or EOS id
                (a ``tokenizer.json`` whose BOS or EOS is an added token not marked special),
                which would make one document look like several; or the tokenizer library
                cannot encode a document (a WordLevel model without its unknown token).
        """
        threads = threads or usable_cpus()
        try:
            ids = self._encode_each(texts, threads)
        except Exception as err:  # the libraries raise plain Exception for what they refuse
            reason = (str(err).splitlines() or [type(err).__name__])[0]
            raise TitanError(f"--tokenizer cannot encode a document: {reason}") from None
        bos, eos = (np.array([i], dtype=np.int32) for i in (self.bos_id, self.eos_id))
        docs = [np.concatenate([bos, doc, eos]) for doc in ids]
        marks = sum(np.count_nonzero((d == self.bos_id) | (d == self.eos_id)) for d in docs)
        if marks != 2 * len(docs):
            raise TitanError(
                f"--tokenizer encodes document text to its BOS or EOS id "
                f"({self.bos_id}, {self.eos_id}): mark them special in its tokenizer.json "
                "(added_tokens) so that text stays text"
            )
        return docs

    def _encode_each(self, texts: list[str], threads: int) -> list[np.ndarray]:
        """The ids of each text as ordinary text, int32: the texts of at most
        :data:`~titan.data.long_documents.LONG_DOCUMENT_CHARS` characters in one call of the
        library, each longer one alone, in pieces (:func:`~titan.data.long_documents.encode_long`:
        the same ids in a fraction of the memory)."""
        short = [t for t in texts if len(t) <= LONG_DOCUMENT_CHARS]
        encoded = iter(self.backend.encode(short, threads) if short else [])
        return [
            np.asarray(next(encoded), dtype=np.int32)
            if len(text) <= LONG_DOCUMENT_CHARS
            else encode_long(lambda pieces: self.backend.encode(pieces, 1), text)
            for text in texts
        ]

    def spans(self, text: str, piece_chars: int) -> list[tuple[int, int]]:
        """``text`` as (start, end) spans of about ``piece_chars`` characters whose ids, joined,
        are those of ``text`` (:func:`titan.data.long_documents.spans`)."""
        return spans(lambda texts: self.backend.encode(texts, 1), text, piece_chars)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` decoded as one sequence (for chunks, :class:`StreamDecoder`)."""
        return self.backend.decode(ids)


class StreamDecoder:
    """Decodes token ids chunk by chunk (generation streams them) so that the joined outputs
    equal one :meth:`Tokenizer.decode` of all the ids.

    Decoding each chunk alone loses a chunk's leading space (sentencepiece strips it at the
    start of a text) and splits a UTF-8 sequence spread over byte-fallback pieces into U+FFFD.
    Here each push decodes a context window, the ids emitted last time followed by the new
    ones, and emits the text past the context's own decode (the incremental detokenization of
    vLLM and Hugging Face's ``TextStreamer``): text still ending in U+FFFD, an incomplete UTF-8
    sequence, is held back until more ids (or :meth:`flush`) come.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._decode = tokenizer.decode
        self._ids: list[int] = []  # from the context window's start on
        self._read = 0  # ids of _ids whose text has been emitted

    def push(self, ids: list[int] | np.ndarray) -> str:
        """Add ``ids``; return the text they complete ("" while a character is incomplete)."""
        self._ids.extend(int(i) for i in ids)
        if self._decode(self._ids).endswith("\ufffd"):
            return ""
        return self.flush()

    def flush(self) -> str:
        """The text of every id pushed not yet returned, complete or not (at the stream's end)."""
        done = self._decode(self._ids[: self._read])
        text = self._decode(self._ids)[len(done) :]
        self._ids = self._ids[self._read :]  # the last emitted ids stay as the next context
        self._read = len(self._ids)
        return text


_BACKENDS: dict[bytes, Backend] = {}


UTF8_BOM = b"\xef\xbb\xbf"
"""The byte order mark some editors put first in a UTF-8 file (a ``tokenizer.json`` too)."""


def _is_json(data: bytes) -> bool:
    return data.lstrip()[:1] == b"{"


def _huggingface_backend(envelope: dict) -> HuggingFaceBackend:
    tok = hf_tokenizers.Tokenizer.from_str(envelope["tokenizer"])
    tok.encode_special_tokens = True  # text is text: "<s>" in a document is not BOS
    tok.no_truncation()  # saved pipelines often set them: documents are encoded whole
    tok.no_padding()
    bos, eos = (tok.token_to_id(envelope[k]) for k in ("bos_token", "eos_token"))
    assert bos is not None and eos is not None  # _load_huggingface checked both are in the vocab
    before, after = _template_specials(
        json.loads(envelope["tokenizer"]).get("post_processor") or {}
    )
    add_bos = envelope.get("add_bos", before is not None)
    add_eos = envelope.get("add_eos", after is not None)
    return HuggingFaceBackend(tok, bos, eos, add_bos, add_eos, tuple(envelope.get("end_ids", ())))


def tiktoken_ranks(text: str) -> dict[bytes, int]:
    """The mergeable ranks of a tiktoken file (``<base64 bytes> <rank>`` per line; tiktoken's
    ``load_tiktoken_bpe`` format).

    Raises:
        ValueError: a line is not of that form, or a token or a rank appears twice.
    """
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
    if not ranks or min(ranks.values()) < 0:
        raise ValueError("no ranks, or a negative one")
    if len(set(ranks.values())) != len(ranks) or len(ranks) != sum(map(bool, text.splitlines())):
        raise ValueError("a token or a rank appears twice")
    return ranks


def _tiktoken_backend(envelope: dict) -> TiktokenBackend:
    ranks = tiktoken_ranks(envelope["ranks"])
    first = max(ranks.values()) + 1  # len(ranks) for Meta's files, whose ranks have no gaps
    specials = {name: first + i for i, name in enumerate(envelope["special_tokens"])}
    encoding = tiktoken.Encoding(
        "titan", pat_str=envelope["pattern"], mergeable_ranks=ranks, special_tokens=specials
    )
    bos, eos = specials[envelope["bos_token"]], specials[envelope["eos_token"]]
    rules = envelope["add_bos"], envelope["add_eos"]
    return TiktokenBackend(encoding, bos, eos, *rules, tuple(envelope.get("end_ids", ())))


def _sentencepiece_backend(envelope: dict) -> SentencePieceBackend:
    processor = spm.SentencePieceProcessor(model_proto=base64.b64decode(envelope["model"]))
    rules = envelope["add_bos"], envelope["add_eos"]
    return SentencePieceBackend(processor, *rules, tuple(envelope.get("end_ids", ())))


_ENVELOPES: dict[str, Callable[[dict], Backend]] = {
    HF_ENVELOPE: _huggingface_backend,
    TIKTOKEN_ENVELOPE: _tiktoken_backend,
    SENTENCEPIECE_ENVELOPE: _sentencepiece_backend,
}


def _backend(model_proto: bytes) -> Backend:
    if model_proto not in _BACKENDS:
        if _is_json(model_proto):
            envelope = json.loads(model_proto)
            _BACKENDS[model_proto] = _ENVELOPES[envelope["format"]](envelope)
        else:
            processor = spm.SentencePieceProcessor(model_proto=model_proto)
            _BACKENDS[model_proto] = SentencePieceBackend(processor)
    return _BACKENDS[model_proto]


def _envelope(fields: dict) -> Tokenizer:
    return Tokenizer(json.dumps(fields, sort_keys=True).encode())


def _check_convention(tokenizer: Tokenizer, source: str) -> Tokenizer:
    if tokenizer.bos_id < 0 or tokenizer.eos_id < 0:
        raise TitanError(f"--tokenizer {source} defines no BOS or EOS piece (Llama convention)")
    return tokenizer


def _token_content(value: object) -> str | None:
    """A ``tokenizer_config.json`` token: a string or an ``AddedToken`` dict's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_specials(spec: dict) -> tuple[str | None, str | None]:
    """The special tokens before and after ``$A`` in the ``post_processor``'s single-sequence
    template (``TemplateProcessing``; searched inside a ``Sequence`` of processors)."""
    processors = [spec] if spec.get("type") != "Sequence" else spec.get("processors", [])
    for processor in processors:
        if processor.get("type") == "TemplateProcessing":
            items = processor.get("single", [])
            place = next((i for i, item in enumerate(items) if "Sequence" in item), len(items))
            specials = [
                (i, item["SpecialToken"]["id"])
                for i, item in enumerate(items)
                if "SpecialToken" in item
            ]
            before = [t for i, t in specials if i < place]
            after = [t for i, t in specials if i > place]
            return (before[-1] if before else None), (after[0] if after else None)
    return None, None


TOKENIZER_CONFIG = "tokenizer_config.json"


def _read_config(path: Path) -> dict:
    """A JSON object config file ({} when there is none).

    Raises:
        TitanError: it is not a JSON object (:func:`titan.reading.read_json`).
    """
    if not path.is_file():
        return {}
    return read_json(path, "--tokenizer")


def tokenizer_config(path: Path) -> dict:
    """The ``tokenizer_config.json`` beside ``path`` ({} when there is none).

    Raises:
        TitanError: it is not a JSON object.
    """
    return _read_config(path.with_name(TOKENIZER_CONFIG))


END_ID_CONFIGS = ("generation_config.json", "config.json")


def config_end_ids(directories: list[Path]) -> list[int]:
    """The ids named by ``eos_token_id`` (an id or a list of ids, as ``transformers``'
    ``GenerationConfig`` reads it) in the :data:`END_ID_CONFIGS` of ``directories``, sorted.

    Raises:
        TitanError: a file is not a JSON object, or its ``eos_token_id`` is neither.
    """
    ids: set[int] = set()
    for path in (d / name for d in dict.fromkeys(directories) for name in END_ID_CONFIGS):
        value = _read_config(path).get("eos_token_id")
        values = value if isinstance(value, list) else [] if value is None else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise TitanError(
                f"--tokenizer {path}: eos_token_id must be a token id or a list of them, "
                f"got {value!r}"
            )
        ids.update(values)
    return sorted(ids)


def _rules(config: dict, add_bos: bool, add_eos: bool, source: Path) -> dict[str, bool]:
    """``add_bos``/``add_eos``: the config's ``add_bos_token``/``add_eos_token``, else these.

    A null value counts as absent.

    Raises:
        TitanError: a value is not a JSON boolean (``"false"`` would read as true).
    """
    rules = {"add_bos": add_bos, "add_eos": add_eos}
    for rule in rules:
        value = config.get(f"{rule}_token")
        if value is None:  # absent, or null as transformers writes an unset one
            continue
        if not isinstance(value, bool):
            raise TitanError(
                f"--tokenizer {source.with_name(TOKENIZER_CONFIG)}: {rule}_token must be true "
                f"or false, got {value!r}"
            )
        rules[rule] = value
    return rules


def _hf_special_tokens(config: dict, spec: dict) -> tuple[str | None, str | None]:
    """BOS and EOS of a ``tokenizer.json``: ``bos_token`` / ``eos_token`` of its
    ``tokenizer_config.json`` (as ``transformers`` reads them), else the special tokens around
    ``$A`` in its ``post_processor`` template."""
    bos, eos = _template_specials(spec.get("post_processor") or {})
    return (
        _token_content(config.get("bos_token")) or bos,
        _token_content(config.get("eos_token")) or eos,
    )


def _end_ids(end_ids: list[int]) -> dict[str, list[int]]:
    """The envelope's ``end_ids`` field, absent when there are none (older digests hold)."""
    return {"end_ids": end_ids} if end_ids else {}


def _load_huggingface(path: Path, data: bytes, end_ids: list[int]) -> Tokenizer:
    text = data.decode("utf-8", errors="replace")
    try:
        spec = json.loads(text)
        if isinstance(spec, dict) and spec.get("format") in _ENVELOPES:  # a run dir's copy
            return _run_copy(path, data)
        tok = hf_tokenizers.Tokenizer.from_str(text)
    except Exception as err:  # the library raises plain Exception for a bad file
        reason = str(err).splitlines()[0]
        raise TitanError(f"--tokenizer {path} is not a Hugging Face tokenizer ({reason})") from None
    config = tokenizer_config(path)
    bos, eos = _hf_special_tokens(config, spec)
    for name, token in (("BOS", bos), ("EOS", eos)):
        if token is None or tok.token_to_id(token) is None:
            raise TitanError(
                f"--tokenizer {path} names no {name} token of its vocabulary "
                "(tokenizer_config.json beside it, or its post_processor template)"
            )
    _say_broken_added_tokens(path, tok)
    before, after = _template_specials(spec.get("post_processor") or {})
    return _envelope(
        {
            "format": HF_ENVELOPE,
            "tokenizer": text,
            "bos_token": bos,
            "eos_token": eos,
            **_rules(config, before is not None, after is not None, path),
            **_end_ids(end_ids),
        }
    )


def broken_added_tokens(tok: hf_tokenizers.Tokenizer) -> list[tuple[str, str]]:
    """The added tokens (``added_tokens``, special ones aside) of a Hugging Face tokenizer that
    do not decode back to their text, each with what it decodes to: ``("Ö", "�")`` for a token
    outside a ``ByteLevel`` decoder's alphabet, whose content the decoder reads as byte
    characters. Text holding one is encoded to its id, then read back wrong."""
    added = [t.content for t in tok.get_added_tokens_decoder().values() if not t.special]
    if not added:
        return []
    ids = [e.ids for e in tok.encode_batch(added, add_special_tokens=False)]
    decoded = tok.decode_batch(ids, skip_special_tokens=False)
    return [(text, back) for text, back in zip(added, decoded, strict=True) if back != text]


def _say_broken_added_tokens(path: Path, tok: hf_tokenizers.Tokenizer) -> None:
    """One line on stderr naming the added tokens of ``tok`` that do not round-trip
    (:func:`broken_added_tokens`), if any: the tokenizer is usable, but text holding them comes
    back wrong from ``titan generate`` and ``titan sample``."""
    broken = broken_added_tokens(tok)
    if not broken:
        return
    shown = ", ".join(f"{text!r} -> {back!r}" for text, back in broken[:3])
    more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
    print(
        inert(
            f"titan: --tokenizer {path}: {len(broken)} added token(s) do not decode back to "
            f"their text ({shown}{more}): text holding them is read back wrong; check its "
            "decoder and added_tokens"
        ),
        file=sys.stderr,
        flush=True,
    )


def _run_copy(path: Path, data: bytes) -> Tokenizer:
    """A run dir's ``tokenizer.model`` that holds an envelope, checked by loading it.

    Raises:
        TitanError: a field is missing or does not load (a damaged or hand-edited copy).
    """
    try:
        _backend(data)
    except KeyError as err:
        raise TitanError(f"--tokenizer {path}: a damaged tokenizer copy (no {err} field)") from None
    except Exception as err:  # the libraries raise plain Exception for what they cannot load
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        raise TitanError(f"--tokenizer {path}: a damaged tokenizer copy ({reason})") from None
    return _check_convention(Tokenizer(data), str(path))


def _is_tiktoken(data: bytes) -> bool:
    """Whether ``data`` starts like a tiktoken file (``<base64> <rank>``)."""
    first = data[:256].split(b"\n", 1)[0].split()
    try:
        return (
            len(first) == 2
            and bool(base64.b64decode(first[0], validate=True))
            and (first[1].isdigit())
        )
    except binascii.Error:
        return False


def _load_tiktoken(path: Path, data: bytes, end_ids: list[int]) -> Tokenizer:
    """Llama 3's ``tokenizer.model``: its ranks with Llama 3's pattern, special tokens and stop
    tokens."""
    text = data.decode("utf-8", errors="replace")
    try:
        ranks = max(tiktoken_ranks(text).values(), default=-1) + 1
    except (ValueError, binascii.Error) as err:
        raise TitanError(f"--tokenizer {path} is not a tiktoken BPE file ({err})") from None
    specials = LLAMA3_SPECIAL_TOKENS
    stops = [ranks + specials.index(name) for name in LLAMA3_STOP_TOKENS]
    return _envelope(
        {
            "format": TIKTOKEN_ENVELOPE,
            "ranks": text,
            "pattern": LLAMA3_PATTERN,
            "special_tokens": list(specials),
            "bos_token": specials[0],
            "eos_token": specials[1],
            **_rules(tokenizer_config(path), True, False, path),
            **_end_ids(sorted({*stops, *end_ids})),
        }
    )


def _load_sentencepiece(path: Path, data: bytes, end_ids: list[int]) -> Tokenizer:
    try:
        spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as err:
        raise TitanError(f"--tokenizer {path} is not a sentencepiece model ({err})") from None
    rules = _rules(tokenizer_config(path), True, False, path)
    tokenizer = Tokenizer(data)
    if rules != {"add_bos": True, "add_eos": False} or end_ids:
        model = base64.b64encode(data).decode()
        fields = {"format": SENTENCEPIECE_ENVELOPE, "model": model, **rules, **_end_ids(end_ids)}
        tokenizer = _envelope(fields)
    return _check_convention(tokenizer, str(path))


def load_tokenizer(path: str | Path, config_dirs: tuple[Path, ...] = ()) -> Tokenizer:
    """Load a tokenizer, its kind told by the file's content: a sentencepiece ``.model`` (e.g.
    a Llama 1/2 ``tokenizer.model``), a Hugging Face ``tokenizer.json`` (e.g. Llama 3's; BOS
    and EOS from the ``tokenizer_config.json`` beside it, else its post-processor template),
    Llama 3's tiktoken ``tokenizer.model`` (Meta's ``original/tokenizer.model``), or a run dir's
    ``tokenizer.model`` (any of these, as :attr:`Tokenizer.model_proto` holds it). The
    ``tokenizer_config.json`` beside the file sets whether :meth:`Tokenizer.encode` adds BOS and
    EOS (``add_bos_token``, ``add_eos_token``); the ``eos_token_id`` of the configs beside it and
    in ``config_dirs`` (:func:`config_end_ids`) adds end tokens (:attr:`Tokenizer.end_ids`).

    Raises:
        TitanError: the file is missing or unreadable, is neither kind, or has no BOS/EOS, or
            a config beside it is not a JSON object.
    """
    path = Path(path)
    if path.is_dir():
        raise TitanError(
            f"--tokenizer {path}: a directory; give the tokenizer file in it "
            "(tokenizer.json, tokenizer.model)"
        )
    if not path.exists():  # a dangling link too
        raise TitanError(f"--tokenizer {path}: no such file")
    if not path.is_file():
        raise TitanError(f"--tokenizer {path}: not a regular file (a FIFO, a device)")
    try:
        data = path.read_bytes().removeprefix(UTF8_BOM)
    except OSError as err:
        raise TitanError(f"--tokenizer {path}: cannot read it: {err.strerror or err}") from None
    if not data.strip():
        raise TitanError(f"--tokenizer {path}: the file is empty")
    end_ids = config_end_ids([path.parent, *config_dirs])
    if _is_json(data):
        return _load_huggingface(path, data, end_ids)
    if _is_tiktoken(data):
        return _load_tiktoken(path, data, end_ids)
    return _load_sentencepiece(path, data, end_ids)


def _pieces(data: bytes, max_bytes: int) -> Iterator[bytes]:
    """:func:`split_line`'s pieces of the UTF-8 ``data``, as bytes, one after the other (each
    window read once: linear in ``len(data)``)."""
    start = 0
    while len(data) - start > max_bytes:
        cut = start + max_bytes
        while data[cut] & 0xC0 == 0x80:  # a continuation byte: back to the character's start
            cut -= 1
        space = data.rfind(b" ", start, cut)
        if space >= start + max_bytes // 2:
            cut = space + 1
        yield data[start:cut]
        start = cut
    yield data[start:]


def split_line(line: str, max_bytes: int = MAX_SENTENCE_BYTES) -> list[str]:
    """``line`` cut into pieces of at most ``max_bytes`` UTF-8 bytes, joined back equal to it:
    each cut after the last space of its window when the window holds one past its middle,
    else at the last character boundary (never inside a UTF-8 sequence). Linear in the line's
    length.

    Raises:
        UnicodeEncodeError: ``line`` holds a lone surrogate (no UTF-8; corpora never yield
            one: :data:`titan.data.text.DROP_REASONS`).
    """
    return [piece.decode("utf-8") for piece in _pieces(line.encode("utf-8"), max_bytes)]


# What str.splitlines() ends a line at (its documentation's table), to find lines one at a time.
_LINE_END = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def _lines(text: str) -> Iterator[str]:
    """``text.splitlines()``, one line at a time (a document's lines are not all copied when
    its first few fill the sample)."""
    start = 0
    for end in _LINE_END.finditer(text):
        yield text[start : end.start()]
        start = end.end()
    if start < len(text):
        yield text[start:]


def _sentences(document: str, max_bytes: int) -> tuple[list[str], int]:
    """The document's first sentences (its non-empty lines, cut by :func:`split_line`) that
    fit in ``max_bytes`` UTF-8 bytes, and their size in bytes.

    The budget is applied before the cutting: of a line, only the first ``max_bytes`` left
    plus :data:`MAX_SENTENCE_BYTES` characters are encoded and cut (each a byte at least, they
    hold every piece that can still fit, and the cuts up to them are the whole line's): the
    cost is a scan of the document for line ends and the cutting of at most ``max_bytes``, not
    the cutting of the whole document.
    """
    sentences: list[str] = []
    size = 0
    for line in _lines(document):
        if not line or line.isspace():
            continue
        head = line[: max_bytes - size + MAX_SENTENCE_BYTES + 1]
        for piece in _pieces(head.encode("utf-8"), MAX_SENTENCE_BYTES):
            if size + len(piece) > max_bytes:
                return sentences, size
            sentences.append(piece.decode("utf-8"))
            size += len(piece)
    return sentences, size


def training_sample(
    corpus: Documents, max_bytes: int = SAMPLE_BYTES, dropped: Counter[str] | None = None
) -> list[str]:
    """The sentences the tokenizer trains on: a seeded random sample of the corpus's documents,
    streamed: it holds at most ``max_bytes`` UTF-8 bytes of sentences (twice that while one
    document is being placed), never the corpus.

    Each document draws a key from ``random.Random(SAMPLE_SEED)`` in corpus order; the sample
    is the longest run of documents in key order whose sentences (non-empty lines, each split by
    :func:`split_line` so that none exceeds sentencepiece's ``max_sentence_length``) fit in
    ``max_bytes``. A bottom-k selection (Cohen and Kaplan 2007, "Summarizing data using bottom-k
    sketches"), kept with a heap; a document larger than the budget contributes its first
    sentences that fit.

    Args:
        dropped: counts the records that are not documents, by reason, when given.

    Returns:
        The sample's sentences, documents in corpus order.
    """
    rng = random.Random(SAMPLE_SEED)
    heap: list[tuple[float, int, list[str], int]] = []  # (-key, index, sentences, bytes)
    total, threshold = 0, float("inf")  # threshold: the smallest key ever evicted
    for index, document in enumerate(corpus.documents(dropped)):
        key = rng.random()
        if key >= threshold:
            continue
        sentences, size = _sentences(document, max_bytes)
        heapq.heappush(heap, (-key, index, sentences, size))
        total += size
        while total > max_bytes:
            evicted_key, _, _, evicted_size = heapq.heappop(heap)
            total -= evicted_size
            threshold = min(threshold, -evicted_key)
    return [s for _, _, sentences, _ in sorted(heap, key=lambda item: item[1]) for s in sentences]


def _cache_key(corpus: Documents, vocab_size: int) -> str:
    settings = {**TRAINER_SETTINGS, "vocab_size": vocab_size, "sample_bytes": SAMPLE_BYTES}
    payload = json.dumps({"corpus": corpus.fingerprint(), "settings": settings}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _reporting(lines: list[str], progress: Callable[[int], None] | None) -> Iterator[str]:
    """``lines``, calling ``progress(lines given so far)`` before the first and every
    :data:`REPORT_EVERY_LINES` after."""
    for number, line in enumerate(lines):
        if progress and number % REPORT_EVERY_LINES == 0:
            progress(number)
        yield line


# sentencepiece's failed checks: "INTERNAL: src/trainer_interface.cc(744) [check] reason".
_SENTENCEPIECE_CHECK = re.compile(r"^[A-Z_]+: \S+\(\d+\) (?:\[.*?\] )?")
_TOO_MANY_PIECES = re.compile(r"Vocabulary size too high \(\d+\).*<= (\d+)")
_TOO_FEW_PIECES = re.compile(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)")


def _training_error(message: str, vocab_size: int, source: str) -> str:
    """The one line for a sentencepiece training failure, without its source location and
    check: a vocabulary larger than the corpus yields names the largest that it does, one
    smaller than its characters and the special tokens need names the smallest (sentencepiece's
    own advice names its options, not Titan's). ``source`` names the option that set
    ``vocab_size`` (``--vocab-size ``, ``--model vocab_size=``)."""
    reason = _SENTENCEPIECE_CHECK.sub("", message.strip().splitlines()[-1])
    if most := _TOO_MANY_PIECES.search(reason):
        return (
            f"{source}{vocab_size} is more pieces than --data yields: "
            f"set it to {most[1]} or less, or give more text"
        )
    if least := _TOO_FEW_PIECES.search(reason):
        return (
            f"{source}{vocab_size} is fewer pieces than the characters of --data and the "
            f"special tokens need: set it to {least[1]} or more"
        )
    return f"{source}{vocab_size} cannot be trained on --data: {reason}"


def train_tokenizer(
    corpus: Documents,
    vocab_size: int,
    progress: Callable[[int], None] | None = None,
    source: str = "--vocab-size ",
) -> Tokenizer:
    """Train (or take from the cache) a BPE tokenizer of ``vocab_size`` pieces on ``corpus``.

    Args:
        source: the option that set ``vocab_size``, as its errors name it
            (:func:`titan.config.trained_vocab_source`).
        progress: called with the sample lines handed to the trainer so far, from inside its
            native call (a stop signal checked there; sentencepiece reports what it raises as
            a ``RuntimeError``, so the caller looks at its stop flag first).

    Raises:
        TitanError: when the corpus is too small for ``vocab_size``.
        OSError: the cache cannot be written (checked before training), naming the path.
    """
    cached = cache_dir() / "tokenizers" / f"{_cache_key(corpus, vocab_size)}.model"
    if cached.is_file() and (tokenizer := _cached_tokenizer(cached)) is not None:
        return tokenizer
    writable_dir(cached.parent)  # before the training it would be written after
    dropped: Counter[str] = Counter()
    sample = training_sample(corpus, dropped=dropped)
    if not sample:
        raise TitanError(no_documents(corpus, dropped))
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_reporting(sample, progress),
            model_writer=model,
            vocab_size=vocab_size,
            num_threads=usable_cpus(),
            minloglevel=2,
            **TRAINER_SETTINGS,
        )
    except RuntimeError as err:
        raise TitanError(_training_error(str(err), vocab_size, source)) from None
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    with naming(tmp), open(tmp, "wb") as out:  # whole or not at all: written, fsynced, renamed
        out.write(model.getvalue())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, cached)
    return Tokenizer(model.getvalue())


def _cached_tokenizer(path: Path) -> Tokenizer | None:
    """The trained tokenizer cached at ``path``, or None when it does not load (cut short,
    emptied, overwritten): then it is removed, with one line on stderr, to be trained again."""
    try:
        data = path.read_bytes()
        processor = spm.SentencePieceProcessor(model_proto=data)
        if processor.bos_id() >= 0 and processor.eos_id() >= 0:
            return Tokenizer(data)
        reason = "no BOS or EOS piece"
    except (OSError, RuntimeError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1]
    print(
        f"titan: tokenizer cache {inert(str(path))}: not a tokenizer ({inert(reason)}): "
        "discarded, training again",
        file=sys.stderr,
        flush=True,
    )
    path.unlink(missing_ok=True)
    return None


def tokenizer_files(tokenizer: Tokenizer) -> dict[str, bytes]:
    """The files of ``tokenizer`` in a Hugging Face model directory (relative path -> bytes):
    ``tokenizer.json`` (a Hugging Face tokenizer), ``tokenizer.model`` (sentencepiece) or
    ``original/tokenizer.model`` (tiktoken, where Meta's Llama 3 repositories keep it), each with
    the ``tokenizer_config.json`` beside it that :func:`load_tokenizer` reads back (BOS and EOS
    tokens, ``add_bos_token``, ``add_eos_token``), and ``generation_config.json`` (its
    ``eos_token_id``: every end token, :attr:`Tokenizer.end_ids`)."""
    backend = tokenizer.backend
    config: dict = {"add_bos_token": tokenizer.add_bos, "add_eos_token": tokenizer.add_eos}
    if isinstance(backend, SentencePieceBackend):
        processor = backend.processor
        name, data = "tokenizer.model", processor.serialized_model_proto()
        config |= {"tokenizer_class": "LlamaTokenizer"}
        bos, eos = processor.id_to_piece(tokenizer.bos_id), processor.id_to_piece(tokenizer.eos_id)
    else:
        envelope = json.loads(tokenizer.model_proto)
        bos, eos = envelope["bos_token"], envelope["eos_token"]
        if isinstance(backend, HuggingFaceBackend):
            name, data = "tokenizer.json", envelope["tokenizer"].encode()
            config |= {"tokenizer_class": "PreTrainedTokenizerFast"}
        else:
            name, data = "original/tokenizer.model", envelope["ranks"].encode()
    config |= {"bos_token": bos, "eos_token": eos}
    config_name = str(Path(name).with_name(TOKENIZER_CONFIG))
    ends = {"bos_token_id": tokenizer.bos_id, "eos_token_id": list(tokenizer.end_ids)}
    return {
        name: data,
        config_name: json.dumps(config, indent=2).encode(),
        END_ID_CONFIGS[0]: json.dumps(ends, indent=2).encode(),
    }
