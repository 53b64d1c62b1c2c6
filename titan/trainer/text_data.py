"""The data of a ``--task lm`` run (:class:`TextTask`): the ``--data`` corpus, or each part of a
weighted mixture, and its held-out documents (:class:`titan.data.heldout.Corpora`); the
tokenizer (the resumed run's, ``--tokenizer``'s, or trained on the corpus and cached); the
token streams (tokenized once, cached), the batches and the evaluation of the held-out documents."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from titan.checkpoint.resume import TOKENIZER_FILE
from titan.config import (
    DataOptions,
    ObservabilityOptions,
    model_config,
    trained_vocab_size,
    trained_vocab_source,
)
from titan.cpus import usable_cpus
from titan.data.heldout import Corpora, training_corpus
from titan.data.mixture import data_record, make_batches
from titan.data.text import Documents
from titan.data.tokenize import TokenStream, token_stream
from titan.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from titan.inert import inert
from titan.layouts.contract import Trainer
from titan.shapes import ModelConfig
from titan.stopping import StopFlag
from titan.trainer.evaluation import open_evaluation
from titan.trainer.processes import batch_rows, first_then_others, is_writer, one_tokenizer
from titan.trainer.progress import TrainProgress
from titan.trainer.task import RunData

T = TypeVar("T")
NOT_EVALUATED = (
    "the documents of --eval-data or --eval-split are held out and, without --eval-every N, "
    "never evaluated"
)


class TextTask:
    """The data of a ``--task lm`` run.

    Args:
        data: the data options (corpus, tokenizer, batch).
        observability: ``--eval-every`` and ``--eval-batches``.
        seed: ``--seed`` (the batches' shuffle).
        corpora: :func:`titan.data.heldout.open_corpora`'s.
        resume_dir: the run being resumed (its tokenizer), or None.
    """

    def __init__(
        self,
        data: DataOptions,
        observability: ObservabilityOptions,
        seed: int,
        corpora: Corpora,
        resume_dir: Path | None,
    ) -> None:
        self.data = data
        self.observability = observability
        self.seed = seed
        self.corpora = corpora
        self.resume_dir = resume_dir
        self.tokenizer: Tokenizer | None = None  # model_shape prepares it

    def model_shape(
        self, shape: ModelConfig, progress: TrainProgress, stop: StopFlag
    ) -> ModelConfig:
        """``shape`` with the tokenizer's vocabulary (:func:`titan.config.model_config`),
        the tokenizer prepared first (process 0 trains or loads it, the others receive it)."""
        with progress.status("preparing the tokenizer"), stop.during("tokenizer") as tick:
            corpus = training_corpus(self.data.corpus, self.corpora.sources)
            tokenizer = one_tokenizer(lambda: self._tokenizer(shape, corpus, tick))
        self.tokenizer = tokenizer
        return model_config(shape, tokenizer.vocab_size, self.data.tokenizer)

    def run_data(self, trainer: Trainer, progress: TrainProgress, stop: StopFlag) -> RunData:
        """The token streams of the ``--data`` parts (process 0 first), their batches (of the
        rows this process materialises), and the evaluation of the held-out documents."""
        tokenizer, data, sources = self.tokenizer, self.data, self.corpora.sources
        assert tokenizer is not None  # model_shape came first
        with stop.during("tokenize") as tick:
            streams = first_then_others(
                "titan:tokens",
                lambda: progress.tokenize(
                    lambda report: self._streams(tokenizer, _both(report, tick))
                ),
            )
        batches = make_batches(
            sources, streams, data.seq_len, data.batch_size, self.seed, tokenizer.bos_id
        )
        obs = self.observability
        with stop.during("tokenize") as tick:
            evaluation = open_evaluation(
                self.corpora.held_out,
                tokenizer,
                trainer,
                data,
                obs.eval_every,
                obs.eval_batches,
                tick,
            )
        if is_writer():
            for source, stream in zip(sources, streams, strict=True):
                print(f"titan: {inert(source.spec)}: {stream.summary()}", flush=True)
            if self.corpora.held_out is not None and not obs.eval_every:
                print(f"titan: {NOT_EVALUATED}", flush=True)
            for note in evaluation.notes() if evaluation else ():
                print(f"titan: {inert(note)}", flush=True)
        described = data_record(data.corpus, sources, streams, batches)
        if evaluation:
            described["eval"] = evaluation.describe()
        record = {
            "tokenizer": {
                "vocab_size": tokenizer.vocab_size,
                "source": data.tokenizer or "trained",
            },
            "data": described,
        }
        batches.rows = batch_rows(trainer, data.batch_size)  # this process's rows
        files = {TOKENIZER_FILE: tokenizer.model_proto}
        return RunData(batches, files, record, data.seq_len, False, evaluation)

    def _tokenizer(
        self, shape: ModelConfig, corpus: Documents, progress: Callable[[int], None]
    ) -> Tokenizer:
        """The resumed run's tokenizer, ``--tokenizer``'s, or one trained on ``corpus``."""
        if self.resume_dir is not None:
            return load_tokenizer(self.resume_dir / TOKENIZER_FILE)
        if self.data.tokenizer:
            return load_tokenizer(self.data.tokenizer)
        vocab_size = trained_vocab_size(shape, self.data.vocab_size)
        return train_tokenizer(corpus, vocab_size, progress, trained_vocab_source(shape))

    def _streams(self, tokenizer: Tokenizer, report: Callable[[Any], None]) -> list[TokenStream]:
        """Each source's token stream (tokenized with ``--data-workers`` workers, or cached)."""
        workers = self.data.data_workers or usable_cpus()
        sources = self.corpora.sources
        return [token_stream(source.corpus, tokenizer, report, workers) for source in sources]


def _both(first: Callable[[T], None], second: Callable[..., None]) -> Callable[[T], None]:
    """A progress callback that reports to ``first`` and then ``second``."""

    def report(done: T) -> None:
        first(done)
        second(done)

    return report
