"""Corpus formats chosen per file by name, dropped documents counted by reason."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pytest
import tokenizers as hf_tokenizers
import zstandard
from helpers import events, run_in_process, small_run

from titan.data.mixture import mixture_parts, open_sources
from titan.data.text import DROP_REASONS, PackedBatches, file_format, open_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import (
    MAX_SENTENCE_BYTES,
    StreamDecoder,
    Tokenizer,
    load_tokenizer,
    split_line,
    train_tokenizer,
    training_sample,
)
from titan.errors import TitanError


def _jsonl(docs: list[str], field: str = "text") -> bytes:
    return "".join(json.dumps({field: d}) + "\n" for d in docs).encode()


def _write_parquet(path, docs: list[str], column: str = "text") -> None:
    duckdb.execute(f"COPY (SELECT unnest(?) AS {column}) TO '{path}' (FORMAT parquet)", [docs])


@pytest.fixture()
def mixed_dir(tmp_path):
    """A directory of shards in every format: a.jsonl, b.jsonl.gz, c.jsonl.zst, d.parquet,
    e.txt, each holding known documents."""
    root = tmp_path / "shards"
    root.mkdir()
    (root / "a.jsonl").write_bytes(_jsonl(["alpha one", "alpha two"]))
    (root / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(["beta 🙂", "beta 日本"])))
    (root / "c.jsonl.zst").write_bytes(zstandard.compress(_jsonl(["gamma\nwith lines"])))
    _write_parquet(root / "d.parquet", ["delta one", "delta two", "delta three"])
    (root / "e.txt").write_text("plain text file\nsecond line\n")
    return root


EXPECTED = [
    "alpha one",
    "alpha two",
    "beta 🙂",
    "beta 日本",
    "gamma\nwith lines",
    "delta one",
    "delta two",
    "delta three",
    "plain text file\nsecond line\n",
]


def test_formats_are_chosen_by_file_name():
    names = ["a.jsonl", "b.JSONL.GZ", "c.jsonl.zst", "d.parquet", "e.txt", "f.py", "g.json.gz"]
    names += ["h.ndjson", "i.jsonl.bz2", "j.ndjson.xz"]
    kinds = [file_format(Path(n)) for n in names]
    assert kinds == ["jsonl", "jsonl", "jsonl", "parquet", "text", "text", "text"] + ["jsonl"] * 3


@pytest.mark.parametrize(
    "name, pack",
    [
        ("a.jsonl", lambda data: data),
        ("a.ndjson", lambda data: data),
        ("a.jsonl.bz2", bz2.compress),
        ("a.jsonl.xz", lzma.compress),
    ],
)
def test_json_lines_with_a_byte_order_mark_or_compressed_read_every_record(name, pack, tmp_path):
    data = "\ufeff".encode() + _jsonl(["first", "second"])
    (tmp_path / name).write_bytes(pack(data))
    dropped = Counter()
    assert list(open_corpus(str(tmp_path / name)).documents(dropped)) == ["first", "second"]
    assert not +dropped
    (tmp_path / "b.txt").write_bytes("\ufeffplain".encode())
    assert list(open_corpus(str(tmp_path / "b.txt")).documents()) == ["plain"]


def test_directory_of_mixed_shards_yields_exactly_their_documents(mixed_dir):
    dropped = Counter()
    assert list(open_corpus(str(mixed_dir)).documents(dropped)) == EXPECTED
    assert sum(dropped.values()) == 0


def test_glob_selects_shards_in_sorted_order(mixed_dir):
    corpus = open_corpus(str(mixed_dir / "*.jsonl*"))
    assert [p.name for p in corpus.files] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst"]
    assert list(corpus.documents()) == EXPECTED[:5]
    with pytest.raises(TitanError, match="the pattern matches no files"):
        open_corpus(str(mixed_dir / "*.nothing"))


def test_a_file_whose_name_reads_as_a_glob_is_that_file(tmp_path):
    (tmp_path / "part[1].jsonl").write_bytes(_jsonl(["bracketed"]))
    (tmp_path / "part1.jsonl").write_bytes(_jsonl(["matched by the glob"]))
    assert list(open_corpus(str(tmp_path / "part[1].jsonl")).documents()) == ["bracketed"]
    assert list(open_corpus(str(tmp_path / "part[12].jsonl")).documents()) == [
        "matched by the glob"
    ]
    # Parquet is read through DuckDB, whose read_parquet takes every name as a pattern
    for name, docs in {"p[1]*?.parquet": ["bracketed"], "p1x!.parquet": ["the glob's"]}.items():
        (tmp_path / "pq").mkdir(exist_ok=True)
        _write_parquet(tmp_path / "pq" / name, docs)
    assert list(open_corpus(str(tmp_path / "pq" / "p[1]*?.parquet")).documents()) == ["bracketed"]
    assert list(open_corpus(str(tmp_path / "pq")).documents()) == ["the glob's", "bracketed"]


def test_a_mixture_spec_that_is_an_existing_files_name_is_that_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("c").write_text("the file c\n")
    Path("c:0.5").write_text("the file c:0.5\n")
    (source,) = open_sources("c:0.5")
    assert (source.spec, list(source.corpus.documents())) == ("c:0.5", ["the file c:0.5\n"])
    Path("c:0.5").unlink()  # then the text alone says: c at weight 0.5, the only part
    assert mixture_parts("c:0.5") == [("c", 1.0)]


@pytest.mark.parametrize("entry", ["dangling link", "loop of links", "FIFO"])
def test_an_entry_of_a_data_directory_that_is_no_regular_file_is_refused_naming_it(tmp_path, entry):
    (tmp_path / "a.jsonl").write_bytes(_jsonl(["kept"]))
    bad = tmp_path / "b.jsonl"
    if entry == "dangling link":
        bad.symlink_to(tmp_path / "unmounted" / "b.jsonl")
    elif entry == "loop of links":
        bad.symlink_to(bad)
    else:
        os.mkfifo(bad)
    for spec in (str(tmp_path), str(tmp_path / "*.jsonl")):  # a directory, a glob
        with pytest.raises(TitanError) as raised:
            open_corpus(spec)
        assert str(raised.value).startswith(f"--data {spec}: {bad}: "), str(raised.value)
        assert "\n" not in str(raised.value)


def test_text_field_names_the_json_field_and_parquet_column(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(_jsonl(["from json"], field="content"))
    _write_parquet(tmp_path / "b.parquet", ["from parquet"], column="content")
    corpus = open_corpus(str(tmp_path), text_field="content")
    assert list(corpus.documents()) == ["from json", "from parquet"]
    assert corpus.fingerprint() != open_corpus(str(tmp_path)).fingerprint()
    with pytest.raises(TitanError, match="cannot read a 'text' column"):
        list(open_corpus(str(tmp_path / "b.parquet")).documents())


def test_same_named_files_of_two_folders_are_two_corpora_whatever_names_them(tmp_path, monkeypatch):
    """``c.txt`` in two folders, of one size and modification time (``cp -p``, a tarball), named
    relatively from each: two fingerprints (the token cache's key); the same file named
    relatively and absolutely: one."""
    for name, text in (("p1", "lower case text\n"), ("p2", "UPPER CASE TEXT\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "c.txt").write_text(text)
        os.utime(tmp_path / name / "c.txt", ns=(1_700_000_000_000_000_000,) * 2)
    fingerprints = []
    for name in ("p1", "p2"):
        monkeypatch.chdir(tmp_path / name)
        fingerprints.append(open_corpus("c.txt").fingerprint())
        assert fingerprints[-1] == open_corpus(str(tmp_path / name / "c.txt")).fingerprint()
    assert fingerprints[0] != fingerprints[1]


def test_parquet_is_read_in_batches_across_many_rows(tmp_path):
    docs = [f"document {i}" for i in range(2500)]  # > 2 batches of PARQUET_BATCH_ROWS
    _write_parquet(tmp_path / "big.parquet", docs)
    assert list(open_corpus(str(tmp_path / "big.parquet")).documents()) == docs


def test_dropped_records_are_counted_by_reason(tmp_path):
    lines = [
        json.dumps({"text": "kept"}),
        json.dumps({"text": "   \n"}),  # empty
        json.dumps({"text": 7}),  # non_text
        json.dumps({"body": "no field"}),  # non_text
        json.dumps({"text": "a\u0000b"}),  # nul_bytes
        "{not json",  # bad_json
        "[1, 2]",  # bad_json: not an object
        '{"text": "x", "n": ' + "[" * 100_000 + "]" * 100_000 + "}",  # bad_json: past the stack
        "",  # blank line: not a record
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")  # nul_bytes
    (tmp_path / "blank.txt").write_text("\n\n")  # empty
    dropped = Counter()
    assert list(open_corpus(str(tmp_path)).documents(dropped)) == ["kept"]
    assert dict(dropped) == {"empty": 2, "non_text": 2, "nul_bytes": 2, "bad_json": 3}
    assert set(dropped) == set(DROP_REASONS)


class _Encoder:
    digest = "test-encoder"

    def encode_documents(self, documents, threads=0):
        return [np.array([1, *map(ord, d), 2], dtype=np.int32) for d in documents]


def test_token_stream_carries_the_counts_also_when_cached(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ab"}\n{"text": ""}\nnot json\n')
    corpus = open_corpus(str(tmp_path / "a.jsonl"))
    first = token_stream(corpus, _Encoder())
    again = token_stream(corpus, _Encoder())  # from the cache
    for stream in (first, again):
        assert stream.tokens.tolist() == [1, ord("a"), ord("b"), 2]
        assert stream.documents == 1
        assert stream.dropped == {"empty": 1, "non_text": 0, "nul_bytes": 0, "bad_json": 1}


def test_corpus_of_only_dropped_records_names_the_reasons(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n{"body": "y"}\n')
    line = (
        r"no non-empty document \(dropped: 2 non_text\); non_text: records without a string "
        r"'text' \(--text-field\)"
    )
    with pytest.raises(TitanError, match=line):
        token_stream(open_corpus(str(tmp_path / "a.jsonl")), _Encoder())
    with pytest.raises(TitanError, match=line):  # before a tokenizer is trained on it
        train_tokenizer(open_corpus(str(tmp_path / "a.jsonl")), 512)


def test_split_line_keeps_every_character_and_respects_the_limit():
    line = ("word " * 50 + "🙂日本é\u0301" * 40) * 3
    pieces = split_line(line, max_bytes=64)
    assert "".join(pieces) == line
    assert all(len(p.encode("utf-8")) <= 64 for p in pieces) and len(pieces) > 10
    assert split_line("short") == ["short"]


def test_training_sample_is_bounded_seeded_and_drawn_from_the_whole_corpus(tmp_path):
    docs = [f"document {i} " + "x" * 90 for i in range(400)]  # 100-odd bytes each, 40 kB
    (tmp_path / "a.jsonl").write_bytes(_jsonl(docs))
    corpus = open_corpus(str(tmp_path / "a.jsonl"))
    sample = training_sample(corpus, max_bytes=4000)
    assert 4000 - 110 < sum(len(s.encode()) for s in sample) <= 4000
    assert sample == training_sample(corpus, max_bytes=4000)  # deterministic
    numbers = [int(s.split()[1]) for s in sample]
    assert numbers == sorted(numbers) and max(numbers) > 200 and min(numbers) < 200
    assert numbers != list(range(len(numbers)))  # a sample, not the corpus's head


def test_tokenizer_trains_on_long_lines_instead_of_dropping_them(tmp_path):
    # One line of 60 kB: sentencepiece alone skips lines over max_sentence_length (4192 bytes).
    words = ["zqxvbn", "wplkjh", "mtrgfd"]
    line = " ".join(words[i % 3] for i in range(9000))
    (tmp_path / "long.txt").write_text(line)
    assert len(line.encode()) > 10 * MAX_SENTENCE_BYTES
    sample = training_sample(open_corpus(str(tmp_path / "long.txt")))
    assert "".join(sample) == line
    tokenizer = train_tokenizer(open_corpus(str(tmp_path / "long.txt")), 300)
    for word in words:  # learned as whole pieces: the line was trained on
        assert len(tokenizer.processor.encode(" " + word)) <= 2


def _documents_stream(lengths: list[int]) -> np.ndarray:
    """BOS doc EOS per document, document d's tokens all equal to 10 + d."""
    return np.concatenate([[1, *([10 + d] * n), 2] for d, n in enumerate(lengths)]).astype(
        np.uint32
    )


def _input_positions(loader: PackedBatches, batches: int) -> set[int]:
    seen: set[int] = set()
    for _ in range(batches):
        _, ids = loader.next_batch()
        for start in loader.sequence_starts(ids):
            seen.update((start + np.arange(loader.seq_len)) % len(loader.tokens))
    return {int(p) for p in seen}


def test_every_token_is_trained_within_two_epochs_the_tail_opens_the_next_epoch():
    stream = _documents_stream([3, 5, 40])  # 54 tokens: 3 sequences of 16 leave a tail of 6
    loader = PackedBatches(stream, seq_len=16, batch_size=1, seed=0, bos_id=1)
    assert loader.num_sequences == 3
    epoch0 = _input_positions(loader, 3)
    assert epoch0 == set(range(48))  # the first epoch: the stream's first 3 sequences
    assert set(range(54)) - epoch0 == set(range(48, 54))
    both = epoch0 | _input_positions(loader, 3)
    assert both == set(range(54))  # every token an input within 2 epochs
    # 40, 3, 5: the 5-token document lies wholly in the first epoch's tail (tokens 48 to 52)
    for lengths in ([3, 5, 40], [40, 3, 5]):
        for seed in range(10):
            loader = PackedBatches(
                _documents_stream(lengths), seq_len=16, batch_size=3, seed=seed, bos_id=1
            )
            inputs = np.concatenate([loader.next_batch()[0]["tokens"][:, :-1] for _ in range(2)])
            assert {10, 11, 12} <= set(inputs.ravel().tolist())


def test_a_wrapped_sequence_reads_the_stream_end_then_its_start_and_resumes_exactly():
    stream = _documents_stream([3, 5, 40])
    loader = PackedBatches(stream, seq_len=16, batch_size=1, seed=0, bos_id=1)
    rows = [loader.next_batch() for _ in range(6)]
    wrapped = next(batch for batch, ids in rows if ids[0] == 3)  # epoch 1's first: 48 on
    expected = np.concatenate([stream[48:], stream[:11]])
    np.testing.assert_array_equal(wrapped["tokens"][0], expected)
    np.testing.assert_array_equal(
        wrapped["segment_ids"][0], np.cumsum(expected[:-1] == 1, dtype=np.int32)
    )
    for position in range(7):
        resumed = PackedBatches(stream, seq_len=16, batch_size=1, seed=0, bos_id=1)
        resumed.position = position
        straight = PackedBatches(stream, seq_len=16, batch_size=1, seed=0, bos_id=1)
        for _ in range(position):
            straight.next_batch()
        a, b = resumed.next_batch(), straight.next_batch()
        np.testing.assert_array_equal(a[0]["tokens"], b[0]["tokens"])
        np.testing.assert_array_equal(a[1], b[1])


STREAMED = " Hello world  again 🙂👍🏽 日本語のテキスト e\u0301 n\u0303 Å\u0327 done"


@pytest.fixture(scope="module")
def tokenizer(corpus_dir):
    return train_tokenizer(open_corpus(str(corpus_dir)), 512)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_streamed_decodes_join_to_the_one_decode(tokenizer, chunk):
    ids = tokenizer.processor.encode(STREAMED)
    whole = tokenizer.decode(ids)
    assert whole == STREAMED
    decoder = StreamDecoder(tokenizer)
    parts = [decoder.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    parts.append(decoder.flush())
    assert "".join(parts) == whole
    assert all("\ufffd" not in part for part in parts)  # no half character is ever emitted
    naive = "".join(tokenizer.decode(ids[i : i + chunk]) for i in range(0, len(ids), chunk))
    assert naive != whole  # what decoding chunks alone gives


def test_stream_decoder_holds_back_an_incomplete_character_until_flushed(tokenizer):
    emoji = tokenizer.processor.encode("🙂")[-4:]  # four byte-fallback pieces
    decoder = StreamDecoder(tokenizer)
    assert decoder.push(tokenizer.processor.encode("a")) == "a"
    assert decoder.push(emoji[:3]) == ""  # the emoji's last byte is missing
    assert decoder.push(emoji[3:]) == "🙂"
    assert decoder.push(emoji[:2]) == ""
    assert decoder.flush() == "\ufffd\ufffd"  # the end of the stream: shown as it is


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, corpus_dir):
    """A real byte-level BPE ``tokenizer.json`` (Llama 3's kind: BOS in its post-processor
    template, EOS only in ``tokenizer_config.json``) trained on the test corpus."""
    root = tmp_path_factory.mktemp("hf")
    tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
    tok.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf_tokenizers.decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = hf_tokenizers.trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [p.read_text() for p in sorted(corpus_dir.iterdir())]
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = hf_tokenizers.processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    return root


def test_hugging_face_tokenizer_json_takes_bos_and_eos_from_its_config(hf_dir):
    tok = load_tokenizer(hf_dir / "tokenizer.json")
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 600)
    (ids,) = tok.encode_documents(["a"])
    assert ids[0] == 0 and ids[-1] == 1 and (ids == 0).sum() == 1 and (ids == 1).sum() == 1
    assert tok.decode(tok.encode(STREAMED)) == STREAMED
    copy = Tokenizer(tok.model_proto)  # the run dir's tokenizer.model, as processes share it
    assert copy.encode(STREAMED) == tok.encode(STREAMED) and copy.eos_id == 1


