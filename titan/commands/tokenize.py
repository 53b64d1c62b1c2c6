"""``titan tokenize``: tokenize a corpus into the cache ahead of training.

It prepares what ``titan train`` with the same ``--data``, ``--text-field``, ``--tokenizer``
(or ``--vocab-size``) and ``--eval-data`` or ``--eval-split`` prepares before its first step:
the tokenizer (trained and cached when none is given), each part's token file and the
held-out documents' (:mod:`titan.data.tokenize`), so that a training run
started afterwards, on this host or one sharing ``$TITAN_CACHE``, finds both in the cache. An
interrupted ``titan tokenize`` resumes where it stopped, as training does.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from titan.config import MAX_DATA_WORKERS, DataOptions, check_vocab_size_unused
from titan.cpus import usable_cpus
from titan.data.heldout import open_corpora, training_corpus
from titan.data.tokenize import EmptyCorpus, token_stream
from titan.data.tokenizer import load_tokenizer, train_tokenizer
from titan.exit_codes import EXIT_OK, EXIT_STOPPED
from titan.inert import inert
from titan.shapes import DEFAULT_VOCAB_SIZE
from titan.stopping import StopRequested, mark_cut_short
from titan.trainer.progress import TrainProgress

HELD_OUT = "held-out"  # the line of the held-out documents (--eval-data or --eval-split)


def add_parser(subparsers: Any) -> None:
    """Add ``tokenize`` to the ``titan`` subcommands."""
    t = subparsers.add_parser(
        "tokenize",
        help="tokenize a corpus into the cache ahead of training",
        description="Train (or load) the tokenizer and tokenize every part of --data into "
        "$TITAN_CACHE (default ~/.cache/titan), as titan train does before its first step; a "
        "later titan train with the same --data, --text-field, --tokenizer or --vocab-size, and "
        "--eval-data or --eval-split starts from the cache. Interrupted, it resumes where it "
        "stopped.",
    )
    defaults = DataOptions()
    t.add_argument("--data", required=True, help="as titan train --data (a mixture too)")
    t.add_argument("--text-field", default=defaults.text_field, help="as titan train")
    t.add_argument("--tokenizer", default="", help="as titan train (empty: train one)")
    t.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help=f"as titan train (default {defaults.vocab_size}; refused beside --tokenizer)",
    )
    t.add_argument("--eval-data", default="", help="as titan train (held-out corpus)")
    t.add_argument(
        "--eval-split",
        type=float,
        default=defaults.eval_split,
        help="as titan train (fraction of --data held out; 0: none)",
    )
    t.add_argument(
        "--data-workers",
        type=int,
        default=0,
        metavar="N",
        help=f"worker processes, 0 to {MAX_DATA_WORKERS} (default 0: one per usable CPU)",
    )
    t.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Prints one line per part (and one for the held-out documents, one per part of a mixture
    with ``--eval-split``): its spec (``held-out [SPEC]``), documents,
    tokens and the records dropped, with progress on stderr (a bar in a terminal, else a line
    every 10 s) while it works.

    Returns:
        :data:`EXIT_OK`, or :data:`EXIT_STOPPED` when a stop signal interrupted it (Ctrl-C,
        SIGTERM, SIGHUP): what was tokenized is kept, and a second run resumes there.

    Raises:
        TitanError: a bad option, checked as ``titan train`` checks it (:class:`DataOptions`).
    """
    check_vocab_size_unused(args.tokenizer, args.vocab_size, typed=True)
    data = DataOptions(
        corpus=args.data,
        text_field=args.text_field,
        tokenizer=args.tokenizer,
        data_workers=args.data_workers,
        vocab_size=DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size,
        eval_data=args.eval_data,
        eval_split=args.eval_split,
    )
    progress = TrainProgress(total_steps=0, log_every=1)
    try:
        corpora = open_corpora(data.corpus, data.text_field, data.eval_data, data.eval_split)
        sources, held_out = corpora.sources, corpora.held_out
        with progress.status("preparing the tokenizer"):
            if data.tokenizer:
                tokenizer = load_tokenizer(data.tokenizer)
            else:
                corpus = training_corpus(data.corpus, sources)
                tokenizer = train_tokenizer(corpus, data.vocab_size)
        workers = data.data_workers or usable_cpus()
        parts = [(source.spec, source.corpus, False) for source in sources]
        held = held_out or []  # with --eval-split, each --data part's held-out side
        several = len(held) > 1  # a part of them may hold out nothing (titan train leaves it out)
        parts += [
            (f"{HELD_OUT} {h.spec}" if several else HELD_OUT, h.corpus, several) for h in held
        ]
        for spec, documents, may_be_empty in parts:
            tokenize = functools.partial(token_stream, documents, tokenizer, workers=workers)
            try:
                summary = progress.tokenize(tokenize).summary()
            except EmptyCorpus:
                if not may_be_empty:
                    raise
                summary = "holds out no document (left out of evaluation)"
            print(f"{inert(spec)}: {summary}", file=sys.stdout, flush=True)
    except StopRequested:  # titan.cli's stop flag: SIGINT, SIGTERM or SIGHUP
        print(
            "titan tokenize: interrupted; run it again to resume where it stopped",
            file=sys.stderr,
        )
        mark_cut_short()  # the workers' chunks in flight are not waited for
        return EXIT_STOPPED
    return EXIT_OK
