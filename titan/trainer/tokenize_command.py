"""``titan tokenize``: tokenize a corpus into the cache ahead of training.

It prepares what ``titan train`` with the same ``--data``, ``--text-field`` and ``--tokenizer``
(or ``--vocab-size``) prepares before its first step: the tokenizer (trained and cached when
none is given) and each part's token file (:mod:`titan.data.tokenize`), so that a training run
started afterwards, on this host or one sharing ``$TITAN_CACHE``, finds both in the cache. An
interrupted ``titan tokenize`` resumes where it stopped, as training does.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from titan.config import MAX_DATA_WORKERS, DataOptions
from titan.cpus import usable_cpus
from titan.data.mixture import open_sources, union_corpus
from titan.data.tokenize import token_stream
from titan.data.tokenizer import load_tokenizer, train_tokenizer
from titan.exit_codes import EXIT_OK, EXIT_STOPPED
from titan.inert import inert
from titan.trainer.progress import TrainProgress


def add_parser(subparsers: Any) -> None:
    """Add ``tokenize`` to the ``titan`` subcommands."""
    t = subparsers.add_parser(
        "tokenize",
        help="tokenize a corpus into the cache ahead of training",
        description="Train (or load) the tokenizer and tokenize every part of --data into "
        "$TITAN_CACHE (default ~/.cache/titan), as titan train does before its first step; a "
        "later titan train with the same --data, --text-field and --tokenizer or --vocab-size "
        "starts from the cache. Interrupted, it resumes where it stopped.",
    )
    defaults = DataOptions()
    t.add_argument("--data", required=True, help="as titan train --data (a mixture too)")
    t.add_argument("--text-field", default=defaults.text_field, help="as titan train")
    t.add_argument("--tokenizer", default="", help="as titan train (empty: train one)")
    t.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="as titan train")
    t.add_argument(
        "--data-workers",
        type=int,
        default=0,
        metavar="N",
        help=f"worker processes, 0 to {MAX_DATA_WORKERS} (default 0: one per usable CPU)",
    )
    t.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Prints one line per part: its spec, documents, tokens and the records dropped, with
    progress on stderr (a bar in a terminal, else a line every 10 s) while it works.

    Returns:
        :data:`EXIT_OK`, or :data:`EXIT_STOPPED` when interrupted (Ctrl-C): what was
        tokenized is kept, and a second run resumes there.

    Raises:
        TitanError: a bad option, checked as ``titan train`` checks it (:class:`DataOptions`).
    """
    options = DataOptions(
        corpus=args.data,
        text_field=args.text_field,
        tokenizer=args.tokenizer,
        data_workers=args.data_workers,
        vocab_size=args.vocab_size,
    )
    progress = TrainProgress(total_steps=0, log_every=1)
    try:
        sources = open_sources(options.corpus, options.text_field)
        with progress.status("preparing the tokenizer"):
            if options.tokenizer:
                tokenizer = load_tokenizer(options.tokenizer)
            else:
                corpus = union_corpus(options.corpus, sources)
                tokenizer = train_tokenizer(corpus, options.vocab_size)
        workers = options.data_workers or usable_cpus()
        for source in sources:
            stream = progress.tokenize(
                functools.partial(token_stream, source.corpus, tokenizer, workers=workers)
            )
            print(f"{inert(source.spec)}: {stream.summary()}", file=sys.stdout, flush=True)
    except KeyboardInterrupt:
        print(
            "titan tokenize: interrupted; run it again to resume where it stopped",
            file=sys.stderr,
        )
        return EXIT_STOPPED
    return EXIT_OK
