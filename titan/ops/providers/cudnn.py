"""Provider ``cudnn`` of ``attention``: cuDNN fused flash attention on NVIDIA GPUs, through the
public ``jax.nn.dot_product_attention(..., implementation="cudnn")``.

What it serves (checked by :func:`supports`; anything else goes to ``native``, or is an error when
``cudnn`` is forced):

- CUDA GPUs only (not ROCm, not CPU); q, k, v in bfloat16 or float16, one dtype.
- Head dim a multiple of 8, at most 128 before Hopper and 256 from Hopper (compute capability 9.0)
  on: the limits JAX's cuDNN binding checks (``check_is_flash_attention``).
- Grouped-query heads natively (H a multiple of K).
- Causal masking through cuDNN's causal mask type, which skips the blocks above the diagonal.
- Sliding windows only with the causal mask (cuDNN supports a left window only).
- Segment ids through a dense boolean mask (B, 1, S, S) that JAX hands cuDNN as an additive bias:
  correct, but it reads S^2 bias elements per sequence and head group, so packed documents cost
  more than plain causal attention; cuDNN trains with a bias only for even sequence lengths.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from titan.ops.providers.platform import CUDA, accelerator, cuda_capability
from titan.ops.registry import Unsupported

DTYPES = (jnp.bfloat16, jnp.float16)


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


def attention(q, k, v, *, segment_ids=None, causal=True, sliding_window=None):
    """cuDNN attention; arguments and result as :meth:`titan.ops.Ops.attention`."""
    mask = None
    if segment_ids is not None:
        mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    window = None if sliding_window is None else (sliding_window - 1, 0)
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        mask=mask,
        is_causal=causal,
        local_window_size=window,
        implementation="cudnn",
    )
