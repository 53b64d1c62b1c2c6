"""Validation during training (``--eval-every N``): the loss on held-out data, as ``eval`` events.

After every N-th step the loop evaluates the state on the same ``--eval-batches`` batches of
the held-out documents (:mod:`titan.data.heldout`: ``--eval-split`` or ``--eval-data``; of a
weighted mixture, each part's in its weight's share), forward passes only, on the run's own
layout (:meth:`titan.layouts.contract.Trainer.eval_loss`: the SPMD step's forward; under MPMD each
chunk's forward on its stage). The loss is the mean over the batches of each batch's mean token
loss (every batch has ``--batch-size x --seq-len`` tokens, so it is the mean over all of them);
perplexity is exp(loss) (Jelinek et al. 1977). The time spent, compiling the forward the first
time included, is the ``eval`` event's ``seconds``, which ETTR counts as badput of its own
(:mod:`titan.analysis.ettr`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from titan.config import DataOptions
from titan.data.heldout import EvalBatches
from titan.data.mixture import Source
from titan.data.tokenize import EmptyCorpus, TokenizeProgress, TokenStream, token_stream
from titan.data.tokenizer import Tokenizer
from titan.layouts.contract import Trainer, TrainState
from titan.telemetry.events import Eval
from titan.trainer.processes import batch_rows, first_then_others

MAX_EXP_ARG = 709.0  # math.exp overflows a float64 beyond this


@dataclass
class Evaluation:
    """When and on what the loop evaluates.

    Attributes:
        trainer: the run's trainer (its layout's forward).
        batches: the held-out batches.
        every: ``--eval-every``.
        parts: the held-out parts (:class:`titan.data.heldout.Corpora`).
        documents: each part's held-out documents tokenized.
    """

    trainer: Trainer
    batches: EvalBatches
    every: int
    parts: list[Source]
    documents: list[int]

    def describe(self) -> dict[str, Any]:
        """``run_start``'s ``data.eval``: held-out documents and tokens, batches evaluated; of a
        mixture also ``parts``: each part's ``source``, ``weight``, ``documents``, ``tokens``
        and the ``sequences`` evaluated."""
        described: dict[str, Any] = {
            "documents": sum(self.documents),
            "tokens": self.batches.tokens,
            "batches": self.batches.count,
        }
        if len(self.parts) > 1:
            shares = self.batches.shares(self.batches.count)
            described["parts"] = [
                {
                    "source": part.spec,
                    "weight": part.weight,
                    "documents": documents,
                    "tokens": len(stream),
                    "sequences": int(share),
                }
                for part, documents, stream, share in zip(
                    self.parts, self.documents, self.batches.streams, shares, strict=True
                )
            ]
        return described

    def notes(self) -> list[str]:
        """What a run says of its evaluation: fewer batches than ``--eval-batches`` (the held-out
        data holds no more); of a mixture, each part that holds out no document (left out, the
        other parts' weights renormalised) and each part whose share of the sequences evaluated
        rounds to none (a weight too small for ``--eval-batches``)."""
        batches, shares = self.batches, self.batches.shares(self.batches.count)
        notes = []
        if batches.count < batches.batches:
            notes.append(
                f"the held-out data fills {batches.count} of --eval-batches {batches.batches} "
                "batches: each evaluation covers those"
            )
        for part, documents, share in zip(self.parts, self.documents, shares, strict=True):
            if not documents:
                notes.append(
                    f"--data part '{part.spec}' holds out no document: it is left out of "
                    "evaluation, the other parts' weights renormalised"
                )
            elif not share:
                notes.append(
                    f"--data part '{part.spec}' (weight {part.weight:.3g}) gets none of the "
                    f"{batches.count * batches.batch_size} sequences evaluated: more "
                    "--eval-batches give it its share"
                )
        return notes

    def run(self, state: TrainState, step: int) -> Eval:
        """Evaluate ``state`` (after ``step``); blocks until the losses are read."""
        start = time.perf_counter()
        losses = [
            self.trainer.eval_loss(state, self.batches.batch(i)) for i in range(self.batches.count)
        ]
        loss = float(np.mean(jax.device_get(losses)))
        return Eval(
            step=step,
            loss=loss,
            perplexity=math.exp(loss) if loss <= MAX_EXP_ARG else None,
            tokens=self.batches.count * self.batches.tokens_per_batch,
            batches=self.batches.count,
            seconds=time.perf_counter() - start,
        )


def never_evaluated(every: int, steps: int) -> str | None:
    """A note when ``--eval-every`` is past the run's ``--steps`` (the run is then never
    evaluated), else None."""
    if every <= steps:
        return None
    return f"--eval-every {every} is past --steps {steps}: the run is never evaluated"


def open_evaluation(
    held_out: list[Source] | None,
    tokenizer: Tokenizer,
    trainer: Trainer,
    data: DataOptions,
    every: int,
    batches: int,
    progress: Callable[[TokenizeProgress], None],
) -> Evaluation | None:
    """The run's evaluation (None without held-out data or with ``every`` 0: held out, never
    evaluated): each held-out part tokenized (cached, process 0 first) and cut into
    ``batches`` (``--eval-batches``) batches of ``data``'s ``--batch-size`` x ``--seq-len``,
    each part in its weight's share (:class:`titan.data.heldout.EvalBatches`), of this
    process's rows, evaluated after every ``every``-th step (``--eval-every``).

    Raises:
        TitanError: a held-out part holds less than its share of one batch, or cannot be read.
    """
    if held_out is None or not every:
        return None
    streams = first_then_others(
        "titan:eval-tokens", lambda: held_out_streams(held_out, tokenizer, progress)
    )
    pairs = list(zip(held_out, streams, strict=True))
    kept = sum(part.weight for part, stream in pairs if stream is not None)
    eval_batches = EvalBatches(
        tuple(np.zeros(0, np.uint32) if s is None else s.tokens for s in streams),
        tuple(0.0 if stream is None else part.weight / kept for part, stream in pairs),
        data.seq_len,
        data.batch_size,
        tokenizer.bos_id,
        batches,
        batch_rows(trainer, data.batch_size),
        tuple(part.spec for part in held_out),
    )
    documents = [0 if stream is None else stream.documents for stream in streams]
    return Evaluation(trainer, eval_batches, every, held_out, documents)


def held_out_streams(
    parts: list[Source],
    tokenizer: Tokenizer,
    progress: Callable[[TokenizeProgress], None] | None = None,
) -> list[TokenStream | None]:
    """Each held-out part tokenized (:func:`titan.data.tokenize.token_stream`, cached); None
    for a part of a mixture that holds out no document (a small part at a small
    ``--eval-split``).

    Raises:
        TitanError: no part holds out a document (the first one's :class:`titan.data.tokenize.
            EmptyCorpus`), or a part cannot be read.
    """
    streams: list[TokenStream | None] = []
    empty: EmptyCorpus | None = None
    for part in parts:
        try:
            streams.append(token_stream(part.corpus, tokenizer, progress))
        except EmptyCorpus as err:
            empty = empty or err
            streams.append(None)
    if empty is not None and all(stream is None for stream in streams):
        raise empty
    return streams
