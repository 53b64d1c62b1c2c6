"""Provider ``pallas`` of ``swiglu``: the SwiGLU MLP with the gating's backward pass in one Pallas
kernel.

SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", Eq. 5 with Swish_1 = SiLU) is
h = silu(g) * u with g = x W_gate, u = x W_up, then h W_down. With sigma the logistic function
and silu(g) = g sigma(g) (Elfwing et al. 2018, Eq. 3), the gating's gradients given dh are

    dg = dh * u * sigma(g) * (1 + g (1 - sigma(g)))
    du = dh * g * sigma(g)

Autodiff of the native provider has XLA compute these in two fusions, each reading g and dh
again (three (B, S, F) reads for dg, two for du, one write each). Here one kernel reads g, u and
dh once and writes both, in float32 arithmetic rounded once to the compute dtype: five
(B, S, F) passes instead of seven. The matmuls and the forward gating are the native provider's
(the same values).

XLA fuses both gradients into one loop when the gating stands alone, but not inside the train
step, where each gradient is fused towards its own matmul. Measurements (``titan train --preset
llama3-1b``, ``titan ops check --op swiglu``): ``docs/benchmarks.md``.

Triton blocks are powers of two: each program takes the largest powers of two up to
``BLOCK_ROWS`` rows and ``MAX_BLOCK_COLS`` columns that divide the array it is given. The
registry serves it where the rows (B * S) are a multiple of ``BLOCK_ROWS`` and F of 128; under a
device mesh each device gets a shard, whose tiles can come out narrower. Interpreted on CPU (for
CI), Triton on CUDA/ROCm. Under a mesh the kernel is elementwise for the partitioner
(``custom_partitioning`` with a Shardy rule): each device runs it on its own shard of the rows
(DP, FSDP) and of F (TP), with no collective; on one device JAX inlines the call.

Restrictions: reverse-mode autodiff only (``jax.custom_vjp``); no ``jax.vmap`` of the gradient
(``custom_partitioning`` has no batching rule; the trainer does not vmap the model). Chosen by
default on CUDA GPUs for every call it supports (:func:`preferred`); interpreted on CPU it is
slow, and on ROCm it is unmeasured, so it is opt-in there (``swiglu=pallas``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.custom_partitioning import custom_partitioning

from titan.ops import native
from titan.ops.linear import Linear
from titan.ops.providers.platform import (
    accelerator,
    fused_swiglu_by_default,
    pallas_compiler_params,
    pallas_interpret,
    pallas_runs_on,
)
from titan.ops.registry import Unsupported

F32 = jnp.float32
BLOCK_ROWS = 8
MAX_BLOCK_COLS = 1024
MIN_COLS = 128
NUM_WARPS = 8


def supports(backend: str, x, w_gate, w_up, w_down, linear: Linear | None = None) -> Any:
    """Whether the kernel can serve this call: interpreted on CPU, Triton on CUDA/ROCm; rows a
    multiple of ``BLOCK_ROWS``, F a multiple of 128."""
    if not (runs := pallas_runs_on(backend)):
        return runs
    ffn = w_gate.shape[-1]
    if ffn % MIN_COLS:
        return Unsupported(f"ffn dim {ffn} must be a multiple of {MIN_COLS}")
    rows = math.prod(x.shape[:-1])
    if rows % BLOCK_ROWS:
        return Unsupported(f"{rows} rows are not a multiple of {BLOCK_ROWS}")
    return True


def preferred(backend: str, x, w_gate, w_up, w_down, linear: Linear | None = None) -> bool:
    """Where the registry chooses it unasked (:func:`fused_swiglu_by_default`): CUDA GPUs."""
    return fused_swiglu_by_default(accelerator(backend))


def swiglu(x, w_gate, w_up, w_down, linear: Linear | None = None):
    """SwiGLU MLP; arguments and result as :meth:`titan.ops.Ops.swiglu` (x (B, S, E), w_gate and
    w_up (E, F), w_down (F, E); returns (B, S, E) in x's dtype)."""
    return native.swiglu(x, w_gate, w_up, w_down, gating=_gating, linear=linear)


@jax.custom_vjp
def _gating(gate, up):
    return native.swiglu_gating(gate, up)


def _gating_forward(gate, up):
    return native.swiglu_gating(gate, up), (gate, up)


def _backward_kernel(gate_ref, up_ref, d_h_ref, d_gate_ref, d_up_ref):
    gate = gate_ref[...].astype(F32)
    up = up_ref[...].astype(F32)
    d_h = d_h_ref[...].astype(F32)
    sig = jax.nn.sigmoid(gate)
    d_gate_ref[...] = (d_h * up * sig * (1 + gate * (1 - sig))).astype(d_gate_ref.dtype)
    d_up_ref[...] = (d_h * gate * sig).astype(d_up_ref.dtype)


def _block(size: int, largest: int) -> int:
    """The largest power of two up to ``largest`` that divides ``size`` (a shard's rows or F)."""
    block = largest
    while size % block:
        block //= 2
    return block


def _kernel_call(gate, up, d_h):
    """(d_gate, d_up) of (rows, F) arrays, one program per tile of up to (BLOCK_ROWS,
    MAX_BLOCK_COLS) that divides the arrays (they may be one device's shards)."""
    rows, ffn = gate.shape
    block_rows, cols = _block(rows, BLOCK_ROWS), _block(ffn, MAX_BLOCK_COLS)
    spec = pl.BlockSpec((block_rows, cols), lambda i, j: (i, j))
    out = jax.ShapeDtypeStruct(gate.shape, gate.dtype)
    interpret = pallas_interpret(jax.default_backend())
    return pl.pallas_call(
        _backward_kernel,
        grid=(rows // block_rows, ffn // cols),
        in_specs=[spec] * 3,
        out_specs=[spec, spec],
        out_shape=[out, out],
        compiler_params=pallas_compiler_params(interpret, NUM_WARPS, 1),
        interpret=interpret,
        name="titan_swiglu_backward",
    )(gate, up, d_h)


def _partition(mesh, arg_shapes, result_shape):
    """Elementwise: every shard computes its own tile (the gradients' sharding is d_h's)."""
    sharding = arg_shapes[2].sharding
    return mesh, _kernel_call, (sharding, sharding), (sharding,) * 3


# Under a device mesh (FSDP, TP, DP) XLA would otherwise gather the operands of the Pallas call,
# which has no partitioning rule of its own, onto every device.
_partitioned_call = custom_partitioning(_kernel_call)
_partitioned_call.def_partition(
    _partition,
    infer_sharding_from_operands=lambda mesh, arg_shapes, result_shape: (
        (arg_shapes[2].sharding,) * 2
    ),
    sharding_rule="rows cols, rows cols, rows cols -> rows cols, rows cols",
)


def _gating_backward(residuals, d_h):
    gate, up = residuals
    ffn = gate.shape[-1]
    d_gate, d_up = _partitioned_call(*(a.reshape(-1, ffn) for a in (gate, up, d_h)))
    return d_gate.reshape(gate.shape), d_up.reshape(up.shape)


_gating.defvjp(_gating_forward, _gating_backward)
