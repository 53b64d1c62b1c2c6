"""Benchmark: attention on a TPU, forward plus backward, XLA against Pallas's splash kernels.

``python bench/tpu_attention.py --out bench/results/tpu-attention-<chip>.json`` times, on one
chip, one jitted forward and backward pass (``jax.vjp`` with a random cotangent) of one layer's
attention at B 8, S 2048, 16 query heads, 8 key/value heads, head dim 128, bfloat16, under two
masks: ``causal``, and ``documents`` (causal within 4 equal documents per row, as segment ids).
Variants:

- ``native``: the ``native`` provider (plain JAX, which XLA compiles);
- ``splash``: the ``splash`` provider with its default blocks
  (:data:`titan.ops.providers.splash_attention.DEFAULT_BLOCKS`);
- ``splash-128``, ``splash-256``, ``splash-1024``: the same kernels with every block at that
  size (128 is ``BlockSizes.get_default()`` of JAX's splash module).

Each variant is checked against ``native`` evaluated in float32 (``default_matmul_precision
("float32")``) on the same bf16 inputs: the normwise relative error ||x - x_ref|| / ||x_ref|| of
the output and of dq, dk, dv (:func:`attention._relative`). Time: the median of ``--iters``
calls after ``--warmup`` calls, each waited for (``block_until_ready`` on every result), in ms;
TFLOP/s counts the causal attention each mask computes (forward 4 S_doc^2 H D / 2 per document,
backward 2.5 times that: :func:`attention.document_flops`).

Writes the JSON to ``--out`` and prints a table last. ``--tiny`` runs B 1, S 256, 2 heads over one
key/value head on the CPU, the splash kernels interpreted, so that a test exercises the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attention import _relative, _step, document_flops  # noqa: E402

# (B, S, H, K, D)
SHAPE = (8, 2048, 16, 8, 128)
TINY_SHAPE = (1, 256, 2, 1, 128)
DOCUMENTS_PER_ROW = 4
MASKS = ("causal", "documents")
BLOCK_VARIANTS = (128, 256, 1024)


def variants(seq_len: int) -> dict[str, Any]:
    """Variant name -> ``attend(q, k, v, ids)`` (module docstring); a block variant whose blocks,
    fitted to ``seq_len``, equal an earlier variant's is left out (at S 256 every block is 256)."""
    from titan.ops import native
    from titan.ops.providers import splash_attention

    chosen: dict[str, Any] = {
        "native": lambda q, k, v, ids: native.attention(q, k, v, segment_ids=ids),
        "splash": lambda q, k, v, ids: splash_attention.attention(q, k, v, segment_ids=ids),
    }
    fitted = [splash_attention.DEFAULT_BLOCKS.fit(seq_len)]
    for size in BLOCK_VARIANTS:
        blocks = splash_attention.SplashBlocks(*[size] * 6)
        if blocks.fit(seq_len) in fitted:
            continue
        fitted.append(blocks.fit(seq_len))
        chosen[f"splash-{size}"] = lambda q, k, v, ids, blocks=blocks: splash_attention.attention(
            q, k, v, segment_ids=ids, blocks=blocks
        )
    return chosen


def segment_ids(mask: str, batch: int, seq_len: int) -> np.ndarray | None:
    """(B, S) int32 ids of :data:`DOCUMENTS_PER_ROW` equal documents a row, or None (causal)."""
    if mask == "causal":
        return None
    row = np.arange(seq_len) * DOCUMENTS_PER_ROW // seq_len
    return np.broadcast_to(row, (batch, seq_len)).astype(np.int32)


