"""Provider ``cudnn`` of ``attention``: cuDNN fused flash attention on NVIDIA GPUs.

What it serves (checked by :func:`supports`; anything else goes to ``native``, or is an error when
``cudnn`` is forced):

- CUDA GPUs only (not ROCm, not CPU); q, k, v in bfloat16 or float16, one dtype.
- Head dim a multiple of 8, at most 128 before Hopper and 256 from Hopper (compute capability 9.0)
  on: the limits JAX's cuDNN binding checks (``check_is_flash_attention``).
- Grouped-query heads natively (H a multiple of K).
- Causal masking through cuDNN's causal mask type, which skips the blocks above the diagonal.
- Sliding windows only with the causal mask (cuDNN supports a left window only).
- Segment ids (packed documents), two ways:

  - **packed** (Hopper on, causal): each row's documents are handed to cuDNN as segments of a
    packed ("THD") batch: a length and a start offset per document, :func:`packed_documents`,
    with JAX's ``q_seqlen``/``q_offsets`` interface to cuDNN's ragged layout. The kernel then
    computes each document's causal attention alone and skips every block across documents, so
    packed rows cost less than plain causal attention over the row (a sum of squares of the
    document lengths instead of the square of the row). The number of segments per row is a
    static bound, :func:`segment_bound`; cuDNN keeps its float32 softmax statistics per segment
    slot, (B x bound, H, S), so the bound is kept small;
  - **dense**: a (B, 1, S, S) boolean mask that JAX hands cuDNN as an additive bias. Correct for
    any segment ids, but it reads S^2 bias elements per row, and cuDNN trains with a bias only
    for even sequence lengths. It serves before Hopper, without the causal mask, for grouped
    key/value heads under a JAX older than :data:`PACKED_GQA_JAX`, and for a batch
    that the packed form cannot hold: a row with more documents than the bound, or segment ids
    that are not runs (a later token with an earlier id). The choice is made on the device for
    each call (``lax.cond`` on :func:`packed_documents`' ``fits``), so every batch is exact and
    nothing is compiled again.

The packed path calls ``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention``, the
function behind the public ``jax.nn.dot_product_attention(implementation="cudnn")``, which does
not pass segment offsets through; it is imported on first use, on a GPU only.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp

from titan.ops.providers.platform import CUDA, accelerator, cuda_capability
from titan.ops.registry import Unsupported

DTYPES = (jnp.bfloat16, jnp.float16)
PACKED_CAPABILITY = (9, 0)  # JAX's check_is_flash_attention: the packed layout needs Hopper
# The first JAX whose packed layout strides the key/value offsets by the key/value heads
# (``_fix_seqlen_offsets``: 0.10.2 multiplies them by the query heads, wrong under grouped-query
# attention; 0.11.2 by the key/value heads), read in both releases' sources.
PACKED_GQA_JAX = (0, 11, 2)
TOKENS_PER_SEGMENT = 128  # segment_bound: one segment slot per this many tokens of the row
MIN_SEGMENTS, MAX_SEGMENTS = 4, 64


def supports(backend: str, q, k, v, *, segment_ids=None, causal=True, sliding_window=None) -> Any:
    """Whether cuDNN flash attention can serve this call (see the module docstring)."""
    if accelerator(backend) != CUDA:
        return Unsupported("needs a CUDA GPU")
    if q.dtype not in DTYPES or not q.dtype == k.dtype == v.dtype:
        return Unsupported(f"needs q, k, v in one of bfloat16, float16; got {q.dtype}")
    head_dim = q.shape[-1]
    max_head_dim = 256 if cuda_capability() >= (9, 0) else 128
    if head_dim % 8 or head_dim > max_head_dim:
        return Unsupported(f"head dim {head_dim} must be a multiple of 8, <= {max_head_dim}")
    if sliding_window is not None and not causal:
        return Unsupported("a sliding window needs the causal mask")
    if segment_ids is not None and q.shape[1] % 2:
        return Unsupported(f"segment ids need an even sequence length, got {q.shape[1]}")
    return True


def segment_bound(seq_len: int) -> int:
    """Segment slots per row of the packed path: one per :data:`TOKENS_PER_SEGMENT` tokens,
    clipped to [:data:`MIN_SEGMENTS`, :data:`MAX_SEGMENTS`] (16 at S = 2048). The slots' softmax
    statistics take B x bound x H x S x 4 bytes per layer (34 MB for ``llama3-1b`` at B 8,
    S 2048); a batch with a fuller row takes the dense path (module docstring)."""
    return min(MAX_SEGMENTS, max(MIN_SEGMENTS, seq_len // TOKENS_PER_SEGMENT))


def packed_documents(segment_ids: jax.Array, bound: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The documents of each row as cuDNN's packed layout takes them.

    A document is a run of equal ids; packed documents (:func:`titan.data.text.document_ids`)
    are runs by construction.

    Args:
        segment_ids: (B, S) integer document ids.
        bound: segment slots per row (static).

    Returns:
        ``(lengths, offsets, fits)``: lengths (B, bound) int32, the tokens of each run, -1 in the
        slots past the row's last run; offsets (B, bound + 1) int32, the position where each run
        starts, -1 past the last (JAX's ``q_seqlen`` and ``q_offsets``); fits, a bool scalar:
        every row has at most ``bound`` runs and its ids never decrease, so that runs are
        exactly the tokens of equal id (otherwise lengths and offsets are not to be used).
    """
    batch = segment_ids.shape[0]
    starts = jnp.concatenate(
        [jnp.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    run = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1  # (B, S) run of each token
    runs = run[:, -1] + 1  # (B,)
    slots = jnp.arange(bound, dtype=jnp.int32)
    counts = jnp.sum(run[..., None] == slots, axis=1, dtype=jnp.int32)  # (B, bound)
    used = slots < runs[:, None]
    lengths = jnp.where(used, counts, -1)
    offsets = jnp.where(used, jnp.cumsum(counts, axis=1, dtype=jnp.int32) - counts, -1)
    offsets = jnp.concatenate([offsets, jnp.full((batch, 1), -1, jnp.int32)], axis=1)
    ordered = jnp.all(segment_ids[:, 1:] >= segment_ids[:, :-1])
    return lengths, offsets, ordered & jnp.all(runs <= bound)


def attention(q, k, v, *, segment_ids=None, causal=True, sliding_window=None):
    """cuDNN attention; arguments and result as :meth:`titan.ops.Ops.attention`."""
    if segment_ids is None:
        return _dense(q, k, v, None, causal, sliding_window)
    if not packs(q, k, causal):
        return _dense(q, k, v, segment_ids, causal, sliding_window)
    lengths, offsets, fits = packed_documents(segment_ids, segment_bound(q.shape[1]))
    return jax.lax.cond(
        fits,
        lambda: _packed(q, k, v, lengths, offsets, sliding_window),
        lambda: _dense(q, k, v, segment_ids, causal, sliding_window),
    )


def packs(q, k, causal: bool) -> bool:
    """Whether segment ids take the packed path here (module docstring): causal, Hopper or
    later, and grouped key/value heads only under a JAX that strides them right."""
    grouped = q.shape[2] != k.shape[2]
    return (
        causal
        and cuda_capability() >= PACKED_CAPABILITY
        and (not grouped or _jax_version() >= PACKED_GQA_JAX)
    )


def _jax_version() -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", jax.__version__)[:3])


def _dense(q, k, v, segment_ids, causal, sliding_window):
    """Through ``jax.nn.dot_product_attention``; segment ids as a dense (B, 1, S, S) mask."""
    mask = None
    if segment_ids is not None:
        mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    window = None if sliding_window is None else (sliding_window - 1, 0)
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, is_causal=causal, local_window_size=window, implementation="cudnn"
    )


def _packed(q, k, v, lengths, offsets, sliding_window):
    """Causal attention within each run of :func:`packed_documents` (module docstring)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_sdpa

    return cudnn_sdpa.dot_product_attention(
        q,
        k,
        v,
        q_seqlen=lengths,
        kv_seqlen=lengths,
        q_offsets=offsets,
        kv_offsets=offsets,
        scale=q.shape[-1] ** -0.5,
        mask_type=cudnn_sdpa.MaskType.PADDING_CAUSAL,
        qkv_layout="BTNH",
        sliding_window_length=sliding_window,
    )
