"""Validation (``--eval-split``, ``--eval-every``): held-out documents never trained on, eval
events at the set steps on both layouts, their badput, the summaries, the report and the
console's loss curve, on two real runs (conftest: ``spmd_eval_run``, ``mpmd_eval_run``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from console_helpers import wait_until
from helpers import events, run_in_process, small_run

from titan.analysis import ettr
from titan.analysis.report import write_report
from titan.analysis.summarize import summarize
from titan.cli import main
from titan.config import TrainConfig
from titan.data.heldout import EvalBatches, held_out, open_corpora, split_corpus, training_corpus
from titan.data.mixture import Source
from titan.data.text import PackedBatches, batch_digest, open_corpus
from titan.data.tokenizer import load_tokenizer
from titan.errors import TitanError
from titan.telemetry.events import parse_event
from titan.trainer.evaluation import Evaluation, never_evaluated
from titan.trainer.text_data import NOT_EVALUATED
from tui.app import TitanConsole
from tui.widgets.curve_plot import CurvePlot

SPLIT = 0.25


@pytest.mark.slow
def test_held_out_documents_never_appear_in_a_training_batch(spmd_eval_run, corpus_dir):
    """The run trained on exactly the stream of the documents not held out: its batches'
    digests are those of that stream's packed batches, and the stream holds every training
    document and no held-out one."""
    documents = list(open_corpus(str(corpus_dir)).documents())
    kept = [d for d in documents if not held_out(d, SPLIT)]
    assert 0 < len(kept) < len(documents)
    tokenizer = load_tokenizer(spmd_eval_run / "tokenizer.model")
    stream = np.concatenate(tokenizer.encode_documents(kept)).astype(np.uint32)
    batches = PackedBatches(stream, 32, 8, 0, tokenizer.bos_id)
    digests = [batch_digest(batches.next_batch()[1]) for _ in range(5)]
    assert digests == [e["batch_digest"] for e in events(spmd_eval_run, "step")]
    data = events(spmd_eval_run, "run_start")[0]["data"]
    assert data["documents"] == len(kept)
    assert data["eval"]["documents"] == len(documents) - len(kept)
    assert data["eval"]["batches"] == 2
    train, evaluate = split_corpus(open_corpus(str(corpus_dir)), "", SPLIT)
    assert set(train.documents()) == set(kept)
    assert set(evaluate.documents()) == set(documents) - set(kept)


@pytest.mark.slow
def test_eval_events_at_exactly_the_set_steps_on_both_layouts(spmd_eval_run, mpmd_eval_run):
    spmd, mpmd = events(spmd_eval_run, "eval"), events(mpmd_eval_run, "eval")
    assert [e["step"] for e in spmd] == [e["step"] for e in mpmd] == [2, 4]
    for e in spmd + mpmd:
        assert e["tokens"] == 2 * 8 * 32 and e["batches"] == 2
        assert e["perplexity"] == pytest.approx(math.exp(e["loss"]))
        assert e["seconds"] > 0
    # the same weights and held-out batches: the pipeline's forward gives the SPMD loss
    for a, b in zip(spmd, mpmd, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert spmd[1]["loss"] < spmd[0]["loss"]
    order = [e["type"] for e in events(spmd_eval_run) if e["type"] in ("step", "eval")]
    assert order == ["step", "step", "eval", "step", "step", "eval", "step"]


@pytest.mark.slow
def test_eval_time_is_its_own_badput(spmd_eval_run):
    lines = events(spmd_eval_run)
    goodput = ettr.analyze([parse_event(line) for line in lines])
    seconds = sum(e["seconds"] for e in lines if e["type"] == "eval")
    assert goodput.badput_s["eval"] == pytest.approx(seconds)
    assert "eval" in goodput.as_dict()["badput"]


@pytest.mark.slow
def test_summarize_and_report_show_the_best_eval_loss(spmd_eval_run, tmp_path, capsys):
    best = min(e["loss"] for e in events(spmd_eval_run, "eval"))
    (row,) = summarize(spmd_eval_run.parent)
    assert row.best_eval_loss == pytest.approx(best)
    report = write_report(spmd_eval_run, tmp_path / "report").read_text()
    assert f"| best eval loss | {best:.4f} |" in report
    assert "## Validation" in report


@pytest.mark.slow
async def test_the_monitor_curves_show_the_eval_loss(spmd_eval_run):
    expected = [(e["step"], e["loss"]) for e in events(spmd_eval_run, "eval")]
    app = TitanConsole(spmd_eval_run.parent, open_run=spmd_eval_run)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.screen.state.eval_loss is not None, lambda: "", 10)
        await pilot.press("2")
        plot = app.screen.query_one("#loss-plot", CurvePlot)
        await wait_until(pilot, lambda: len(plot.series) == 2, lambda: str(plot.series), 10)
        label, steps, losses = plot.series[1]
    assert label == "eval loss"
    assert list(zip(steps, losses, strict=True)) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eval_every": 2}, "--eval-every N needs --eval-data or --eval-split"),
        ({"eval_split": 1.0, "eval_every": 1}, "--eval-split must be < 1"),
        ({"eval_split": 0.1, "eval_data": "x", "eval_every": 1}, "exclude each other"),
    ],
)
def test_bad_eval_options_are_refused(options, message):
    with pytest.raises(TitanError, match=message):
        TrainConfig.of(**options)


def test_held_out_data_without_eval_every_is_held_out_and_never_evaluated():
    cfg = TrainConfig.of(eval_split=0.1)  # a resume may turn evaluation off (--eval-every 0)
    assert (cfg.data.eval_split, cfg.observability.eval_every) == (0.1, 0)


@pytest.mark.slow
def test_a_resume_turns_evaluation_off_and_keeps_the_documents_held_out(
    spmd_eval_run, tmp_path, capsys
):
    run_dir = Path(shutil.copytree(spmd_eval_run, tmp_path / "run"))
    assert main(["train", "--resume", str(run_dir), "--steps", "7", "--eval-every", "0"]) == 0
    assert NOT_EVALUATED in capsys.readouterr().out
    evaluated = [e["step"] for e in events(run_dir, "eval")]
    assert evaluated == [2, 4]  # none after the resume at step 5
    saved = json.loads((run_dir / "config.json").read_text())["train"]
    assert saved["data"]["eval_split"] == 0.25  # the same training documents


@pytest.mark.slow
def test_tokenize_prepares_what_a_run_with_held_out_documents_reads(
    corpus_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cache"))
    argv = ["tokenize", "--data", str(corpus_dir), "--vocab-size", "512", "--eval-split", "0.25"]
    assert main([*argv, "--data-workers", "1"]) == 0
    assert "held-out: " in capsys.readouterr().out
    prepared = _cached_data(tmp_path / "cache")
    options = small_run(corpus_dir, tmp_path, steps=1, run_id="r", eval_split=0.25)
    code, _ = run_in_process({**options, "eval_every": 1, "eval_batches": 1, "data_workers": 1})
    assert code == 0
    assert _cached_data(tmp_path / "cache") == prepared  # nothing trained nor tokenized again


def _cached_data(cache: Path) -> list[str]:
    """The tokenizers and token files of a cache (not its compiled programs, nor locks)."""
    return sorted(
        str(p.relative_to(cache))
        for p in cache.rglob("*")
        if p.is_file() and p.parts[len(cache.parts)] != "xla" and p.suffix != ".lock"
    )


def test_held_out_data_smaller_than_a_batch_is_refused(tmp_path):
    with pytest.raises(TitanError, match="fewer than one batch"):
        EvalBatches((np.zeros(100, np.uint32),), (1.0,), 32, 8, 1, 4)
    with pytest.raises(TitanError, match="--eval-data .*: no such file"):
        (tmp_path / "a.txt").write_text("text")
        split_corpus(open_corpus(str(tmp_path)), str(tmp_path / "missing"), 0.0)


def test_the_tokenizer_of_a_split_mixture_reads_no_held_out_document(tmp_path):
    for part in ("a", "b"):
        (tmp_path / part).mkdir()
        lines = [json.dumps({"text": f"part {part} document {i} " * 3}) for i in range(40)]
        (tmp_path / part / "docs.jsonl").write_text("\n".join(lines) + "\n")
    data = f"{tmp_path / 'a'}:0.5,{tmp_path / 'b'}:0.5"
    corpora = open_corpora(data, "text", "", SPLIT)
    trained_on = list(training_corpus(data, corpora.sources).documents())
    assert corpora.held_out is not None
    held_docs = {d for part in corpora.held_out for d in part.corpus.documents()}
    assert held_docs and len(trained_on) == 80 - len(held_docs)
    assert not held_docs & set(trained_on)
    assert {d.split()[1] for d in trained_on} == {"a", "b"}
    parts = {part.spec: part for part in corpora.held_out}  # each part holds out its own
    assert list(parts) == [str(tmp_path / "a"), str(tmp_path / "b")]
    for name, part in zip("ab", parts.values(), strict=True):
        assert part.weight == 0.5
        assert {d.split()[1] for d in part.corpus.documents()} == {name}


def _numbered(first: int, tokens: int) -> np.ndarray:
    return np.arange(first, first + tokens, dtype=np.uint32)


def test_each_part_of_a_mixture_is_evaluated_in_its_weights_share():
    """2 batches of 4 sequences at weights 3:1: part a's first 6 sequences, then part b's first
    2, in order; a part too short for its share of 2 batches leaves 1; none is refused."""
    a, b = _numbered(0, 1000), _numbered(100_000, 1000)
    batches = EvalBatches((a, b), (0.75, 0.25), 8, 4, 1, 2, names=("web", "code"))
    assert batches.count == 2 and batches.shares(2).tolist() == [6, 2]
    firsts = [batches.batch(i)["tokens"][:, 0].tolist() for i in range(2)]
    assert firsts == [[0, 8, 16, 24], [32, 40, 100_000, 100_008]]
    window = batches.batch(1)["tokens"][2]
    assert window.tolist() == list(range(100_000, 100_009))  # seq_len + 1 tokens
    rows = EvalBatches((a, b), (0.75, 0.25), 8, 4, 1, 2, np.array([2, 3]))
    assert rows.batch(1)["tokens"][:, 0].tolist() == [100_000, 100_008]
    short = EvalBatches((a, _numbered(0, 9)), (0.75, 0.25), 8, 4, 1, 2)  # b: one sequence
    assert short.count == 1 and short.shares(1).tolist() == [3, 1]
    with pytest.raises(TitanError, match="--data part 'code' have 8 tokens, fewer than its share"):
        EvalBatches((a, _numbered(0, 8)), (0.75, 0.25), 8, 4, 1, 2, names=("web", "code"))


def test_one_held_out_corpus_is_evaluated_on_its_first_sequences():
    batches = EvalBatches((_numbered(0, 100),), (1.0,), 8, 4, 1, 5)
    assert batches.count == 3  # 12 whole sequences of 8 (+1) tokens
    assert batches.batch(2)["tokens"][:, 0].tolist() == [64, 72, 80, 88]
    part = Source("c", 1.0, open_corpus("stdlib"))
    notes = Evaluation(None, batches, 1, [part], [3]).notes()  # type: ignore[arg-type]
    assert notes == [
        "the held-out data fills 3 of --eval-batches 5 batches: each evaluation covers those"
    ]


@pytest.mark.slow
def test_a_mixture_run_evaluates_each_part_that_tokenize_prepared(
    corpus_dir, tmp_path, monkeypatch, capsys
):
    """``titan tokenize`` prepares each part's held-out documents; the run reads them from the
    cache and evaluates each part in its weight's share (``run_start``'s ``data.eval``)."""
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cache"))
    files = sorted(corpus_dir.iterdir())
    for name, chosen in (("a", files[:11]), ("b", files[11:])):
        (tmp_path / name).mkdir()
        for path in chosen:
            shutil.copyfile(path, tmp_path / name / path.name)
    data = f"{tmp_path / 'a'}:0.75,{tmp_path / 'b'}:0.25"
    argv = ["tokenize", "--data", data, "--vocab-size", "512", "--eval-split", "0.25"]
    assert main([*argv, "--data-workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"held-out {tmp_path / 'a'}: " in out and f"held-out {tmp_path / 'b'}: " in out
    prepared = _cached_data(tmp_path / "cache")
    options = small_run(tmp_path, tmp_path / "runs", steps=1, run_id="r", eval_split=0.25)
    options = {**options, "data": data, "eval_every": 1, "eval_batches": 2, "data_workers": 1}
    code, run_dir = run_in_process(options)
    assert code == 0
    assert _cached_data(tmp_path / "cache") == prepared  # nothing trained nor tokenized again
    described = events(run_dir, "run_start")[0]["data"]["eval"]
    assert described["batches"] == 2
    parts = described["parts"]
    assert [(p["source"], p["weight"], p["sequences"]) for p in parts] == [
        (str(tmp_path / "a"), 0.75, 12),
        (str(tmp_path / "b"), 0.25, 4),
    ]
    assert described["documents"] == sum(p["documents"] for p in parts)
    assert all(p["documents"] > 0 for p in parts)
    assert [e["batches"] for e in events(run_dir, "eval")] == [2]


def test_a_mixture_part_without_held_out_documents_or_share_is_said():
    """A part that holds out nothing has weight 0 in the eval batches; one whose weight rounds
    to no sequence is named too."""
    parts = [
        Source("web", 0.5, open_corpus("stdlib")),
        Source("code", 0.499, open_corpus("stdlib")),
        Source("math", 0.001, open_corpus("stdlib")),
    ]
    streams = (_numbered(0, 1000), np.zeros(0, np.uint32), _numbered(0, 1000))
    batches = EvalBatches(streams, (0.998, 0.0, 0.002), 8, 4, 1, 2, names=("web", "code", "math"))
    assert batches.count == 2 and batches.shares(2).tolist() == [8, 0, 0]
    notes = Evaluation(None, batches, 1, parts, [10, 0, 3]).notes()  # type: ignore[arg-type]
    assert notes == [
        "--data part 'code' holds out no document: it is left out of evaluation, the other "
        "parts' weights renormalised",
        "--data part 'math' (weight 0.001) gets none of the 8 sequences evaluated: more "
        "--eval-batches give it its share",
    ]


@pytest.mark.slow
def test_a_mixture_part_that_holds_out_nothing_is_left_out_of_evaluation(
    corpus_dir, tmp_path, monkeypatch, capsys
):
    """A one-document part whose document is not held out: ``titan tokenize`` and the run both
    say so and evaluate the other part alone."""
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path / "cache"))
    files = sorted(corpus_dir.iterdir())
    alone = next(f for f in files if not held_out(f.read_text(), SPLIT))
    for name, chosen in (("a", [f for f in files if f != alone]), ("small", [alone])):
        (tmp_path / name).mkdir()
        for path in chosen:
            shutil.copyfile(path, tmp_path / name / path.name)
    small = tmp_path / "small"
    data = f"{tmp_path / 'a'}:0.75,{small}:0.25"
    argv = ["tokenize", "--data", data, "--vocab-size", "512", "--eval-split", str(SPLIT)]
    assert main([*argv, "--data-workers", "1"]) == 0
    assert f"held-out {small}: holds out no document" in capsys.readouterr().out
    options = small_run(tmp_path, tmp_path / "runs", steps=1, run_id="r", eval_split=SPLIT)
    options = {**options, "data": data, "eval_every": 1, "eval_batches": 2, "data_workers": 1}
    code, run_dir = run_in_process(options)
    assert code == 0
    assert f"titan: --data part '{small}' holds out no document" in capsys.readouterr().out
    parts = events(run_dir, "run_start")[0]["data"]["eval"]["parts"]
    assert [(p["documents"], p["sequences"]) for p in parts][1] == (0, 0)
    assert parts[0]["sequences"] == 16 and parts[0]["documents"] > 0


def test_an_eval_every_past_the_runs_steps_is_said():
    assert (
        never_evaluated(1000, 2)
        == "--eval-every 1000 is past --steps 2: the run is never evaluated"
    )
    assert never_evaluated(2, 2) is None and never_evaluated(0, 2) is None
