"""One tokenizer interface over sentencepiece, Hugging Face ``tokenizer.json`` and Llama 3's
tiktoken files: round trips, streamed decodes, BOS/EOS rules from each tokenizer's config, and
the files written for a Hugging Face directory read back."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tokenizers as hf_tokenizers
from tiktoken._educational import bpe_train

from titan.data.long_documents import LONG_DOCUMENT_CHARS, encode_long, pieces
from titan.data.text import document_ids, open_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import (
    LLAMA3_PATTERN,
    HuggingFaceBackend,
    StreamDecoder,
    TiktokenBackend,
    Tokenizer,
    load_tokenizer,
    tokenizer_files,
    train_tokenizer,
)
from titan.errors import TitanError

TEXT = " Hello world  again 🙂👍🏽 日本語のテキスト 한국어 e\u0301 n\u0303 Å\u0327 done\n\tend "
BACKENDS = ("sentencepiece", "huggingface", "tiktoken")


def _sample(corpus_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted(corpus_dir.iterdir())[:2])


@pytest.fixture(scope="module")
def files(tmp_path_factory, corpus_dir) -> dict[str, Path]:
    """backend -> a tokenizer file of that kind, each in its own directory (no config)."""
    root = tmp_path_factory.mktemp("tokenizers")
    for backend in BACKENDS:
        (root / backend).mkdir()
    sp = train_tokenizer(open_corpus(str(corpus_dir)), 512)
    (root / "sentencepiece" / "tokenizer.model").write_bytes(sp.model_proto)

    hf = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
    hf.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = hf_tokenizers.decoders.ByteLevel()
    trainer = hf_tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<|eot_id|>"],
        initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator([_sample(corpus_dir)], trainer)
    hf.post_processor = hf_tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    hf.save(str(root / "huggingface" / "tokenizer.json"))
    (root / "huggingface" / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')

    # Llama 3's format: base64 byte sequences and their ranks, one per line
    ranks = bpe_train(_sample(corpus_dir)[:20_000], 300, LLAMA3_PATTERN, visualise=None)
    lines = [f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items()]
    (root / "tiktoken" / "tokenizer.model").write_text("".join(lines))
    return {
        "sentencepiece": root / "sentencepiece" / "tokenizer.model",
        "huggingface": root / "huggingface" / "tokenizer.json",
        "tiktoken": root / "tiktoken" / "tokenizer.model",
    }


def _configured(path: Path, tmp_path: Path, **config: object) -> Path:
    """A copy of ``path`` whose ``tokenizer_config.json`` holds ``config`` over the original's."""
    target = tmp_path / path.name
    shutil.copy(path, target)
    original = path.with_name("tokenizer_config.json")
    base = json.loads(original.read_text()) if original.is_file() else {}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(base | config))
    return target


