"""Corpora at scale: tokenization streamed through worker processes under a memory limit,
resumed after an interruption; weighted mixtures that keep their weights and resume exactly."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import zstandard

from titan.data.mixture import BLOCK_SEQUENCES, MixtureBatches, open_sources
from titan.data.text import PackedBatches, batch_digest, open_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import load_tokenizer
from titan.errors import TitanError

ROOT = Path(__file__).parents[2]
WORD = "abcdefghij" * 20  # one piece of the tokenizer below: 200 characters
WORDS_PER_DOC = 5000  # 1 MB documents
LIMIT_BYTES = 256 << 20  # address space of each tokenizing process
CORPUS_DOCS = 3 * LIMIT_BYTES // (len(WORD) + 1) // WORDS_PER_DOC + 1  # over 3 x the limit


def _word_tokenizer(path: Path) -> Path:
    """A sentencepiece BPE model (trained here) with WORD as a user-defined piece: encodes the
    big corpus at tens of MB/s, so that a test can afford several times a memory limit."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["hello world", WORD[:100], "abc def"] * 50),
        model_writer=model,
        vocab_size=300,
        model_type="bpe",
        byte_fallback=True,
        user_defined_symbols=[WORD],
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())
    return path


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """A .jsonl.zst shard of CORPUS_DOCS 1 MB documents: over 3 x LIMIT_BYTES of text, a few
    MB on disk."""
    path = tmp_path_factory.mktemp("big") / "big.jsonl.zst"
    line = (json.dumps({"text": " ".join([WORD] * WORDS_PER_DOC)}) + "\n").encode()
    with open(path, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as out:
        for _ in range(CORPUS_DOCS):
            out.write(line)
    return path


def _limited(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python whose address space (and its workers', inherited) is LIMIT_BYTES."""
    prelude = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_BYTES}, {LIMIT_BYTES}))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MALLOC_ARENA_MAX": "1",  # glibc reserves 64 MB of address space per thread arena
        "OPENBLAS_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


TOKENIZE = """
import json
from titan.data.text import open_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import load_tokenizer
if __name__ == "__main__":
    stream = token_stream(open_corpus(sys.argv[1]), load_tokenizer(sys.argv[2]), workers=2)
    peak = [l for l in open("/proc/self/status") if l.startswith("VmPeak")][0].split()[1]
    print(json.dumps({"tokens": len(stream.tokens), "documents": stream.documents,
                      "peak_kb": int(peak)}))
"""


@pytest.mark.slow
def test_a_corpus_three_times_the_memory_limit_is_tokenized_completely(
    big_corpus, tmp_path, monkeypatch
):
    tokenizer = _word_tokenizer(tmp_path / "word.model")
    cache = tmp_path / "cache"
    monkeypatch.setenv("TITAN_CACHE", str(cache))
    # the limit bites: holding the corpus's documents does not fit
    whole = _limited(
        "from titan.data.text import open_corpus\nlist(open_corpus(sys.argv[1]).documents())",
        str(big_corpus),
    )
    assert whole.returncode != 0 and "MemoryError" in whole.stderr
    done = _limited(TOKENIZE, str(big_corpus), str(tokenizer))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["documents"] == CORPUS_DOCS
    assert result["tokens"] == CORPUS_DOCS * (2 * WORDS_PER_DOC + 2)  # BOS (space WORD)... EOS
    assert result["peak_kb"] * 1024 <= LIMIT_BYTES
    tokens = token_stream(open_corpus(str(big_corpus)), load_tokenizer(tokenizer)).tokens
    space, word = load_tokenizer(tokenizer).encode(WORD)
    counts = np.bincount(tokens, minlength=300)
    assert counts[[1, 2, space, word]].tolist() == [CORPUS_DOCS] * 2 + [CORPUS_DOCS * 5000] * 2


class _Interrupted(Exception):
    pass


class _Counting:
    """A tokenizer that counts the documents it encodes (the encoding is the real one)."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.encoded = tokenizer, 0
        self.digest, self.model_proto = tokenizer.digest, tokenizer.model_proto

    def encode_documents(self, texts, threads=0):
        self.encoded += len(texts)
        return self.inner.encode_documents(texts, threads)

    def spans(self, text, piece_chars):
        return self.inner.spans(text, piece_chars)


def _stopped_after_chunks(corpus, tokenizer, chunk_chars: int, chunks: int) -> tuple[list, dict]:
    """Tokenize ``corpus`` into ``$TITAN_CACHE``, interrupted after ``chunks`` chunks (as a stop
    signal raises in the progress callback); returns the reports and the commit left."""
    reports: list = []

    def stop(progress) -> None:
        reports.append(progress)
        if len(reports) == chunks:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        token_stream(corpus, tokenizer, stop, chunk_chars=chunk_chars)
    partial = next((Path(os.environ["TITAN_CACHE"]) / "tokens").glob("*.partial"))
    commit = json.loads(partial.with_name(partial.stem + ".commit.json").read_text())
    return reports, commit


def _shards(root: Path, files: int, docs: int) -> Path:
    root.mkdir()
    for f in range(files):
        lines = [json.dumps({"text": f"file {f} document {d} " * (1 + d % 7)}) for d in range(docs)]
        (root / f"{f:02d}.jsonl").write_text("\n".join(["", *lines, '{"text": ""}']))
    return root


def test_interrupted_tokenization_resumes_where_it_committed(tokenizer, tmp_path, monkeypatch):
    corpus = open_corpus(str(_shards(tmp_path / "shards", files=3, docs=700)))
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "whole"))
    whole = token_stream(corpus, tokenizer, workers=2, chunk_chars=20_000)  # worker processes
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cache"))
    counting = _Counting(tokenizer)
    reports, commit = _stopped_after_chunks(corpus, counting, 20_000, 3)
    assert commit["tokens"] == reports[-1].tokens and commit["documents"] == reports[-1].documents
    assert reports[-1].documents < 2100 and reports[-1].bytes_done < reports[-1].bytes_total
    partial = next((tmp_path / "cache" / "tokens").glob("*.partial"))
    with open(partial, "ab") as f:  # a write the crash left uncommitted
        f.write(b"\x07" * 12)
    counting.encoded = 0
    resumed = token_stream(corpus, counting, chunk_chars=20_000)
    assert counting.encoded == 2100 - commit["documents"]  # nothing encoded twice
    assert resumed.tokens.tobytes() == whole.tokens.tobytes()
    assert (resumed.documents, resumed.dropped) == (whole.documents, whole.dropped)
    assert resumed.documents == 2100 and resumed.dropped["empty"] == 3
    # the digest of the token bytes, the committed ones read back on resume
    assert resumed.digest == whole.digest == hashlib.sha256(whole.tokens.tobytes()).hexdigest()
    assert not list((tmp_path / "cache" / "tokens").glob("*.partial"))


def _one_document(corpus_dir: Path, path: Path) -> str:
    """A plain text file (one document) of the test corpus's modules, about 0.9 MB."""
    text = "\n".join(f.read_text() for f in sorted(corpus_dir.iterdir()))
    path.write_text(text)
    return text


