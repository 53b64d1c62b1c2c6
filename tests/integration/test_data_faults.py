"""Damaged data is never used silently: a token cache that does not match its record is
rebuilt (saying so), a cut-short or corrupt compressed shard is a one-line error naming it, a
document that is no Unicode text is counted and skipped, ``--data`` that is neither a file nor a
directory is named as such, and sampling a huge one-line document cuts only what the sample
can hold."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zstandard

from titan.cli import main
from titan.data import tokenize as tokenize_module
from titan.data.cache import naming
from titan.data.text import open_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import split_line, train_tokenizer, training_sample
from titan.errors import TitanError
from titan.stopping import StopRequested


@pytest.fixture(scope="module")
def tokenizer(corpus_dir):
    return train_tokenizer(open_corpus(str(corpus_dir)), 512)


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of the test's own (the token files below are the test's to damage)."""
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokens"


@pytest.fixture()
def small_corpus(tmp_path, corpus_dir):
    root = tmp_path / "corpus"
    root.mkdir()
    for name in ("bisect.py", "heapq.py", "textwrap.py"):
        shutil.copyfile(corpus_dir / name, root / name)
    return open_corpus(str(root))


def _cut_to_a_third(path: Path) -> None:  # a whole number of tokens: 4-byte aligned
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3 // 4 * 4)


def _torn_token(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3 // 4 * 4 + 2)


def _appended(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(np.arange(5, dtype=np.uint32).tobytes())


def _emptied(path: Path) -> None:
    path.write_bytes(b"")


def _record_of_an_older_titan(path: Path) -> None:
    record = path.with_suffix(".json")
    payload = json.loads(record.read_text())
    del payload["tokens"]
    record.write_text(json.dumps(payload))


def _record_torn(path: Path) -> None:
    path.with_suffix(".json").write_text('{"tokens": 1')


DAMAGE = {
    "cut to a third": (_cut_to_a_third, "bytes, but its record says"),
    "cut inside a token": (_torn_token, "bytes, but its record says"),
    "tokens appended": (_appended, "bytes, but its record says"),
    "emptied": (_emptied, ": 0 bytes, but its record says"),
    "record of an older titan": (_record_of_an_older_titan, "no token count"),
    "record torn": (_record_torn, "not JSON"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_token_cache_that_does_not_match_its_record_is_rebuilt_saying_so(
    damage, tokenizer, small_corpus, cache, capsys
):
    whole = token_stream(small_corpus, tokenizer)
    tokens = whole.tokens.tobytes()
    (path,) = cache.glob("*.u32")
    assert len(tokens) > 40_000 and capsys.readouterr().err == ""
    damage_it, reason = DAMAGE[damage]
    damage_it(path)
    rebuilt = token_stream(small_corpus, tokenizer)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and reason in lines[0], lines
    assert lines[0].startswith("titan: token cache ")
    assert lines[0].endswith(": discarded, tokenizing again")
    assert rebuilt.tokens.tobytes() == tokens
    assert (rebuilt.documents, rebuilt.dropped) == (whole.documents, whole.dropped)
    again = token_stream(small_corpus, tokenizer)  # the rebuilt file matches its record
    assert again.tokens.tobytes() == tokens and capsys.readouterr().err == ""
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".lock", ".u32"]
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["tokens"] == len(whole.tokens) == len(tokens) // 4


JSONL = b"".join(
    json.dumps({"text": f"document {i}: " + "words of text " * 20}).encode() + b"\n"
    for i in range(3000)
)


def _flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 16]) + data[middle + 16 :]


SHARDS = {
    "zst cut short": ("a.jsonl.zst", zstandard.compress(JSONL)[:-200]),
    "zst cut to its header": ("a.jsonl.zst", zstandard.compress(JSONL)[:6]),
    "zst followed by other bytes": ("a.jsonl.zst", zstandard.compress(JSONL) + b"not zstd"),
    "gz cut short": ("a.jsonl.gz", gzip.compress(JSONL)[:-200]),
    "gz corrupt": ("a.jsonl.gz", _flipped(gzip.compress(JSONL))),
    "gz that is no gzip": ("a.jsonl.gz", JSONL),
}


@pytest.mark.parametrize("shard", SHARDS, ids=list(SHARDS))
def test_a_cut_short_or_corrupt_compressed_shard_is_an_error_naming_it(shard, tmp_path):
    name, data = SHARDS[shard]
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "0.jsonl").write_bytes(JSONL[:1000])
    path = tmp_path / "shards" / name
    path.write_bytes(data)
    with pytest.raises(TitanError) as caught:
        list(open_corpus(str(tmp_path / "shards")).documents(Counter()))
    message = str(caught.value)
    assert message.startswith(f"--data {tmp_path / 'shards'}: {path} is cut short or corrupt (")
    assert "\n" not in message