def measure(attend, arrays: tuple, reference: tuple, warmup: int, iters: int) -> dict:
    """Median ms of ``iters`` forward+backward calls after ``warmup`` ones, and the relative
    errors against ``reference``; ``error`` (one line) where the variant cannot run."""
    import jax

    try:
        step = _step(attend)
        for _ in range(warmup):
            results = jax.block_until_ready(step(*arrays))
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            results = jax.block_until_ready(step(*arrays))
            times.append(time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 - a variant that cannot run is a result
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    names = ("out", "dq", "dk", "dv")
    errors = {n: _relative(r, ref) for n, r, ref in zip(names, results, reference, strict=True)}
    return {"ms": 1e3 * statistics.median(times), "relative_error": errors}


def float32_reference(attend, arrays: tuple) -> tuple[np.ndarray, ...]:
    """(out, dq, dk, dv) of ``attend`` in float32 on the upcast ``arrays`` (q, k, v, ids,
    cotangent), one batch row at a time (rows attend independently; a row's float32 scores take
    an eighth of the batch's memory), as NumPy arrays."""
    import jax
    import jax.numpy as jnp

    step = _step(attend)
    rows = []
    with jax.default_matmul_precision("float32"):
        for row in range(arrays[0].shape[0]):
            q, k, v, ids, cotangent = (None if x is None else x[row : row + 1] for x in arrays)
            upcast = (q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
            rows.append([np.asarray(r) for r in step(*upcast, ids, cotangent.astype(jnp.float32))])
    return tuple(np.concatenate(parts) for parts in zip(*rows, strict=True))


def run_mask(mask: str, shape: tuple, warmup: int, iters: int) -> dict:
    """Every variant under ``mask`` (module docstring)."""
    import jax.numpy as jnp

    batch, seq_len, heads, kv_heads, head_dim = shape
    rng = np.random.default_rng(0)
    q, k, v, cotangent = (
        jnp.asarray(rng.standard_normal(s, np.float32), jnp.bfloat16)
        for s in [(batch, seq_len, heads, head_dim)]
        + [(batch, seq_len, kv_heads, head_dim)] * 2
        + [(batch, seq_len, heads, head_dim)]
    )
    ids_np = segment_ids(mask, batch, seq_len)
    ids = None if ids_np is None else jnp.asarray(ids_np)
    chosen = variants(seq_len)
    reference = float32_reference(chosen["native"], (q, k, v, ids, cotangent))
    flops = document_flops(
        np.zeros((batch, seq_len), np.int32) if ids_np is None else ids_np, heads, head_dim
    )
    result: dict[str, Any] = {
        "shape": {"B": batch, "S": seq_len, "H": heads, "K": kv_heads, "D": head_dim},
        "mask": mask,
        "flops": flops,
        "variants": {},
    }
    for name, attend in chosen.items():
        measured = measure(attend, (q, k, v, ids, cotangent), reference, warmup, iters)
        if "ms" in measured:
            measured["tflops_per_s"] = flops / measured["ms"] / 1e9
        result["variants"][name] = measured
    native_ms = result["variants"]["native"].get("ms")
    for measured in result["variants"].values():
        if native_ms and "ms" in measured:
            measured["speedup_vs_native"] = native_ms / measured["ms"]
    return result


def table(results: dict) -> str:
    """One line per (mask, variant): ms, TFLOP/s, speed-up over native, worst relative error."""
    lines = [f"{'mask':10} {'variant':12} {'ms':>9} {'TFLOP/s':>8} {'vs native':>9} {'rel err':>9}"]
    for mask, result in results.items():
        for name, m in result["variants"].items():
            if "error" in m:
                lines.append(f"{mask:10} {name:12} {m['error'][:60]}")
                continue
            worst = max(m["relative_error"].values())
            lines.append(
                f"{mask:10} {name:12} {m['ms']:9.3f} {m['tflops_per_s']:8.1f} "
                f"{m.get('speedup_vs_native', float('nan')):8.2f}x {worst:9.2e}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU, interpreted")
    parser.add_argument("--iters", type=int, help="timed calls per variant (default 20; tiny 2)")
    parser.add_argument("--warmup", type=int, help="calls before timing (default 2; tiny 1)")
    args = parser.parse_args()
    import jax

    from titan.ops.providers import splash_attention

    iters = args.iters or (2 if args.tiny else 20)
    warmup = args.warmup or (1 if args.tiny else 2)
    backend = jax.default_backend()
    shape = TINY_SHAPE if args.tiny else SHAPE
    results = {mask: run_mask(mask, shape, warmup, iters) for mask in MASKS}
    out = {
        "command": shlex.join(["python", "bench/tpu_attention.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": jax.devices()[0].device_kind,
        "backend": backend,
        "interpreted": splash_attention.interprets(backend) is True,
        "jax": jax.__version__,
        "iters": iters,
        "warmup": warmup,
        "default_blocks": dataclasses.asdict(splash_attention.DEFAULT_BLOCKS),
        "results": results,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{out['device']} ({backend}, splash interpreted: {out['interpreted']}), {iters} iters")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