@pytest.mark.parametrize("backend", BACKENDS)
def test_emoji_cjk_and_combining_marks_round_trip(files, backend):
    tok = load_tokenizer(files[backend])
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert max(ids) < tok.vocab_size and tok.bos_id not in ids and tok.eos_id not in ids
    copy = Tokenizer(tok.model_proto)  # the run dir's tokenizer.model
    assert copy.encode(TEXT) == ids and (copy.bos_id, copy.eos_id) == (tok.bos_id, tok.eos_id)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_chunked_decodes_join_to_the_full_decode(files, backend, chunk):
    tok = load_tokenizer(files[backend])
    ids = tok.encode(TEXT)
    decoder = StreamDecoder(tok)
    parts = [decoder.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    parts.append(decoder.flush())
    assert "".join(parts) == tok.decode(ids) == TEXT
    assert all("\ufffd" not in part for part in parts)  # a half character is never emitted


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gets_exactly_one_bos_and_one_eos_where_configured(files, backend, tmp_path):
    both = load_tokenizer(
        _configured(files[backend], tmp_path, add_bos_token=True, add_eos_token=True)
    )
    ids = both.encode("a", add_special_tokens=True)
    assert ids[0] == both.bos_id and ids[-1] == both.eos_id
    assert ids.count(both.bos_id) == ids.count(both.eos_id) == 1
    assert ids[1:-1] == both.encode("a")
    assert Tokenizer(both.model_proto).encode("a", add_special_tokens=True) == ids
    neither = load_tokenizer(
        _configured(files[backend], tmp_path, add_bos_token=False, add_eos_token=False)
    )
    assert neither.encode("a", add_special_tokens=True) == neither.encode("a")
    (document,) = neither.encode_documents(["a"])  # training documents: always both
    assert list(document) == [neither.bos_id, *neither.encode("a"), neither.eos_id]


SPECIALS_AS_TEXT = "<s>x</s> <|begin_of_text|>y<|end_of_text|><|eot_id|> <unk>"


def _special_ids(tok: Tokenizer) -> set[int]:
    """Every id of a special token of ``tok``: control pieces, special added tokens, tiktoken's
    specials."""
    backend = tok.backend
    if isinstance(backend, TiktokenBackend):
        return set(backend.encoding._special_tokens.values())
    if isinstance(backend, HuggingFaceBackend):
        added = backend.tokenizer.get_added_tokens_decoder().items()
        return {i for i, token in added if token.special}
    processor = tok.processor
    return {i for i in range(tok.vocab_size) if processor.is_control(i) or processor.is_unknown(i)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_token_text_in_a_document_stays_ordinary_text(files, backend):
    tok = load_tokenizer(files[backend])
    (document,) = tok.encode_documents([SPECIALS_AS_TEXT])
    inner = [int(i) for i in document[1:-1]]
    assert int(document[0]) == tok.bos_id and int(document[-1]) == tok.eos_id
    assert not _special_ids(tok) & set(inner)
    assert tok.decode(inner) == SPECIALS_AS_TEXT
    assert tok.encode(SPECIALS_AS_TEXT) == inner  # prompts too
    assert Tokenizer(tok.model_proto).encode(SPECIALS_AS_TEXT) == inner  # the run dir's copy


@pytest.mark.parametrize("backend", BACKENDS)
def test_documents_spelling_special_tokens_pack_as_one_document_each(files, backend, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    texts = [f"doc {n}: {SPECIALS_AS_TEXT} <s>" for n in range(4)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = load_tokenizer(files[backend])
    stream = token_stream(open_corpus(str(corpus)), tok)
    tokens = np.asarray(stream.tokens, dtype=np.int32)
    assert stream.documents == 4
    assert np.count_nonzero(tokens == tok.bos_id) == np.count_nonzero(tokens == tok.eos_id) == 4
    segments = document_ids(np.append(tokens, tok.bos_id)[None, :], tok.bos_id)[0]
    assert segments[-1] == 4 and sorted(set(segments.tolist())) == [1, 2, 3, 4]


def test_a_bos_that_text_can_spell_is_refused_in_one_line(files, tmp_path):
    """A tokenizer.json whose BOS is an added token not marked special would turn "<s>" in a
    document into a document boundary: encoding training documents refuses it."""
    spec = json.loads(files["huggingface"].read_text())
    for token in spec["added_tokens"]:
        token["special"] = token["content"] != "<s>"
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    shutil.copy(files["huggingface"].with_name("tokenizer_config.json"), tmp_path)
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert len(tok.encode_documents(["plain text"])[0]) > 2
    with pytest.raises(TitanError, match=r"^--tokenizer encodes document text to its BOS or EOS"):
        tok.encode_documents(["plain text", "a <s> b"])


@pytest.mark.parametrize("config", ["generation_config.json", "config.json"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_end_tokens_are_eos_and_every_id_the_configs_name(files, backend, config, tmp_path):
    """Llama 3 Instruct's generation_config.json names <|end_of_text|> and <|eot_id|>; Meta's
    tiktoken tokenizer stops at both without any config."""
    plain = load_tokenizer(files[backend])
    own = {"tiktoken": (301, 309)}.get(backend, (plain.eos_id,))  # 300 ranks, then specials
    assert plain.end_ids == own
    path = _configured(files[backend], tmp_path)
    (tmp_path / config).write_text(json.dumps({"eos_token_id": [plain.eos_id, 7, 9]}))
    tok = load_tokenizer(path)
    assert tok.end_ids == tuple(sorted({*own, 7, 9}))
    assert Tokenizer(tok.model_proto).end_ids == tok.end_ids  # the run dir's copy keeps them
    assert tok.encode(TEXT) == plain.encode(TEXT)


def test_end_tokens_are_read_beside_the_tokenizer_and_in_its_model_directory(files, tmp_path):
    """Meta's layout keeps the tiktoken file in original/ and the configs one level up."""
    (tmp_path / "original").mkdir()
    shutil.copy(files["tiktoken"], tmp_path / "original" / "tokenizer.model")
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [301, 308, 309]}')
    tok = load_tokenizer(tmp_path / "original" / "tokenizer.model", config_dirs=(tmp_path,))
    assert tok.end_ids == (301, 308, 309)
    (tmp_path / "config.json").write_text('{"eos_token_id": "</s>"}')
    with pytest.raises(TitanError, match=r"config.json: eos_token_id must be a token id or a"):
        load_tokenizer(tmp_path / "original" / "tokenizer.model", config_dirs=(tmp_path,))


def test_default_rules_are_each_kinds_own(files):
    """Without add_bos_token/add_eos_token: BOS only for sentencepiece (transformers'
    LlamaTokenizer) and tiktoken (Llama 3), the template's (BOS before $A) for tokenizer.json."""
    for backend in BACKENDS:
        tok = load_tokenizer(files[backend])
        assert (tok.add_bos, tok.add_eos) == (True, False), backend


def test_tiktoken_file_has_llama3_special_tokens_after_its_ranks(files):
    tok = load_tokenizer(files["tiktoken"])
    assert isinstance(tok.backend, TiktokenBackend)
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (300, 301, 300 + 256)
    assert tok.decode([tok.bos_id, *tok.encode("hi"), tok.eos_id]) == (
        "<|begin_of_text|>hi<|end_of_text|>"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_for_a_hugging_face_directory_load_back_the_same_tokenizer(files, backend, tmp_path):
    end = 5  # an ordinary token named an end token: it must survive the round trip
    path = _configured(files[backend], tmp_path, add_eos_token=True)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": end}))
    tok = load_tokenizer(path)
    written = tokenizer_files(tok)
    out = tmp_path / "export"
    for name, data in written.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    (name,) = [n for n in written if not n.endswith("config.json")]
    back = load_tokenizer(out / name, config_dirs=(out,))
    assert back.encode(TEXT, add_special_tokens=True) == tok.encode(TEXT, add_special_tokens=True)
    assert (back.bos_id, back.eos_id, back.add_bos, back.add_eos) == (
        tok.bos_id,
        tok.eos_id,
        True,
        True,
    )
    assert end in back.end_ids and back.end_ids == tok.end_ids


def test_a_bad_tiktoken_file_or_config_is_one_line(tmp_path):
    (tmp_path / "tokenizer.model").write_text("aGk= 0\nnot-base64!! x\n")
    with pytest.raises(TitanError, match="is not a tiktoken BPE file"):
        load_tokenizer(tmp_path / "tokenizer.model")
    (tmp_path / "tokenizer.model").write_text("aGk= 0\n")
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(TitanError, match=r"config.json: the document is an array, not an object"):
        load_tokenizer(tmp_path / "tokenizer.model")


def _edited_json(path: Path, tmp_path: Path, edit) -> Path:
    """A copy of the ``tokenizer.json`` at ``path`` (and its config) with ``edit(spec)``
    applied to its JSON."""
    target = _configured(path, tmp_path)
    spec = json.loads(target.read_text())
    edit(spec)
    target.write_text(json.dumps(spec))
    return target


def test_truncation_and_padding_a_tokenizer_json_sets_are_off(files, tmp_path):
    def truncate_and_pad(spec: dict) -> None:
        spec["truncation"] = {
            "direction": "Right",
            "max_length": 4,
            "strategy": "LongestFirst",
            "stride": 0,
        }
        spec["padding"] = {
            "strategy": {"Fixed": 64},
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 1,
            "pad_type_id": 0,
            "pad_token": "</s>",
        }

    plain = load_tokenizer(files["huggingface"])
    edited = load_tokenizer(_edited_json(files["huggingface"], tmp_path, truncate_and_pad))
    texts = [TEXT * 3, "short"]
    for got, want in zip(
        edited.encode_documents(texts), plain.encode_documents(texts), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    assert len(edited.encode_documents(texts)[0]) > 60  # neither cut at 4 nor padded


def test_a_tokenizer_json_with_gaps_in_its_ids_sizes_the_vocabulary_past_its_largest_id(
    files, tmp_path
):
    def move_specials(spec: dict) -> None:
        for token in spec["added_tokens"]:
            token["id"] += 5000
        for name in ("<s>", "</s>", "<|eot_id|>"):
            spec["model"]["vocab"][name] += 5000
        spec["post_processor"]["special_tokens"]["<s>"]["ids"] = [spec["model"]["vocab"]["<s>"]]

    tok = load_tokenizer(_edited_json(files["huggingface"], tmp_path, move_specials))
    ids = np.concatenate(tok.encode_documents([TEXT]))
    assert tok.vocab_size == tok.token_id("<|eot_id|>") + 1 == 5003  # the largest id + 1
    assert tok.bos_id == 5000 and int(ids.max()) < tok.vocab_size


def test_a_damaged_run_copy_or_a_config_flag_spelled_as_text_is_one_line(files, tmp_path):
    copy = json.loads(load_tokenizer(files["huggingface"]).model_proto)
    del copy["tokenizer"]
    (tmp_path / "tokenizer.model").write_text(json.dumps(copy))
    with pytest.raises(TitanError, match=r"a damaged tokenizer copy \(no 'tokenizer' field\)"):
        load_tokenizer(tmp_path / "tokenizer.model")
    (tmp_path / "sp").mkdir()
    configured = _configured(files["sentencepiece"], tmp_path / "sp", add_bos_token="false")
    with pytest.raises(TitanError, match="add_bos_token must be true or false, got 'false'"):
        load_tokenizer(configured)


def test_a_tiktoken_file_with_a_rank_twice_is_one_line(tmp_path):
    (tmp_path / "tokenizer.model").write_text("aGk= 0\naGo= 0\n")
    with pytest.raises(TitanError, match="a token or a rank appears twice"):
        load_tokenizer(tmp_path / "tokenizer.model")


def test_a_document_the_tokenizer_cannot_encode_is_one_line(tmp_path):
    model = hf_tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "hello": 2})  # no unk token
    tok = hf_tokenizers.Tokenizer(model)
    tok.pre_tokenizer = hf_tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(TitanError, match="--tokenizer cannot encode a document: .*UNK"):
        tokenizer.encode_documents(["hello world"])


def test_a_damaged_cached_tokenizer_is_trained_again(corpus_dir, titan_cache, capsys):
    corpus = open_corpus(str(corpus_dir))
    first = train_tokenizer(corpus, 512)
    [cached] = [
        p
        for p in (titan_cache / "tokenizers").glob("*.model")
        if p.read_bytes() == first.model_proto
    ]
    cached.write_bytes(first.model_proto[:1000])
    again = train_tokenizer(corpus, 512)
    assert again.model_proto == first.model_proto
    assert "not a tokenizer" in capsys.readouterr().err
    assert cached.read_bytes() == first.model_proto


def test_a_directory_an_empty_file_or_a_byte_order_mark_is_told_apart(files, tmp_path):
    with pytest.raises(TitanError, match="a directory; give the tokenizer file in it"):
        load_tokenizer(tmp_path)
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(TitanError, match="the file is empty"):
        load_tokenizer(tmp_path / "empty.model")
    os.mkfifo(tmp_path / "fifo.model")  # never opened: a read would wait for a writer
    with pytest.raises(TitanError, match=r"fifo.model: not a regular file \(a FIFO, a device\)"):
        load_tokenizer(tmp_path / "fifo.model")
    marked = _configured(files["huggingface"], tmp_path)
    marked.write_bytes(b"\xef\xbb\xbf" + files["huggingface"].read_bytes())
    assert load_tokenizer(marked).vocab_size == load_tokenizer(files["huggingface"]).vocab_size


def test_a_null_add_bos_token_counts_as_unset(files, tmp_path):
    configured = _configured(files["sentencepiece"], tmp_path, add_bos_token=None)
    assert load_tokenizer(configured).add_bos is True  # sentencepiece's default rule


WIDE_TEXT = "".join(chr(0x4E00 + i) for i in range(120)) + " the quick brown fox\n"  # 120 CJK
VOCABULARIES_REFUSED = {  # corpus text, --vocab-size, the one line (\d+: the bound it names)
    "larger than the corpus yields": (
        "hello world\nthe quick brown fox\n",
        512,
        r"--vocab-size 512 is more pieces than --data yields: set it to (\d+) or less, "
        r"or give more text",
    ),
    "smaller than its characters need": (
        WIDE_TEXT * 50,
        259,
        r"--vocab-size 259 is fewer pieces than the characters of --data and the special "
        r"tokens need: set it to (\d+) or more",
    ),
}


@pytest.mark.parametrize("case", list(VOCABULARIES_REFUSED))
def test_a_vocabulary_the_corpus_cannot_train_names_the_bound_that_trains(tmp_path, case):
    text, vocab_size, pattern = VOCABULARIES_REFUSED[case]
    (tmp_path / "corpus.txt").write_text(text)
    with pytest.raises(TitanError) as raised:
        train_tokenizer(open_corpus(str(tmp_path / "corpus.txt")), vocab_size)
    named = re.fullmatch(pattern, str(raised.value))
    assert named, str(raised.value)
    bound = int(named[1])
    assert train_tokenizer(open_corpus(str(tmp_path / "corpus.txt")), bound).vocab_size == bound


def _metaspace_tokenizer(corpus_dir: Path, directory: Path) -> Path:
    """A Hugging Face BPE behind Llama 2's pre-tokenizer (a ``▁`` before the first word only)."""
    hf = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE(byte_fallback=True))
    hf.pre_tokenizer = hf_tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
    hf.decoder = hf_tokenizers.decoders.Metaspace(prepend_scheme="first")
    trainer = hf_tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"])
    hf.train_from_iterator([_sample(corpus_dir)], trainer)
    hf.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return directory / "tokenizer.json"


@pytest.mark.parametrize("backend", [*BACKENDS, "metaspace"])
def test_a_long_document_encoded_in_pieces_has_the_ids_of_one_encoding(
    files, corpus_dir, backend, tmp_path
):
    path = _metaspace_tokenizer(corpus_dir, tmp_path) if backend == "metaspace" else files[backend]
    tok = load_tokenizer(path)

    def encode(texts: list[str]) -> list[list[int]]:
        return tok.backend.encode(texts, 1)

    hard = "x" * 3000 + " y  z\n\n  w\t" + TEXT * 200 + "\u3000".join(["語"] * 500)
    for text in (_sample(corpus_dir)[:60_000], hard):
        cut = pieces(encode, text, 1000)
        assert "".join(cut) != text or backend != "sentencepiece"  # a space dropped at its cuts
        assert len(cut) > 5, backend
        assert encode_long(encode, text, 1000).tolist() == encode([text])[0], backend


def test_encode_documents_cuts_only_documents_longer_than_a_piece(files, corpus_dir):
    tok = load_tokenizer(files["sentencepiece"])
    sample = _sample(corpus_dir)
    long = (sample * (LONG_DOCUMENT_CHARS // len(sample) + 2))[: LONG_DOCUMENT_CHARS + 50_000]
    short, whole = sample[:500], tok.backend.encode([long], 1)[0]
    docs = tok.encode_documents([short, long, short])
    assert [d.tolist() for d in docs] == [
        [tok.bos_id, *tok.backend.encode([text], 1)[0], tok.eos_id] for text in (short, long, short)
    ]
    assert len(docs[1]) == len(whole) + 2


def test_a_long_document_in_pieces_holds_a_fraction_of_the_memory_of_one_encoding(
    files, corpus_dir
):
    tok = load_tokenizer(files["sentencepiece"])
    text = (_sample(corpus_dir) * 10)[:400_000]

    def encode(texts: list[str]) -> list[list[int]]:
        return tok.backend.encode(texts, 1)

    def peak_bytes(work) -> int:
        tracemalloc.start()
        try:
            work()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    whole = peak_bytes(lambda: np.asarray(encode([text])[0], dtype=np.int32))
    cut = peak_bytes(lambda: encode_long(encode, text, 20_000))
    # one list of ints (36 bytes a token) against the pieces' arrays and their concatenation
    # (8 bytes a token) beside one piece's list
    assert cut < whole / 3, (cut, whole)


def test_added_tokens_that_do_not_round_trip_are_named_at_load(files, tmp_path, capsys):
    def add_tokens(spec: dict) -> None:
        top = max(t["id"] for t in spec["added_tokens"]) + len(spec["model"]["vocab"])
        for i, content in enumerate(["Ö", "<unused>"]):  # Ö is no ByteLevel character
            spec["added_tokens"].append(
                {"id": top + i, "content": content, "single_word": False, "lstrip": False}
                | {"rstrip": False, "normalized": True, "special": False}
            )

    path = _edited_json(files["huggingface"], tmp_path, add_tokens)
    tokenizer = load_tokenizer(path)
    err = capsys.readouterr().err
    assert err == (
        f"titan: --tokenizer {path}: 1 added token(s) do not decode back to their text "
        "('Ö' -> '�'): text holding them is read back wrong; check its decoder and added_tokens\n"
    )
    assert tokenizer.decode(tokenizer.encode("ilÖveyou too")) == "il�veyou too"  # as named
    load_tokenizer(files["huggingface"])  # one whose added tokens round-trip: not a word
    assert capsys.readouterr().err == ""