def test_titan_tokenize_of_a_cut_short_shard_exits_2_with_one_line(
    tokenizer, tmp_path, cache, capsys
):
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tokenizer.model_proto)
    shard = tmp_path / "a.jsonl.zst"
    shard.write_bytes(zstandard.compress(JSONL)[: len(zstandard.compress(JSONL)) // 2])
    code = main(["tokenize", "--data", str(shard), "--tokenizer", str(model)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"titan tokenize: error: --data {shard}: {shard} is cut short or corrupt "
        "(the file ends inside a zstd frame)\n"
    )
    assert cache.is_dir() and not list(cache.glob("*.partial"))  # nothing committed: no start


def test_a_zst_shard_of_several_frames_is_read_whole(tmp_path):
    frames = [JSONL[:100_000], JSONL[100_000:]]  # as zstd -T, pzstd or cat write them
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(zstandard.compress(frame) for frame in frames))
    documents = list(open_corpus(str(path)).documents())
    assert documents == [json.loads(line)["text"] for line in JSONL.splitlines()]


def test_a_document_that_is_no_unicode_text_is_counted_and_skipped(tokenizer, tmp_path, cache):
    lines = [
        '{"text": "kept before"}',
        '{"text": "a lone surrogate \\ud800 in it"}',
        '{"text": "a lone low surrogate \\uDC00"}',
        '{"text": "a pair \\ud83d\\ude00 is one character", "url": "x"}',
        '{"text": "kept after", "title": "\\ud800 outside the text field"}',
    ]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    corpus = open_corpus(str(path))
    dropped: Counter[str] = Counter()
    expected = ["kept before", "a pair 😀 is one character", "kept after"]
    assert list(corpus.documents(dropped)) == expected
    assert dropped["bad_json"] == 2
    assert "".join(training_sample(corpus)) == "".join(expected)
    stream = token_stream(corpus, tokenizer)
    assert stream.documents == 3 and stream.dropped["bad_json"] == 2
    starts = np.flatnonzero(stream.tokens == tokenizer.bos_id)
    decoded = [tokenizer.decode(doc[1:-1].tolist()) for doc in np.split(stream.tokens, starts[1:])]
    assert decoded == expected


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_data_that_is_neither_a_file_nor_a_directory_is_named_as_such(kind, tmp_path):
    path = tmp_path / "fifo"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path(os.devnull)
    with pytest.raises(TitanError, match=r"not a regular file or directory \(a FIFO, a device\)"):
        open_corpus(str(path))


def _first_sentences_that_fit(document: str, max_bytes: int) -> list[str]:
    """The sample of one document by its definition: every non-empty line cut whole by
    :func:`split_line`, the pieces taken while they fit."""
    pieces = [p for line in document.splitlines() if line.strip() for p in split_line(line)]
    taken, size = [], 0
    for piece in pieces:
        size += len(piece.encode())
        if size > max_bytes:
            break
        taken.append(piece)
    return taken


def test_a_long_one_line_document_is_sampled_as_if_cut_whole(tmp_path):
    words = ["alpha", "beta", "日本語", "épsilon", "🙂", "x" * 3000]
    rng = np.random.default_rng(0)
    line = " ".join(words[i] for i in rng.integers(0, len(words), 6_000))  # 3 MB, one line
    document = "a first line\n\n   \n" + line + "\nand a last line\u2028after a separator"
    (tmp_path / "one.txt").write_text(document)
    corpus = open_corpus(str(tmp_path / "one.txt"))
    for max_bytes in (5_000, 300_000, 1_000_000, 10_000_000):
        expected = _first_sentences_that_fit(document, max_bytes)
        assert training_sample(corpus, max_bytes=max_bytes) == expected
    assert "".join(split_line(line)) == line


def test_split_line_cuts_a_long_line_into_pieces_of_at_least_half_the_window():
    line = ("word " * 3 + "é" * 70 + " ") * 20_000  # 3 MB: cuts at spaces and between é's
    pieces = split_line(line, max_bytes=100)
    assert "".join(pieces) == line
    sizes = [len(piece.encode()) for piece in pieces]
    assert all(50 <= size <= 100 for size in sizes[:-1]) and 0 < sizes[-1] <= 100
    assert len(pieces) >= 40_000  # 156 bytes a repeat: at least two pieces each


def test_a_cache_record_of_an_older_titan_without_a_digest_gets_one_from_its_file(
    tokenizer, small_corpus, cache, capsys
):
    whole = token_stream(small_corpus, tokenizer)
    (path,) = cache.glob("*.u32")
    record = path.with_suffix(".json")
    older = {k: v for k, v in json.loads(record.read_text()).items() if k != "digest"}
    record.write_text(json.dumps(older))
    before = path.stat().st_mtime_ns
    again = token_stream(small_corpus, tokenizer)
    assert again.digest == whole.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.stat().st_mtime_ns == before and capsys.readouterr().err == ""  # not re-made
    assert json.loads(record.read_text()) == {**older, "digest": whole.digest, "mtime_ns": before}


def test_a_commit_cut_short_between_its_write_and_its_rename_leaves_no_temporary_file(
    tmp_path, monkeypatch
):
    def stopped(fd):
        raise StopRequested

    monkeypatch.setattr(os, "fsync", stopped)
    with pytest.raises(StopRequested):
        tokenize_module._write_json(tmp_path / "k.commit.json", {"tokens": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_cached_token_file_written_over_with_as_many_bytes_is_tokenized_again(
    tokenizer, small_corpus, cache, capsys
):
    whole = token_stream(small_corpus, tokenizer)
    expected = np.array(whole.tokens)
    (path,) = cache.glob("*.u32")
    written = path.stat().st_mtime_ns
    with open(path, "r+b") as out:  # the same size, other bytes, later
        out.write(b"\xff" * 64)
    os.utime(path, ns=(written + 10**9, written + 10**9))  # past the clock's granularity
    again = token_stream(small_corpus, tokenizer)
    assert "changed since it was written" in capsys.readouterr().err
    assert again.digest == whole.digest and np.array_equal(np.array(again.tokens), expected)
    token_stream(small_corpus, tokenizer)
    assert capsys.readouterr().err == ""  # its record stamped again: reused as it is


def test_hidden_directories_are_left_out_links_followed_and_each_file_read_once(tmp_path):
    root = tmp_path / "c"
    (root / "real").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "real" / "a.txt").write_text("doc one")
    (root / ".git" / "config").write_text("[core]")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.txt").write_text("doc two")
    (root / "more").symlink_to(elsewhere)
    (root / "real" / "up").symlink_to(root)  # a loop
    (root / "again.txt").symlink_to(root / "real" / "a.txt")
    for spec in (str(root), f"{root}/**"):
        corpus = open_corpus(spec)
        assert sorted(p.resolve().name for p in corpus.files) == ["a.txt", "b.txt"], spec
        assert sorted(corpus.documents()) == ["doc one", "doc two"]


def test_a_loop_of_links_or_a_dangling_link_is_told_from_a_missing_path(tmp_path):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.jsonl")
    expected = {
        "loop1": "cannot read it: Too many levels of symbolic links",
        "dangling": f"a link to {tmp_path / 'gone.jsonl'}, which does not exist",
        "absent": "no such file or directory (or 'stdlib')",
    }
    for name, reason in expected.items():
        with pytest.raises(TitanError) as raised:
            open_corpus(str(tmp_path / name))
        assert str(raised.value) == f"--data {tmp_path / name}: {reason}"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_titan_tokenize_names_the_records_it_dropped_and_stops_on_a_signal_keeping_its_work(
    tokenizer, tmp_path, cache, capsys, monkeypatch, signum
):
    model = tmp_path / "tokenizer.model"
    model.write_bytes(tokenizer.model_proto)
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(JSONL + b'{"text": ""}\nnot json\n{"body": "x"}\n')
    args = ["tokenize", "--data", str(shard), "--tokenizer", str(model), "--data-workers", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out.startswith(f"{shard}: 3,000 documents, ")
    assert out.endswith(" tokens (dropped: 1 empty, 1 non_text, 1 bad_json)")

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler raises at once

    monkeypatch.setattr("titan.commands.tokenize.token_stream", interrupted)
    assert main(args) == 4
    err = capsys.readouterr().err
    assert err.endswith("titan tokenize: interrupted; run it again to resume where it stopped\n")
    assert "Traceback" not in err


def test_an_error_without_a_file_name_is_given_the_file_written():
    with pytest.raises(OSError) as caught, naming(Path("/cache/tokens/k.partial")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what write() raises
    assert caught.value.filename == "/cache/tokens/k.partial"
    assert caught.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as caught, naming(Path("/elsewhere")):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), "/named")
    assert caught.value.filename == "/named"


def _saved_at_step_2(corpus_root: Path, tmp_path: Path, run_id: str) -> Path:
    """The dir of a 2-step run on ``corpus_root`` with its checkpoint at step 2."""
    from helpers import run_in_process, small_run

    options = small_run(corpus_root, tmp_path / "runs", run_id=run_id, steps=2, checkpoint_every=2)
    code, run_dir = run_in_process(options)
    assert code == 0
    return run_dir


@pytest.mark.slow
def test_a_resume_on_a_corpus_with_other_tokens_but_as_many_sequences_is_refused(
    small_corpus, tmp_path, capsys
):
    root = small_corpus.files[0].parent
    run_dir = _saved_at_step_2(root, tmp_path, "r")
    first, last = small_corpus.files[0], small_corpus.files[-1]
    first.rename(root / "swap")  # the same documents in another order
    last.rename(first)
    (root / "swap").rename(last)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "the corpus changed since the checkpoint (the same number of sequences" in err
    assert "other tokens" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_resume_of_an_older_checkpoint_on_a_corpus_read_otherwise_says_why(
    small_corpus, tmp_path, capsys
):
    run_dir = _saved_at_step_2(small_corpus.files[0].parent, tmp_path, "old")
    meta_file = run_dir / "checkpoints" / "2" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    del meta["data_digest"]  # as an older titan wrote it
    meta["num_sequences"] += 40  # which read the .git folder's files too
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "the corpus changed since the checkpoint (" in err
    assert "the checkpoint is an older titan's, which read corpora otherwise (files in " in err


def test_a_streams_summary_counts_one_document_and_one_token_in_the_singular():
    one = tokenize_module.TokenStream(np.zeros(1, np.uint32), 1, {"empty": 1}, "0" * 64)
    assert one.summary() == "1 document, 1 token (dropped: 1 empty)"
    two = tokenize_module.TokenStream(np.zeros(1234, np.uint32), 2, {"empty": 0}, "0" * 64)
    assert two.summary() == "2 documents, 1,234 tokens"
