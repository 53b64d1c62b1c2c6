"""Benchmark: can the data pipeline feed training? (``python bench/data_loader.py``)

On a synthetic multi-GB corpus of ``.jsonl.zst`` shards (generated once into ``--corpus``:
documents cut from a text of Zipf-distributed words, Zipf 1957 / Piantadosi 2014's exponent
near 1, so that the tokenizer meets a natural-looking vocabulary), measures on this machine:
- tokenizer training (:func:`titan.data.tokenizer.train_tokenizer`: streaming its bounded sample
  over the whole corpus, then sentencepiece);
- tokenization throughput (:func:`titan.data.tokenize.token_stream`, cold cache) with one worker
  on the first shard, and with ``--workers`` workers on the whole corpus, each for a time budget
  (``--budget-s``; stopped then as a stop signal would, resumable), and the peak RSS of the
  calling process and of each worker (VmHWM, sampled from /proc);
- batch assembly throughput of the packed batches, the per-step host cost,
and compares them with the training throughput they must feed: the median tokens/s of the
``llama3-1b`` run on one H200 recorded in ``--train-record`` (first step left out). Results go to
``bench/results/data_loader.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import zstandard

RESULTS = Path(__file__).parent / "results" / "data_loader.json"
TRAIN_RECORD = Path(__file__).parent / "results/llama3-1b-h200-defaults/l1b-pallas-swiglu"
WORDS = 50_000  # distinct words of the synthetic language
ZIPF_EXPONENT = 1.1
BASE_CHARS = 64 << 20  # the text documents are cut from
DOC_CHARS = (500, 20_000)  # uniform range of a document's length


def _base_text(rng: np.random.Generator) -> str:
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    weights = 1.0 / np.arange(1, 27)
    words = [
        bytes(rng.choice(letters, size=int(n), p=weights / weights.sum())).decode()
        for n in rng.integers(1, 11, size=WORDS)
    ]
    ranks = np.minimum(rng.zipf(ZIPF_EXPONENT, size=BASE_CHARS // 5), WORDS) - 1
    table = np.array(words, dtype=object)
    text = " ".join(table[ranks].tolist())
    return text.replace(" the ", ". The ", 1000)[:BASE_CHARS]


def make_corpus(root: Path, shards: int, shard_bytes: int, seed: int = 0) -> Path:
    """``shards`` ``.jsonl.zst`` files of about ``shard_bytes`` bytes of text each under
    ``root`` (kept when already complete: ``DONE`` marks it)."""
    done = root / "DONE"
    spec = f"{shards}x{shard_bytes}:{seed}"
    if done.is_file() and done.read_text() == spec:
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base, pick = _base_text(rng), random.Random(seed)
    for shard in range(shards):
        written = 0
        path = root / f"shard-{shard:03d}.jsonl.zst"
        with open(path, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as out:
            while written < shard_bytes:
                start = pick.randrange(len(base) - DOC_CHARS[1])
                text = base[start : start + pick.randint(*DOC_CHARS)].strip()
                line = (json.dumps({"text": text}) + "\n").encode()
                out.write(line)
                written += len(text)
    done.write_text(spec)
    return root


class PeakRss:
    """Peak resident memory (VmHWM, bytes) of this process (reset on entry) and of its worker
    processes, sampled every ``interval_s`` while running."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s, self.children, self._stop = interval_s, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _hwm(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval_s):
            for child in me.children(recursive=True):
                try:  # the workers, not multiprocessing's resource tracker
                    if "spawn_main" not in " ".join(child.cmdline()):
                        continue
                except psutil.Error:
                    continue
                peak = self._hwm(child.pid)
                self.children[child.pid] = max(self.children.get(child.pid, 0), peak)

    def __enter__(self) -> PeakRss:
        Path("/proc/self/clear_refs").write_text("5")  # resets this process's VmHWM (proc(5))
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.parent = self._hwm(os.getpid())


class _Budget(Exception):
    pass


