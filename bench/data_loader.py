"""Benchmark: is the data pipeline faster than training? (``python bench/data_loader.py``)

Measures, in one run on this machine:
- tokenization throughput (tokens/s) of the whole corpus with a cold cache (sentencepiece,
  all cores), the one-time cost before the first step;
- batch assembly throughput (tokens/s) of :class:`titan.data.text.PackedBatches`, the per-step
  cost on the host;
- the training throughput (median tokens/s of a short ``tiny`` run) on the same corpus,
and writes them with the ratios loader / training to ``bench/results/data_loader.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "data_loader.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="stdlib", help="corpus (as titan train --data)")
    parser.add_argument("--batches", type=int, default=2000, help="batches to assemble")
    parser.add_argument("--train-steps", type=int, default=30, help="steps of the training run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()

    os.environ["TITAN_CACHE"] = tempfile.mkdtemp(prefix="titan-bench-cache-")
    from titan.config import TrainConfig
    from titan.data.text import PackedBatches, open_corpus, token_stream
    from titan.data.tokenizer import train_tokenizer
    from titan.trainer.train import train

    cfg = TrainConfig.of(data=args.data, steps=args.train_steps, log_every=10**6)
    corpus = open_corpus(cfg.data.corpus, cfg.data.text_field)
    start = time.perf_counter()
    tokenizer = train_tokenizer(corpus, cfg.data.vocab_size)
    tokenizer_s = time.perf_counter() - start
    start = time.perf_counter()
    tokens = token_stream(corpus, tokenizer).tokens
    tokenize_s = time.perf_counter() - start

    batches = PackedBatches(
        tokens, cfg.data.seq_len, cfg.data.batch_size, cfg.run.seed, tokenizer.bos_id
    )
    start = time.perf_counter()
    for _ in range(args.batches):
        batches.next_batch()
    assemble_s = time.perf_counter() - start
    assemble_tps = args.batches * cfg.data.batch_size * cfg.data.seq_len / assemble_s

    with tempfile.TemporaryDirectory() as runs:
        from dataclasses import replace

        train(replace(cfg, runs_root=runs, run_id="bench"))
        lines = (Path(runs) / "bench" / "events.jsonl").read_text().splitlines()
        steps = [json.loads(x) for x in lines if '"type": "step"' in x]
    train_tps = statistics.median(e["tokens_per_s"] for e in steps[1:])

    result = {
        "command": shlex.join(["python", "bench/data_loader.py", *sys.argv[1:]]),
        "corpus": args.data,
        "corpus_tokens": int(len(tokens)),
        "tokenizer_train_s": tokenizer_s,
        "tokenize_s": tokenize_s,
        "tokenize_tokens_per_s": len(tokens) / tokenize_s,
        "batch_assembly_tokens_per_s": assemble_tps,
        "train_tokens_per_s": train_tps,
        "assembly_over_train": assemble_tps / train_tps,
        "cpu_count": os.cpu_count(),
        "time": time.time(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
