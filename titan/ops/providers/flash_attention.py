"""Provider ``pallas`` of ``attention``: FlashAttention-2 forward and backward as Pallas kernels.

Tiled exact attention that never writes the (S, S) score matrix to memory (Dao et al. 2022,
"FlashAttention", Sec. 3.1: tiling with an online softmax, recomputation in the backward pass),
with the FlashAttention-2 work split (Dao 2023, "FlashAttention-2", Sec. 3.1.1 forward and
Algorithm 1; Sec. 3.1.2 backward and Algorithm 2; Sec. 3.2: one program per query block in the
forward, per key block for dK/dV and per query block for dQ, so no atomics are needed).

Kernels are written for ``pl.pallas_call`` with the Triton lowering (CUDA, Hopper included, and
ROCm where JAX's build ships Triton) and run with ``interpret=True`` on CPU, where conformance
exercises them. Features: causal mask (key blocks above the diagonal are skipped), grouped-query
heads (a query head reads key/value head ``h // (H / K)``; dK and dV are computed per query head in
float32 and summed over each group), segment ids (packed documents, masked inside the tile),
sliding windows (key blocks outside the window are skipped). Softmax runs in base 2 on scores
pre-multiplied by log2(e), the log-sum-exp is kept per row for the backward pass, and all matmuls
accumulate in float32.

Chosen automatically only where it is known to win (:func:`preferred`): on Hopper with segment
ids that cuDNN would take as a dense (B, 1, S, S) bias (where its packed documents do not serve:
grouped key/value heads under an older JAX), while these kernels mask inside the tile. At head
dim 64 the margin over cuDNN is small, so that case stays with cuDNN. cuDNN's packed documents
beat these kernels (``python bench/attention.py``: 1.98 against 2.20 ms at D 128, 2.35 against
2.89 ms at D 64, forward and backward of one layer of 8 x 2048 tokens of stdlib documents).
Measurements (``titan ops check``, ``bench/mfu.py``): ``docs/benchmarks.md``. Elsewhere ``pallas``
serves only when asked for (``attention=pallas``). Of the block sizes tried at S 2048, the
defaults were fastest (larger backward blocks or 8 warps: 1.3 to 2x slower). Under an SPMD
mesh the Triton call has no partitioning rule: use it on one device or inside ``shard_map``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from titan.ops.providers import cudnn
from titan.ops.providers.platform import (
    CUDA,
    accelerator,
    cuda_capability,
    is_power_of_two,
    pallas_compiler_params,
    pallas_interpret,
    pallas_runs_on,
)
from titan.ops.registry import Unsupported

F32 = jnp.float32
LOG2_E = math.log2(math.e)
# Finite, so that a fully masked tile gives exp2(MASK - MASK) = 1 (later rescaled to 0 by the
# online softmax) rather than inf - inf = NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
SQ = pl.squeezed


@dataclasses.dataclass(frozen=True)
class FlashBlocks:
    """Tile sizes (tokens) and Triton launch settings. Each block must be a power of two >= 16
    (Triton's ``tl.dot`` minimum) and divide the sequence length once clipped to it.

    Attributes:
        block_q, block_k: query rows per forward program, key rows per forward inner step.
        block_q_bwd, block_k_bwd: the same for the two backward kernels.
        num_warps, num_stages: Triton warps per program and software-pipelining stages.
    """

    block_q: int = 128
    block_k: int = 64
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def fit(self, seq_len: int) -> FlashBlocks:
        """These blocks, each clipped to ``seq_len``."""
        names = ("block_q", "block_k", "block_q_bwd", "block_k_bwd")
        return dataclasses.replace(self, **{n: min(getattr(self, n), seq_len) for n in names})

    def problem(self, seq_len: int) -> str | None:
        """Why these blocks cannot tile ``seq_len``, or None."""
        fitted = self.fit(seq_len)
        for block in (fitted.block_q, fitted.block_k, fitted.block_q_bwd, fitted.block_k_bwd):
            if block < 16 or not is_power_of_two(block) or seq_len % block:
                return f"sequence length {seq_len} is not tiled by power-of-two blocks >= 16"
        return None


DEFAULT_BLOCKS = FlashBlocks()


def supports(
    backend: str,
    q,
    k,
    v,
    *,
    segment_ids=None,
    causal=True,
    sliding_window=None,
    blocks: FlashBlocks = DEFAULT_BLOCKS,
) -> Any:
    """Whether the Pallas kernels can serve this call: interpreted on CPU, Triton on CUDA/ROCm."""
    if not (runs := pallas_runs_on(backend)):
        return runs
    if q.dtype not in DTYPES or not q.dtype == k.dtype == v.dtype:
        return Unsupported(f"needs q, k, v in one of float32, bfloat16, float16; got {q.dtype}")
    if q.shape[1] != k.shape[1]:
        return Unsupported("needs queries and keys of one sequence length")
    head_dim = q.shape[-1]
    if head_dim < 16 or not is_power_of_two(head_dim):
        return Unsupported(f"head dim {head_dim} must be a power of two >= 16")
    problem = blocks.problem(q.shape[1])
    return Unsupported(problem) if problem else True


def preferred(backend: str, q, k, v, *, segment_ids=None, causal=True, sliding_window=None) -> bool:
    """Where these kernels beat cuDNN (see the module docstring): Triton on a Hopper-or-later
    CUDA GPU, bf16/fp16, with segment ids that cuDNN would read as a dense mask (its packed
    documents are faster: ``bench/results/attention-nvidia-h200.json``), head dim 128,
    sequence >= 512."""
    return (
        accelerator(backend) == CUDA
        and cuda_capability() >= (9, 0)
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and segment_ids is not None
        and not cudnn.packs(q, k, causal)
        and q.shape[-1] == 128
        and q.shape[1] >= 512
    )


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything about a call that is not an array: hashed by ``custom_vjp``."""

    scale: float
    causal: bool
    window: int | None
    blocks: FlashBlocks
    interpret: bool


def attention(
    q,
    k,
    v,
    *,
    segment_ids=None,
    causal=True,
    sliding_window=None,
    blocks: FlashBlocks = DEFAULT_BLOCKS,
    interpret: bool | None = None,
):
    """Flash attention; arguments and result as :meth:`titan.ops.Ops.attention`.

    Args:
        blocks: tile sizes (see :class:`FlashBlocks`).
        interpret: run the kernels in the Pallas interpreter; default: on CPU only.
    """
    if interpret is None:
        interpret = pallas_interpret(jax.default_backend())
    static = _Static(q.shape[-1] ** -0.5, causal, sliding_window, blocks.fit(q.shape[1]), interpret)
    return _flash(q, k, v, segment_ids, static)


def _dot(a, b, contract: tuple[int, int] = (1, 0)):
    """2-D matmul accumulated in float32; ``contract`` picks the contracted dim of a and b."""
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=F32)