def tokenize(corpus, tokenizer, workers: int, budget_s: float) -> dict:
    """Tokenize ``corpus`` into a fresh cache with ``workers`` workers for at most ``budget_s``
    seconds (then stopped as a stop signal would: the work stays committed, resumable);
    throughput over the tokens committed, and the peaks."""
    from titan.data.tokenize import token_stream

    os.environ["TITAN_CACHE"] = tempfile.mkdtemp(prefix="titan-bench-tokens-")
    reports = []

    def report(progress) -> None:
        reports.append(progress)
        if progress.elapsed_s >= budget_s:
            raise _Budget

    with PeakRss() as peak:
        try:
            token_stream(corpus, tokenizer, report, workers)
        except _Budget:
            pass
    last = reports[-1]
    return {
        "workers": workers,
        "files": len(corpus.files),
        "bytes_on_disk": last.bytes_total,
        "complete": last.bytes_done >= last.bytes_total,
        "share_read": last.bytes_done / last.bytes_total,
        "documents": last.documents,
        "tokens": last.tokens,
        "seconds": last.elapsed_s,
        "tokens_per_s": last.tokens_per_s,
        "tokens_per_s_per_worker": last.tokens_per_s / max(workers, 1),
        "eta_s_at_stop": last.eta_s,
        "peak_rss_parent_bytes": peak.parent,
        "peak_rss_worker_bytes": max(peak.children.values(), default=0),
        "workers_seen": len(peak.children),
        "token_file": str(_token_file(Path(os.environ["TITAN_CACHE"], "tokens"))),
    }


def _token_file(tokens_dir: Path) -> Path:
    """The partial token file of a stopped tokenization, else the finished one."""
    return next(tokens_dir.glob("*.partial"), None) or next(tokens_dir.glob("*.u32"))


def train_throughput(record: Path) -> float:
    """Median tokens/s of the run's ``step`` events, the first (compiling) step left out."""
    lines = (record / "events.jsonl").read_text().splitlines()
    steps = [json.loads(x) for x in lines if '"type": "step"' in x]
    return statistics.median(e["tokens_per_s"] for e in steps[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/titan-bench-corpus"))
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mb", type=int, default=256, help="text per shard (MB)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--batches", type=int, default=2000, help="batches to assemble")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=600.0,
        help="seconds of tokenization with all workers (a quarter of it with one worker); "
        "tokens/s is measured over the tokens committed by then",
    )
    parser.add_argument("--train-record", type=Path, default=TRAIN_RECORD)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()

    from titan.data.text import Corpus, PackedBatches, open_corpus
    from titan.data.tokenizer import train_tokenizer

    started = time.perf_counter()
    root = make_corpus(args.corpus, args.shards, args.shard_mb << 20)
    generate_s = time.perf_counter() - started
    corpus = open_corpus(str(root / "*.jsonl.zst"))
    os.environ["TITAN_CACHE"] = tempfile.mkdtemp(prefix="titan-bench-tokenizer-")  # cold
    started = time.perf_counter()
    tokenizer = train_tokenizer(corpus, args.vocab_size)
    tokenizer_s = time.perf_counter() - started
    print(f"tokenizer: {tokenizer_s:.1f} s", flush=True)

    one = tokenize(Corpus(corpus.spec, corpus.files[:1]), tokenizer, 1, args.budget_s / 4)
    print(f"1 worker, 1 shard: {one['tokens_per_s']:,.0f} tokens/s", flush=True)
    every = tokenize(corpus, tokenizer, args.workers, args.budget_s)
    print(f"{args.workers} workers: {every['tokens_per_s']:,.0f} tokens/s", flush=True)

    committed = one["tokens"]  # the single worker's committed tokens, as training reads them
    tokens = np.memmap(Path(one.pop("token_file")), dtype=np.uint32, mode="r")[:committed]
    every.pop("token_file")
    batches = PackedBatches(tokens, 2048, 8, 0, tokenizer.bos_id)
    started = time.perf_counter()
    for _ in range(args.batches):
        batches.next_batch()
    assemble_tps = args.batches * 8 * 2048 / (time.perf_counter() - started)

    train_tps = train_throughput(args.train_record)
    result = {
        "command": shlex.join(["python", "bench/data_loader.py", *sys.argv[1:]]),
        "corpus": {
            "shards": args.shards,
            "text_bytes": args.shards * (args.shard_mb << 20),
            "bytes_on_disk": every["bytes_on_disk"],
            "generate_s": generate_s,
        },
        "tokenizer": {"vocab_size": args.vocab_size, "train_s": tokenizer_s},
        "tokenize_one_worker": one,
        "tokenize_all_workers": every,
        "batch_assembly": {"seq_len": 2048, "batch_size": 8, "tokens_per_s": assemble_tps},
        "train": {
            "record": str(args.train_record.relative_to(Path(__file__).parents[1])),
            "what": "titan train --preset llama3-1b, 1 x NVIDIA H200, median tokens/s",
            "tokens_per_s": train_tps,
        },
        "tokenize_over_train": every["tokens_per_s"] / train_tps,
        "workers_to_feed_training": math.ceil(train_tps / one["tokens_per_s"]),
        "assembly_over_train": assemble_tps / train_tps,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "time": time.time(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
