"""Benchmark: attention under the document mask, forward plus backward, per provider and path.

``python bench/attention.py`` times, on one GPU, for each shape of :data:`SHAPES` and each
document-length distribution of :data:`DOCUMENTS`, one jitted forward and backward pass
(``jax.vjp`` of the attention with a random cotangent) of:

- ``cudnn``: the provider as the registry serves it (``titan.ops.providers.cudnn``: the packed
  path, with the dense path behind ``lax.cond`` for a batch the packed form cannot hold);
- ``cudnn-packed``: the packed path alone (no ``lax.cond``), to price the condition;
- ``cudnn-dense``: the dense (B, 1, S, S) mask alone, the path before packing;
- ``cudnn-causal``: plain causal attention over the whole row, ignoring the documents (what
  ``--attention-mask causal`` computes): the reference the document mask should reach;
- ``pallas``: the Pallas flash kernels with segment ids (``titan.ops.providers.flash_attention``);

and checks each against ``native`` (plain JAX, float32 softmax) on the same inputs: the largest
normwise relative error of the output and of dq, dk, dv. Reported per run: the median of
``--iters`` timed calls after two warm-up calls (``block_until_ready``), in ms, and the FLOPs of
the documents' causal attention (forward 4 S_doc^2 H D / 2 per document, backward 2.5 times
that: 4 of the 5 backward matmuls of FlashAttention-2, Dao 2023, Sec. 3.1.2, plus the recomputed
scores) over that time.

Document lengths (:data:`DOCUMENTS`): ``stdlib``: the Python standard library's own ``.py`` files
(the corpus of the default ``titan train``), in file order, at 4 bytes per token (the BPE
tokenizers Titan trains on that corpus average 3.6 to 4.2), packed into rows as the data loader
packs them (documents back to back, cut at row ends); ``short``: every document min(100, S / 20)
tokens, 20 and more per row: above the packed path's bound, the dense path serves (priced
through the condition).

Writes ``bench/results/attention-<device>.json`` (or ``--out``). ``--smoke`` runs a tiny shape
on the CPU with the Pallas kernels interpreted and cuDNN skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
# name -> (B, S, H, K, D)
SHAPES = {
    "llama3-1b": (8, 2048, 32, 8, 64),
    "0.886b": (8, 2048, 16, 8, 128),
    "llama3-8b": (2, 4096, 32, 8, 128),
}
SMOKE_SHAPES = {"smoke": (2, 256, 4, 2, 64)}
BYTES_PER_TOKEN = 4
DOCUMENTS = ("stdlib", "short")
SHORT_TOKENS = 100
VARIANTS = ("cudnn", "cudnn-packed", "cudnn-dense", "cudnn-causal", "pallas")


def stdlib_lengths() -> list[int]:
    """Token lengths of the standard library's ``.py`` files, sorted by path, at
    :data:`BYTES_PER_TOKEN` bytes per token (at least 1)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [max(1, p.stat().st_size // BYTES_PER_TOKEN) for p in files]


def pack(lengths: list[int], rows: int, seq_len: int, start: int = 0) -> np.ndarray:
    """(rows, seq_len) int32 document ids of documents of ``lengths`` laid back to back from
    document ``start`` and cut into rows, as :func:`titan.data.text.document_ids` numbers
    them (a row's first token opens a document)."""
    ids = np.empty(rows * seq_len, np.int32)
    filled, doc = 0, start
    while filled < ids.size:
        take = min(lengths[doc % len(lengths)], ids.size - filled)
        ids[filled : filled + take] = doc
        filled, doc = filled + take, doc + 1
    return ids.reshape(rows, seq_len)


def documents(kind: str, batch: int, seq_len: int) -> np.ndarray:
    """The (B, S) segment ids of one batch of ``kind`` (module docstring)."""
    if kind == "short":
        return pack([min(SHORT_TOKENS, seq_len // 20)], batch, seq_len)
    lengths = stdlib_lengths()
    return pack(lengths, batch, seq_len, start=len(lengths) // 3)


def document_flops(ids: np.ndarray, heads: int, head_dim: int) -> float:
    """Forward plus backward FLOPs of causal attention within each run of ``ids`` (module
    docstring)."""
    total = 0.0
    for row in ids:
        _, counts = np.unique(row, return_counts=True)
        total += float(np.sum(counts.astype(np.float64) ** 2))
    return 3.5 * 4 * total * heads * head_dim / 2


def _attend(variant: str, backend: str):
    from titan.ops import Ops
    from titan.ops.providers import cudnn

    if variant == "cudnn-packed":

        def packed(q, k, v, ids):
            lengths, offsets, _ = cudnn.packed_documents(ids, cudnn.segment_bound(q.shape[1]))
            return cudnn._packed(q, k, v, lengths, offsets, None)

        return packed
    if variant == "cudnn-dense":
        return lambda q, k, v, ids: cudnn._dense(q, k, v, ids, True, None)
    if variant == "cudnn-causal":
        return lambda q, k, v, ids: Ops(backend, {"attention": "cudnn"}).attention(q, k, v)
    provider = "native" if variant == "native" else variant
    ops = Ops(backend, {"attention": provider}, from_env=False)
    return lambda q, k, v, ids: ops.attention(q, k, v, segment_ids=ids)


def _step(attend):
    import jax

    @jax.jit
    def step(q, k, v, ids, cotangent):
        out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, ids), q, k, v)
        return (out, *vjp(cotangent))

    return step


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def measure(variant: str, arrays: tuple, reference: tuple, iters: int, backend: str) -> dict:
    """Median ms of ``iters`` forward+backward calls of ``variant`` and its error against
    ``reference`` (native's results); ``error`` (one line) where the variant cannot run."""
    try:
        step = _step(_attend(variant, backend))
        results = step(*arrays)
        for _ in range(2):
            results = step(*arrays)
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            results = step(*arrays)
            results[0].block_until_ready()
            times.append(time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 - a variant that cannot run is a result
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    names = ("out", "dq", "dk", "dv")
    errors = {n: _relative(r, ref) for n, r, ref in zip(names, results, reference, strict=True)}
    return {"ms": 1e3 * statistics.median(times), "relative_error": errors}


def run_shape(name: str, shape: tuple, kind: str, variants: tuple[str, ...], iters: int) -> dict:
    import jax
    import jax.numpy as jnp

    from titan.ops.providers import cudnn

    batch, seq_len, heads, kv_heads, head_dim = shape
    backend = jax.default_backend()
    dtype = jnp.bfloat16
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (batch, seq_len, heads, head_dim), dtype)
    k, v = (jax.random.normal(kk, (batch, seq_len, kv_heads, head_dim), dtype) for kk in keys[1:3])
    cotangent = jax.random.normal(keys[3], q.shape, dtype)
    ids_np = documents(kind, batch, seq_len)
    ids = jnp.asarray(ids_np)
    arrays = (q, k, v, ids, cotangent)
    reference = _step(_attend("native", backend))(*arrays)
    runs = [len(np.unique(row)) for row in ids_np]
    flops = document_flops(ids_np, heads, head_dim)
    result: dict[str, Any] = {
        "shape": {"B": batch, "S": seq_len, "H": heads, "K": kv_heads, "D": head_dim},
        "documents": kind,
        "documents_per_row": {"min": min(runs), "max": max(runs), "mean": float(np.mean(runs))},
        "segment_bound": cudnn.segment_bound(seq_len),
        "document_flops": flops,
        "variants": {},
    }
    for variant in variants:
        measured = measure(variant, arrays, reference, iters, backend)
        if "ms" in measured:
            measured["tflops_per_s"] = flops / measured["ms"] / 1e9
        result["variants"][variant] = measured
        print(name, kind, variant, json.dumps(measured), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    parser.add_argument("--documents", default=",".join(DOCUMENTS), help="of: stdlib, short")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    parser.add_argument("--iters", type=int, default=20, help="timed calls per variant")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU, no cuDNN")
    parser.add_argument("--out", type=Path, help="JSON results file")
    args = parser.parse_args()
    import jax

    shapes = SMOKE_SHAPES if args.smoke else {s: SHAPES[s] for s in args.shapes.split(",")}
    variants = ("pallas",) if args.smoke else tuple(args.variants.split(","))
    device = jax.devices()[0].device_kind
    results = {
        f"{name} {kind}": run_shape(name, shape, kind, variants, args.iters)
        for name, shape in shapes.items()
        for kind in args.documents.split(",")
    }
    out = {
        "command": shlex.join(["python", "bench/attention.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device,
        "jax": jax.__version__,
        "results": results,
    }
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    path = args.out or RESULTS / f"attention-{slug}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
