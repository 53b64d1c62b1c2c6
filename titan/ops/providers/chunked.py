"""Provider ``chunked`` of ``cross_entropy``: the output head and the loss over sequence chunks, so
that full-vocabulary logits (B, S, V) are never materialised at once.

The sequence is padded to a multiple of ``chunk_size`` and split into chunks; ``jax.lax.map``
runs the native head + log-softmax on one (B, chunk, V) slab at a time, under ``jax.checkpoint``
so that autodiff saves only each chunk's inputs and recomputes its logits in the backward pass.
Peak logits memory falls from B * S * V to B * chunk * V float32 values (at B = 8, S = 2048,
V = 32000: 2.1 GB to 0.52 GB with the default chunk of 512) for one extra head matmul
(2 * B * S * E * V FLOPs) in the backward pass.

Runs on every backend. Opt-in (``cross_entropy=chunked``): whether the saved memory traffic pays
for the recomputation depends on the model; ``bench/mfu.py`` measures it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titan.ops import native

DEFAULT_CHUNK_SIZE = 512


def cross_entropy(x, w_out, targets, *, chunk_size: int = DEFAULT_CHUNK_SIZE):
    """Chunked head + cross-entropy; arguments and result as :meth:`titan.ops.Ops.cross_entropy`.

    Args:
        chunk_size: sequence positions per chunk (clipped to the sequence length).
    """
    batch, seq_len, dim = x.shape
    chunk = min(chunk_size, seq_len)
    pad = -seq_len % chunk
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    chunks = (seq_len + pad) // chunk
    x_chunks = x.reshape(batch, chunks, chunk, dim).swapaxes(0, 1)
    target_chunks = targets.reshape(batch, chunks, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(pair):
        x_chunk, target_chunk = pair
        return native.cross_entropy(x_chunk, w_out, target_chunk)

    nll = jax.lax.map(one_chunk, (x_chunks, target_chunks))
    return nll.swapaxes(0, 1).reshape(batch, seq_len + pad)[:, :seq_len]
