"""Llama-convention sentencepiece tokenizer: load one, or train one on the corpus (cached).

Convention (Llama 1/2 ``tokenizer.model``): unk = 0, bos = 1, eos = 2, no pad, byte fallback so
that no text is ever out of vocabulary. Trained tokenizers use BPE (as Llama does) with identity
normalisation and whitespace kept, so that source code round-trips, and split digits.

Training reads a deterministic sample of the corpus (:data:`SAMPLE_CHARS` characters of lines
from documents in a seeded order) and takes seconds. The result is cached under
``$TITAN_CACHE`` (default ``~/.cache/titan``) keyed by the corpus fingerprint and every trainer
setting, so a second run on the same corpus reuses it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from titan.data.cache import cache_dir
from titan.data.text import Corpus
from titan.errors import TitanError

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SAMPLE_CHARS = 4_000_000
SAMPLE_SEED = 0
REPORT_EVERY_LINES = 4096
TRAINER_SETTINGS = {
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
}


@dataclass(frozen=True)
class Tokenizer:
    """A loaded sentencepiece model.

    Attributes:
        model_proto: the serialized ``.model`` bytes (copied into each run dir).
    """

    model_proto: bytes

    @property
    def processor(self) -> spm.SentencePieceProcessor:
        return _processor(self.model_proto)

    @property
    def vocab_size(self) -> int:
        return self.processor.vocab_size()

    @property
    def bos_id(self) -> int:
        return self.processor.bos_id()

    @property
    def eos_id(self) -> int:
        return self.processor.eos_id()

    @property
    def digest(self) -> str:
        """sha256 of the model bytes (hex, 16 chars): identifies the tokenizer in cache keys."""
        return hashlib.sha256(self.model_proto).hexdigest()[:16]

    def encode_documents(self, texts: list[str], threads: int = 0) -> list[np.ndarray]:
        """Token ids of each document with exactly one BOS before and one EOS after.

        Returns:
            One int32 array per document, shape (len + 2,).
        """
        ids = self.processor.encode(texts, num_threads=threads or (os.cpu_count() or 1))
        return [np.asarray([self.bos_id, *doc, self.eos_id], dtype=np.int32) for doc in ids]

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)


_PROCESSORS: dict[bytes, spm.SentencePieceProcessor] = {}


def _processor(model_proto: bytes) -> spm.SentencePieceProcessor:
    if model_proto not in _PROCESSORS:
        _PROCESSORS[model_proto] = spm.SentencePieceProcessor(model_proto=model_proto)
    return _PROCESSORS[model_proto]


def _check_convention(tokenizer: Tokenizer, source: str) -> Tokenizer:
    if tokenizer.bos_id < 0 or tokenizer.eos_id < 0:
        raise TitanError(f"--tokenizer {source} defines no BOS or EOS piece (Llama convention)")
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a sentencepiece ``.model`` (e.g. a Llama ``tokenizer.model``).

    Raises:
        TitanError: the file is missing or unreadable, is not a sentencepiece model, or has no
            BOS/EOS.
    """
    path = Path(path)
    if not path.is_file():
        raise TitanError(f"--tokenizer {path}: no such file")
    try:
        proto = path.read_bytes()
    except OSError as err:
        raise TitanError(f"--tokenizer {path}: cannot read it: {err.strerror or err}") from None
    try:
        spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as err:
        raise TitanError(f"--tokenizer {path} is not a sentencepiece model ({err})") from None
    return _check_convention(Tokenizer(proto), str(path))


def training_sample(corpus: Corpus, max_chars: int = SAMPLE_CHARS) -> list[str]:
    """Non-empty lines of documents taken in a seeded order until ``max_chars`` characters."""
    documents = list(corpus.documents())
    random.Random(SAMPLE_SEED).shuffle(documents)
    lines, total = [], 0
    for doc in documents:
        for line in doc.splitlines():
            if line.strip():
                lines.append(line)
                total += len(line)
        if total >= max_chars:
            break
    return lines


def _cache_key(corpus: Corpus, vocab_size: int) -> str:
    settings = {**TRAINER_SETTINGS, "vocab_size": vocab_size, "sample_chars": SAMPLE_CHARS}
    payload = json.dumps({"corpus": corpus.fingerprint(), "settings": settings}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _reporting(lines: list[str], progress: Callable[[int], None] | None) -> Iterator[str]:
    """``lines``, calling ``progress(lines given so far)`` before the first and every
    :data:`REPORT_EVERY_LINES` after."""
    for number, line in enumerate(lines):
        if progress and number % REPORT_EVERY_LINES == 0:
            progress(number)
        yield line


def train_tokenizer(
    corpus: Corpus, vocab_size: int, progress: Callable[[int], None] | None = None
) -> Tokenizer:
    """Train (or take from the cache) a BPE tokenizer of ``vocab_size`` pieces on ``corpus``.

    Args:
        progress: called with the sample lines handed to the trainer so far, from inside its
            native call (a stop signal checked there; sentencepiece reports what it raises as
            a ``RuntimeError``, so the caller looks at its stop flag first).

    Raises:
        TitanError: when the corpus is too small for ``vocab_size``.
    """
    cached = cache_dir() / "tokenizers" / f"{_cache_key(corpus, vocab_size)}.model"
    if cached.is_file():
        return Tokenizer(cached.read_bytes())
    sample = training_sample(corpus)
    if not sample:
        raise TitanError(f"--data {corpus.spec}: no non-empty text document")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_reporting(sample, progress),
            model_writer=model,
            vocab_size=vocab_size,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
            **TRAINER_SETTINGS,
        )
    except RuntimeError as err:
        reason = str(err).strip().splitlines()[-1]
        raise TitanError(
            f"--vocab-size {vocab_size} cannot be trained on --data: {reason}"
        ) from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(model.getvalue())
    os.replace(tmp, cached)
    return Tokenizer(model.getvalue())