def _scores(q, k, q_pos, k_pos, q_seg, k_seg, static: _Static):
    """Masked scores of a (block_q, block_k) tile in base-2 units: scale * log2(e) * q k^T."""
    scores = _dot(q, k, (1, 1)) * (static.scale * LOG2_E)
    mask = q_seg[:, None] == k_seg[None, :] if q_seg is not None else None
    delta_pos = q_pos[:, None] - k_pos[None, :]
    for keep in (
        delta_pos >= 0 if static.causal else None,
        delta_pos < static.window if static.window is not None else None,
    ):
        if keep is not None:
            mask = keep if mask is None else mask & keep
    return scores if mask is None else jnp.where(mask, scores, MASK_VALUE)


def _key_blocks(q_start, block_q: int, block_k: int, seq_len: int, static: _Static):
    """[lo, hi) key blocks that queries [q_start, q_start + block_q) may attend to."""
    lo: int | jax.Array = 0
    if static.window is not None:
        lo = lax.div(jnp.maximum(q_start - static.window + 1, 0), block_k)
    hi: int | jax.Array = seq_len // block_k
    if static.causal:
        hi = lax.div(q_start + block_q + block_k - 1, block_k)
    return lo, hi


def _query_blocks(k_start, block_q: int, block_k: int, seq_len: int, static: _Static):
    """[lo, hi) query blocks that may attend to keys [k_start, k_start + block_k)."""
    lo = lax.div(k_start, block_q) if static.causal else 0
    hi: int | jax.Array = seq_len // block_q
    if static.window is not None:
        last_query = k_start + block_k + static.window - 2
        hi = jnp.minimum(hi, lax.div(last_query, block_q) + 1)
    return lo, hi


def _forward_kernel(q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, o_ref, lse_ref, *, static):
    """One query block of one head: FlashAttention-2 Algorithm 1 (online softmax over keys)."""
    block_q, block_k = static.blocks.block_q, static.blocks.block_k
    seq_len = k_ref.shape[0]
    q_start = pl.program_id(2) * block_q
    q = q_ref[...]
    q_pos = q_start + jnp.arange(block_q)
    q_seg = None if q_seg_ref is None else q_seg_ref[...]

    def step(j, carry):
        acc, row_max, row_sum = carry
        keys = pl.ds(j * block_k, block_k)
        k_seg = None if k_seg_ref is None else k_seg_ref[keys]
        k_pos = j * block_k + jnp.arange(block_k)
        scores = _scores(q, k_ref[keys, :], q_pos, k_pos, q_seg, k_seg, static)
        new_max = jnp.maximum(row_max, scores.max(axis=1))
        rescale = jnp.exp2(row_max - new_max)
        probs = jnp.exp2(scores - new_max[:, None])
        row_sum = rescale * row_sum + probs.sum(axis=1)
        acc = rescale[:, None] * acc + _dot(probs.astype(v_ref.dtype), v_ref[keys, :])
        return acc, new_max, row_sum

    init = (
        jnp.zeros((block_q, q.shape[1]), F32),
        jnp.full((block_q,), -jnp.inf, F32),
        jnp.zeros((block_q,), F32),
    )
    lo, hi = _key_blocks(q_start, block_q, block_k, seq_len, static)
    acc, row_max, row_sum = lax.fori_loop(lo, hi, step, init)
    o_ref[...] = (acc / row_sum[:, None]).astype(o_ref.dtype)
    lse_ref[...] = row_max + jnp.log2(row_sum)


def _probs_and_dscores(q, k, v, d_out, lse, delta, q_pos, k_pos, q_seg, k_seg, static):
    """P and dS of a tile, recomputed from the saved log-sum-exp (FlashAttention-2 Algorithm 2,
    inner loop): P = exp(S - L), dP = dO V^T, dS = P * (dP - D) with D = rowsum(dO * O)."""
    probs = jnp.exp2(_scores(q, k, q_pos, k_pos, q_seg, k_seg, static) - lse[:, None])
    d_probs = _dot(d_out, v, (1, 1))
    return probs, probs * (d_probs - delta[:, None])


def _dkdv_kernel(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref, k_seg_ref, dk_ref, dv_ref, *, static
):
    """dK and dV of one key block of one query head, looping over the query blocks that see it."""
    block_q, block_k = static.blocks.block_q_bwd, static.blocks.block_k_bwd
    seq_len = q_ref.shape[0]
    k_start = pl.program_id(2) * block_k
    k, v = k_ref[...], v_ref[...]
    k_pos = k_start + jnp.arange(block_k)
    k_seg = None if k_seg_ref is None else k_seg_ref[...]

    def step(i, carry):
        dk, dv = carry
        rows = pl.ds(i * block_q, block_q)
        q, d_out = q_ref[rows, :], do_ref[rows, :]
        q_seg = None if q_seg_ref is None else q_seg_ref[rows]
        q_pos = i * block_q + jnp.arange(block_q)
        probs, d_scores = _probs_and_dscores(
            q, k, v, d_out, lse_ref[rows], delta_ref[rows], q_pos, k_pos, q_seg, k_seg, static
        )
        dv = dv + _dot(probs.astype(d_out.dtype), d_out, (0, 0))
        dk = dk + _dot(d_scores.astype(q.dtype), q, (0, 0))
        return dk, dv

    zeros = jnp.zeros((block_k, k.shape[1]), F32)
    lo, hi = _query_blocks(k_start, block_q, block_k, seq_len, static)
    dk, dv = lax.fori_loop(lo, hi, step, (zeros, zeros))
    dk_ref[...] = dk * static.scale
    dv_ref[...] = dv


def _dq_kernel(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref, k_seg_ref, dq_ref, *, static
):
    """dQ of one query block of one head, looping over the key blocks it attends to."""
    block_q, block_k = static.blocks.block_q_bwd, static.blocks.block_k_bwd
    seq_len = k_ref.shape[0]
    q_start = pl.program_id(2) * block_q
    q, d_out, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_pos = q_start + jnp.arange(block_q)
    q_seg = None if q_seg_ref is None else q_seg_ref[...]

    def step(j, dq):
        keys = pl.ds(j * block_k, block_k)
        k = k_ref[keys, :]
        k_seg = None if k_seg_ref is None else k_seg_ref[keys]
        k_pos = j * block_k + jnp.arange(block_k)
        _, d_scores = _probs_and_dscores(
            q, k, v_ref[keys, :], d_out, lse, delta, q_pos, k_pos, q_seg, k_seg, static
        )
        return dq + _dot(d_scores.astype(k.dtype), k)

    lo, hi = _key_blocks(q_start, block_q, block_k, seq_len, static)
    dq = lax.fori_loop(lo, hi, step, jnp.zeros((block_q, q.shape[1]), F32))
    dq_ref[...] = (dq * static.scale).astype(dq_ref.dtype)