@pytest.mark.parametrize("chunk", [1, 2])
def test_hugging_face_streamed_decodes_join_to_the_one_decode(hf_dir, chunk):
    tok = load_tokenizer(hf_dir / "tokenizer.json")
    ids = tok.encode(STREAMED)
    decoder = StreamDecoder(tok)
    parts = [decoder.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    assert "".join(parts) + decoder.flush() == STREAMED


def test_hugging_face_tokenizer_without_eos_or_unreadable_is_refused(hf_dir, tmp_path):
    shutil.copy(hf_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(TitanError, match="names no EOS token"):
        load_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "bad.json").write_text('{"model": 3}')
    with pytest.raises(TitanError, match="is not a Hugging Face tokenizer"):
        load_tokenizer(tmp_path / "bad.json")


@pytest.mark.slow
def test_run_on_shards_with_a_tokenizer_json_records_drops_and_resumes(mixed_dir, hf_dir, tmp_path):
    (mixed_dir / "blob.bin").write_bytes(b"\x00binary")
    (mixed_dir / "f.jsonl").write_bytes(_jsonl([" ", "x" * 3000]) + b"{oops\n")
    options = small_run(
        mixed_dir,
        tmp_path / "runs",
        tokenizer=str(hf_dir / "tokenizer.json"),
        seq_len=16,
        batch_size=4,
        dp=1,
        steps=2,
        checkpoint_every=1,
        run_id="hf",
    )
    code, run_dir = run_in_process(options)
    code_resumed, _ = run_in_process({**options, "steps": 3}, resume=run_dir)
    assert (code, code_resumed) == (0, 0)
    first, resumed = events(run_dir, "run_start")
    assert first["data"]["documents"] == len(EXPECTED) + 1
    assert first["data"]["dropped"] == {"empty": 1, "non_text": 0, "nul_bytes": 1, "bad_json": 1}
    assert resumed["data"] == first["data"] and resumed["tokenizer"]["vocab_size"] == 600
    assert [e["step"] for e in events(run_dir, "step")] == [1, 2, 3]