def test_a_document_longer_than_a_chunk_is_chunked_with_the_ids_of_one_encoding(
    tokenizer, corpus_dir, tmp_path, monkeypatch
):
    text = _one_document(corpus_dir, tmp_path / "one.txt")
    corpus = open_corpus(str(tmp_path / "one.txt"))
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "whole"))
    whole = token_stream(corpus, tokenizer)  # one chunk
    assert np.array_equal(whole.tokens, tokenizer.encode_documents([text])[0])
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cut"))
    reports: list = []
    cut = token_stream(corpus, tokenizer, reports.append, workers=2, chunk_chars=40_000)
    assert cut.tokens.tobytes() == whole.tokens.tobytes() and cut.documents == 1
    done = [r.bytes_done for r in reports]
    assert len(done) >= len(text) // 40_000 and done == sorted(done)
    assert done[-1] == reports[-1].bytes_total
    assert 0 < done[len(done) // 2] < done[-1]  # progress inside the one document


def test_a_tokenization_stopped_inside_a_long_document_resumes_inside_it(
    tokenizer, corpus_dir, tmp_path, monkeypatch
):
    text = _one_document(corpus_dir, tmp_path / "one.txt")
    corpus = open_corpus(str(tmp_path / "one.txt"))
    whole = tokenizer.encode_documents([text])[0]
    # stopped early in it, and before its last, short piece (shorter than a chunk)
    for chunk_chars, chunks in ((40_000, 3), (len(text) // 2 - 10_000, 2)):
        monkeypatch.setenv("TITAN_CACHE", str(tmp_path / f"cache-{chunks}"))
        _, commit = _stopped_after_chunks(corpus, tokenizer, chunk_chars, chunks)
        assert commit["documents"] == 0 and 0 < commit["document_chars"] < len(text)
        counting = _Counting(tokenizer)
        resumed = token_stream(corpus, counting, chunk_chars=chunk_chars)
        assert np.array_equal(resumed.tokens, whole)
        assert resumed.documents == 1 and counting.encoded < len(text) // chunk_chars  # not from 0
        assert resumed.digest == hashlib.sha256(resumed.tokens.tobytes()).hexdigest()


@pytest.fixture(scope="module")
def tokenizer(corpus_dir):
    from titan.data.tokenizer import train_tokenizer

    return train_tokenizer(open_corpus(str(corpus_dir)), 512)


def _parts(sizes: list[int], seq_len: int = 4) -> list[PackedBatches]:
    return [
        PackedBatches(np.arange(n, dtype=np.uint32) + 10_000 * c, seq_len, 1, 7, 1, salt=(c,))
        for c, n in enumerate(sizes)
    ]


def test_mixture_weights_hold_within_sampling_error_and_are_deterministic():
    weights = [0.7, 0.2, 0.1]
    mixture = MixtureBatches(_parts([4001, 801, 2001]), weights, 16, seed=3)
    batches = [mixture.next_batch() for _ in range(300)]  # 4800 sequences, past a block
    ids = np.concatenate([ids for _, ids in batches])
    share = np.bincount(ids % 3, minlength=3) / len(ids)
    for w, s in zip(weights, share, strict=True):
        assert abs(s - w) <= 3 * math.sqrt(w * (1 - w) / len(ids))
    first_block = np.bincount(ids[:BLOCK_SEQUENCES] % 3)
    assert first_block.tolist() == [2867, 819, 410]  # Hamilton's rounding of w x 4096
    for c, part in enumerate(mixture.parts):  # each part's epoch visits a sequence once
        local = ids[ids % 3 == c] // 3
        for start in range(0, len(local), part.num_sequences):
            epoch = local[start : start + part.num_sequences]
            assert len(set(epoch.tolist())) == len(epoch)
    tokens, _ = batches[0]
    part_of_row = (tokens["tokens"][:, 0] // 10_000).tolist()
    assert part_of_row == (ids[:16] % 3).tolist()  # rows come from the part their id names
    again = MixtureBatches(_parts([4001, 801, 2001]), weights, 16, seed=3)
    assert [batch_digest(again.next_batch()[1]) for _ in range(300)] == [
        batch_digest(i) for _, i in batches
    ]
    other = MixtureBatches(_parts([4001, 801, 2001]), weights, 16, seed=4)
    assert batch_digest(other.next_batch()[1]) != batch_digest(batches[0][1])


def test_mixture_resumed_mid_epoch_replays_nothing_and_reads_only_its_rows():
    weights = [0.5, 0.5]
    straight = MixtureBatches(_parts([401, 901]), weights, 8, seed=1)
    expected = [straight.next_batch() for _ in range(60)]
    first = MixtureBatches(_parts([401, 901]), weights, 8, seed=1)
    seen = [first.next_batch() for _ in range(23)]  # 184 sequences: mid-epoch of both parts
    rows = np.array([1, 4, 6])
    resumed = MixtureBatches(_parts([401, 901]), weights, 8, seed=1, position=first.position)
    resumed.rows = rows  # a process that holds rows 1, 4 and 6 of each global batch
    rest = [resumed.next_batch() for _ in range(37)]
    for (_, ids), (_, want_ids) in zip(seen + rest, expected, strict=True):
        assert (ids == want_ids).all()
    for (batch, _), (want, _) in zip(rest, expected[23:], strict=True):
        assert (batch["tokens"] == want["tokens"][rows]).all()
        assert (batch["segment_ids"] == want["segment_ids"][rows]).all()
    ids = np.concatenate([i for _, i in expected])
    assert len(set(ids.tolist())) == len(ids)  # 480 sequences, neither part past an epoch


def test_mixture_specs_are_parsed_and_bad_ones_named(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.txt").write_text("web text")
    (tmp_path / "code.txt").write_text("code")
    sources = open_sources(f"{tmp_path}/web/*.txt:3,{tmp_path}/code.txt:1")
    assert [(s.weight, len(s.corpus.files)) for s in sources] == [(0.75, 1), (0.25, 1)]
    assert len(open_sources(str(tmp_path / "code.txt"))) == 1
    with pytest.raises(TitanError, match="has no ':WEIGHT'"):
        open_sources(f"{tmp_path}/code.txt,{tmp_path}/web:1")
    with pytest.raises(TitanError, match="needs a finite weight > 0, got 0.0"):
        open_sources(f"{tmp_path}/code.txt:0,{tmp_path}/web:1")
    with pytest.raises(TitanError, match="no such file"):
        open_sources(f"{tmp_path}/nothing:1,{tmp_path}/web:1")