class _Specs:
    """BlockSpecs over a (batch, query head, block) grid for (B, S, heads, D), (B, H, S) and
    (B, S) arrays: either one ``block`` of the sequence (the grid's third index) or all of it."""

    def __init__(self, seq_len: int, head_dim: int, group: int) -> None:
        self.seq_len, self.head_dim, self.group = seq_len, head_dim, group

    def heads(self, block: int | None, kv: bool = False) -> pl.BlockSpec:
        rows = block or self.seq_len

        def index(b, h, i):
            head = lax.div(h, self.group) if kv else h
            return b, i if block else 0, head, 0

        return pl.BlockSpec((SQ, rows, SQ, self.head_dim), index)

    def rows(self, block: int | None) -> pl.BlockSpec:
        return pl.BlockSpec(
            (SQ, SQ, block or self.seq_len), lambda b, h, i: (b, h, i if block else 0)
        )

    def segments(self, block: int | None, segment_ids) -> pl.BlockSpec | None:
        if segment_ids is None:
            return None
        return pl.BlockSpec((SQ, block or self.seq_len), lambda b, h, i: (b, i if block else 0))

    def backward_inputs(self, q_block: int | None, k_block: int | None, segment_ids) -> list:
        """Specs of (q, k, v, dO, lse, D, query segments, key segments): the query side or the
        key side blocked, the other whole."""
        return [
            self.heads(q_block),
            self.heads(k_block, kv=True),
            self.heads(k_block, kv=True),
            self.heads(q_block),
            self.rows(q_block),
            self.rows(q_block),
            self.segments(q_block, segment_ids),
            self.segments(k_block, segment_ids),
        ]


def _call(kernel, static: _Static, grid, in_specs, out_specs, out_shape, name: str, *args):
    blocks = static.blocks
    return pl.pallas_call(
        functools.partial(kernel, static=static),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pallas_compiler_params(
            static.interpret, blocks.num_warps, blocks.num_stages
        ),
        interpret=static.interpret,
        name=name,
    )(*args)


def _forward(q, k, v, segment_ids, static: _Static):
    batch, seq_len, heads, head_dim = q.shape
    specs = _Specs(seq_len, head_dim, heads // k.shape[2])
    block_q = static.blocks.block_q
    return _call(
        _forward_kernel,
        static,
        (batch, heads, seq_len // block_q),
        [
            specs.heads(block_q),
            specs.heads(None, kv=True),
            specs.heads(None, kv=True),
            specs.segments(block_q, segment_ids),
            specs.segments(None, segment_ids),
        ],
        [specs.heads(block_q), specs.rows(block_q)],
        [
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, seq_len), F32),
        ],
        "titan_flash_forward",
        q,
        k,
        v,
        segment_ids,
        segment_ids,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, segment_ids, static: _Static):
    return _forward(q, k, v, segment_ids, static)[0]


def _flash_forward(q, k, v, segment_ids, static: _Static):
    out, lse = _forward(q, k, v, segment_ids, static)
    return out, (q, k, v, segment_ids, out, lse)


def _flash_backward(static: _Static, residuals, d_out):
    q, k, v, segment_ids, out, lse = residuals
    batch, seq_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    specs = _Specs(seq_len, head_dim, heads // kv_heads)
    # FlashAttention-2 Algorithm 2: D = rowsum(dO * O), per query row and head, before the loops.
    delta = jnp.einsum("bshd,bshd->bhs", d_out.astype(F32), out.astype(F32))
    block_q, block_k = static.blocks.block_q_bwd, static.blocks.block_k_bwd
    args = (q, k, v, d_out, lse, delta, segment_ids, segment_ids)
    per_head = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), F32)
    dk, dv = _call(
        _dkdv_kernel,
        static,
        (batch, heads, seq_len // block_k),
        specs.backward_inputs(None, block_k, segment_ids),
        [specs.heads(block_k), specs.heads(block_k)],
        [per_head, per_head],
        "titan_flash_dkdv",
        *args,
    )
    dq = _call(
        _dq_kernel,
        static,
        (batch, heads, seq_len // block_q),
        specs.backward_inputs(block_q, None, segment_ids),
        specs.heads(block_q),
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        "titan_flash_dq",
        *args,
    )
    grouped = (batch, seq_len, kv_heads, heads // kv_heads, head_dim)
    dk = dk.reshape(grouped).sum(axis=3).astype(k.dtype)
    dv = dv.reshape(grouped).sum(axis=3).astype(v.dtype)
    return dq, dk, dv, None


_flash.defvjp(_flash_forward, _flash_backward)
