"""Provider ``splash`` of ``attention``: JAX's Pallas splash attention kernels for TPUs.

Splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``) is FlashAttention-2
(Dao 2023, "FlashAttention-2", Algorithms 1 and 2: tiled exact attention with an online softmax
and recomputation in the backward pass) written for the TPU's matrix unit in Pallas/Mosaic, with a
static block-sparse mask: the mask is evaluated per (query block, key block) once, in NumPy, when
the kernel is made, and the blocks it rules out entirely (above the diagonal under the causal
mask, outside a sliding window) are neither loaded nor computed. The forward pass, dQ and dK/dV
are separate kernels with their own block sizes (:class:`SplashBlocks`).

What it serves (checked by :func:`supports`; anything else goes to ``native``, or is an error when
``splash`` is forced):

- TPUs (Mosaic), and the CPU in the Pallas interpreter (``interpret=True``), where conformance
  checks it; never interpreted on a TPU (:func:`interprets`).
- bfloat16 on TPUs; float32 or bfloat16 interpreted on CPU. (The precision of float32 matmuls
  inside a Mosaic kernel is Mosaic's default, not the ``default_matmul_precision`` that XLA
  follows, so float32 stays with ``native`` on TPUs.)
- Grouped-query heads natively: ``make_splash_mha`` maps query head h to key/value head
  ``h // (H / K)``.
- The causal mask (``CausalMask``), sliding windows (``LocalMask``: position i sees keys
  i - W < j, and j <= i under the causal mask) and segment ids (``SegmentIds``, packed
  documents, masked inside each tile; a row of documents costs what the causal row costs).
- Sequence a multiple of 128 (the TPU's lane width: the kernels' blocks are multiples of 128);
  head dim a multiple of 128 (the only head dim checked on a TPU so far; the kernel pads other
  head dims to the lane width).

The kernel takes one sequence, (H, S, D); this provider transposes q, k, v to that layout,
``vmap``s over the batch and scales q by 1/sqrt(D) first (the kernel applies no scale). Like the
``pallas`` provider's Triton call, the Mosaic call has no SPMD partitioning rule: under a mesh of
several devices XLA would gather its operands, so the registry chooses it unasked only where one
device runs the model (:func:`preferred`); on several, force it inside ``shard_map`` only.
Measurements: ``python bench/tpu_attention.py`` (``bench/results/``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from titan.ops.providers.platform import TPU
from titan.ops.registry import Unsupported

LANES = 128  # TPU vector lane width: splash's blocks must be multiples of it (NUM_LANES)
TPU_DTYPES = (jnp.bfloat16,)
INTERPRETED_DTYPES = (jnp.float32, jnp.bfloat16)


@dataclasses.dataclass(frozen=True)
class SplashBlocks:
    """Block sizes (tokens) of the three kernels, each a multiple of :data:`LANES`; each is
    reduced to the largest multiple of 128 that divides the sequence (:meth:`fit`).

    The defaults are MaxText's (``sa_block_*`` of ``MaxText/configs/base.yml``: 512 for every
    block, separate dQ and dK/dV kernels), where the sequence allows.

    Attributes:
        block_q, block_kv: query rows and key rows per forward block (``block_kv`` is also the
            forward's compute block).
        block_q_dkv, block_kv_dkv: the same for the dK/dV kernel.
        block_q_dq, block_kv_dq: the same for the dQ kernel.
    """

    block_q: int = 512
    block_kv: int = 512
    block_q_dkv: int = 512
    block_kv_dkv: int = 512
    block_q_dq: int = 512
    block_kv_dq: int = 512

    def fit(self, seq_len: int) -> SplashBlocks:
        """These blocks for a sequence of ``seq_len`` (a multiple of :data:`LANES`): each the
        greatest common divisor of the block and ``seq_len``."""
        return SplashBlocks(*(math.gcd(block, seq_len) for block in dataclasses.astuple(self)))

    def block_sizes(self) -> splash.BlockSizes:
        """Splash's ``BlockSizes`` (compute blocks equal to the loaded blocks)."""
        return splash.BlockSizes(
            block_q=self.block_q,
            block_kv=self.block_kv,
            block_kv_compute=self.block_kv,
            block_q_dkv=self.block_q_dkv,
            block_kv_dkv=self.block_kv_dkv,
            block_kv_dkv_compute=self.block_kv_dkv,
            block_q_dq=self.block_q_dq,
            block_kv_dq=self.block_kv_dq,
        )


DEFAULT_BLOCKS = SplashBlocks()


def interprets(backend: str) -> bool | Unsupported:
    """Whether the kernels run in the Pallas interpreter on ``backend``: on CPU yes, on a TPU no
    (Mosaic); elsewhere an :class:`~titan.ops.registry.Unsupported` saying where they run."""
    if backend == TPU:
        return False
    if backend == "cpu":
        return True
    return Unsupported(f"runs on a TPU, or interpreted on cpu; not {backend}")


def supports(backend: str, q, k, v, *, segment_ids=None, causal=True, sliding_window=None) -> Any:
    """Whether splash attention can serve this call (see the module docstring)."""
    interpret = interprets(backend)
    if isinstance(interpret, Unsupported):
        return interpret
    dtypes = INTERPRETED_DTYPES if interpret else TPU_DTYPES
    if q.dtype not in dtypes or not q.dtype == k.dtype == v.dtype:
        allowed = ", ".join(jnp.dtype(d).name for d in dtypes)
        return Unsupported(f"needs q, k, v in one of {allowed} on {backend}; got {q.dtype}")
    seq_len, head_dim = q.shape[1], q.shape[-1]
    if k.shape[1] != seq_len:
        return Unsupported("needs queries and keys of one sequence length")
    if seq_len % LANES:
        return Unsupported(f"sequence length {seq_len} must be a multiple of {LANES}")
    if head_dim % LANES:
        return Unsupported(f"head dim {head_dim} must be a multiple of {LANES}")
    return True


def preferred(backend: str, q, k, v, *, segment_ids=None, causal=True, sliding_window=None) -> bool:
    """Where the registry chooses it unasked: on a TPU, when one device runs the model (the
    module docstring says why not on several)."""
    return backend == TPU and jax.device_count() == 1


def attention(
    q,
    k,
    v,
    *,
    segment_ids=None,
    causal=True,
    sliding_window=None,
    blocks: SplashBlocks = DEFAULT_BLOCKS,
):
    """Splash attention; arguments and result as :meth:`titan.ops.Ops.attention`.

    Args:
        blocks: block sizes (:class:`SplashBlocks`), fitted to the sequence.
    """
    _, seq_len, heads, head_dim = q.shape
    interpret = interprets(jax.default_backend()) is True
    kernel = _kernel(heads, seq_len, causal, sliding_window, blocks.fit(seq_len), interpret)
    scaled = q * jnp.asarray(head_dim**-0.5, q.dtype)
    q_t, k_t, v_t = (jnp.swapaxes(x, 1, 2) for x in (scaled, k, v))  # (B, heads, S, D)
    ids = None if segment_ids is None else splash.SegmentIds(q=segment_ids, kv=segment_ids)

    def one_row(q, k, v, ids) -> Any:  # (heads, S, D) each; the kernel returns the output only
        return kernel(q, k, v, segment_ids=ids)

    return jnp.swapaxes(jax.vmap(one_row)(q_t, k_t, v_t, ids), 1, 2)


def _kernel(
    heads: int,
    seq_len: int,
    causal: bool,
    sliding_window: int | None,
    blocks: SplashBlocks,
    interpret: bool,
) -> splash.splash_attention_kernel.SplashAttentionKernel:
    """The kernel for one mask, its block-sparsity computed here. It is made anew at each call,
    within the caller's trace: a kernel kept across traces holds its mask arrays as tracers of
    the trace that made it (``ensure_compile_time_eval`` keeps them concrete under ``jit``, not
    under the linearization of a backward pass without remat, where a cached kernel leaked an
    ``int8[1,1,1]`` tracer)."""
    shape = (seq_len, seq_len)
    mask: splash.Mask
    if sliding_window is not None:
        mask = splash.LocalMask(shape, (sliding_window - 1, 0 if causal else None), offset=0)
    elif causal:
        mask = splash.CausalMask(shape)
    else:
        mask = splash.FullMask(shape)
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(
            splash.MultiHeadMask([mask] * heads),
            block_sizes=blocks.block_sizes(),
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )
