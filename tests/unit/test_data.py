"""Tokenizer and data: Llama convention, caching, corpus formats, packing and resumable order."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest

from titan.data.text import PackedBatches, open_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import load_tokenizer, train_tokenizer
from titan.errors import TitanError


@pytest.fixture(scope="module")
def tokenizer(corpus_dir):
    return train_tokenizer(open_corpus(str(corpus_dir)), 512)


def test_trained_tokenizer_follows_llama_convention(tokenizer):
    sp = tokenizer.processor
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    assert tokenizer.vocab_size == 512
    text = "def f(x):\n    return x  # 日本語 🙂 ünïcödé\n"
    assert tokenizer.decode(sp.encode(text)) == text  # byte fallback: nothing unknown
    assert sp.unk_id() not in sp.encode(text)


def test_tokenizer_is_cached_by_corpus_and_settings(corpus_dir, tokenizer, titan_cache):
    cached = list((titan_cache / "tokenizers").glob("*.model"))
    again = train_tokenizer(open_corpus(str(corpus_dir)), 512)
    assert again.model_proto == tokenizer.model_proto
    assert sorted((titan_cache / "tokenizers").glob("*.model")) == sorted(cached)
    other = train_tokenizer(open_corpus(str(corpus_dir)), 600)
    assert other.vocab_size == 600


def test_saved_model_loads_and_bad_files_are_rejected(tokenizer, tmp_path):
    path = tmp_path / "tok.model"
    path.write_bytes(tokenizer.model_proto)
    assert load_tokenizer(path).vocab_size == 512
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(TitanError, match="is not a sentencepiece model"):
        load_tokenizer(tmp_path / "junk.model")


def test_every_document_gets_one_bos_and_one_eos(tokenizer):
    docs = ["alpha beta", "gamma", "x = 1\n"]
    encoded = tokenizer.encode_documents(docs)
    for ids in encoded:
        assert ids[0] == 1 and ids[-1] == 2
        assert (ids == 1).sum() == 1 and (ids == 2).sum() == 1
    assert [tokenizer.decode(ids[1:-1].tolist()) for ids in encoded] == docs


def test_corpus_formats_give_the_same_documents(tmp_path):
    docs = ["first document\nline two", "second one", "third"]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    duckdb.execute(
        f"COPY (SELECT unnest(?) AS text) TO '{tmp_path / 'd.parquet'}' (FORMAT parquet)", [docs]
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"{i}.txt").write_text(d)
    (folder / "blob.bin").write_bytes(b"\x00\x01binary")
    for spec in ("d.jsonl", "d.parquet", "folder"):
        assert list(open_corpus(str(tmp_path / spec)).documents()) == docs


def test_stdlib_corpus_is_real_python_source():
    corpus = open_corpus("stdlib")
    assert len(corpus.files) > 500
    assert any(f.name == "argparse.py" for f in corpus.files)


def _batches(stream, position=0):
    return PackedBatches(stream, seq_len=16, batch_size=4, seed=7, bos_id=1, position=position)


def test_packing_visits_each_sequence_once_per_epoch_and_resumes_exactly(corpus_dir, tokenizer):
    stream = token_stream(open_corpus(str(corpus_dir)), tokenizer).tokens
    assert stream[0] == 1 and stream[-1] == 2
    loader = _batches(stream)
    epoch = loader.num_sequences // loader.batch_size
    seen = np.concatenate([loader.next_batch()[1] for _ in range(epoch)])
    assert len(set(seen.tolist())) == len(seen)
    first, ids = _batches(stream).next_batch()
    np.testing.assert_array_equal(first["tokens"][0], stream[ids[0] * 16 : ids[0] * 16 + 17])
    np.testing.assert_array_equal(first["segment_ids"][0], np.cumsum(first["tokens"][0, :-1] == 1))
    straight = _batches(stream)
    for _ in range(5):
        straight.next_batch()
    resumed = _batches(stream, position=straight.position)
    np.testing.assert_array_equal(straight.next_batch()[1], resumed.next_batch()[1])


def test_too_small_corpus_is_rejected(tokenizer):
    with pytest.raises(TitanError, match="fewer than --batch-size"):
        PackedBatches(np.ones(40, np.uint32), seq_len=16, batch_size=4, seed=0, bos_id=1)


def test_event_records_are_standard_json_and_readers_skip_foreign_lines(tmp_path):
    from titan.telemetry.events import Mfu, Step
    from titan.telemetry.records import EventTail, RunRecord

    record = RunRecord(tmp_path, "r")
    record.emit(Step(step=1, loss=float("nan"), mfu=Mfu(causal=float("inf"))))
    record.close()
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('[1, 2, 3]\n{"type": "step"}\n{"no": "type"}\n{"type": "x", "time": 1.0}\n')
    text = (tmp_path / "events.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    tail = EventTail(tmp_path / "events.jsonl")
    events = tail.read_new()
    assert [e["type"] for e in events] == ["step", "x"]
    assert events[0]["loss"] is None and events[0]["mfu"] == {"causal": None}
    assert tail.bad_lines == 3


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01")
    with pytest.raises(TitanError, match=r"no non-empty document \(dropped: 1 nul_bytes\)$"):
        train_tokenizer(open_corpus(str(tmp_path)), 512)
