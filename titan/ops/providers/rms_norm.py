"""Provider ``pallas`` of ``rms_norm``: RMSNorm (Zhang & Sennrich 2019, Eq. 4) fused into one
Pallas kernel per direction.

Forward: each program normalises ``block_rows`` rows in float32 and writes y and the reciprocal
RMS r = 1 / sqrt(mean(x^2) + eps) per row. Backward (``custom_vjp``): with x^ = x r and
g = dy * scale, dx = r (g - x^ mean(g x^)) per row, and each program writes its partial
sum over rows of dy x^, which JAX adds up into dscale.

Triton needs power-of-two block shapes, so the model dim must be a power of two and the number of
rows (the product of the leading dims) a multiple of ``block_rows``. Opt-in (``rms_norm=pallas``):
XLA already fuses the native RMSNorm into one loop, so this kernel is not known to win.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from titan.ops.providers.platform import (
    is_power_of_two,
    pallas_compiler_params,
    pallas_interpret,
    pallas_runs_on,
)
from titan.ops.registry import Unsupported

F32 = jnp.float32
BLOCK_ROWS = 8
NUM_WARPS = 8


def supports(backend: str, x, scale, *, eps, block_rows: int = BLOCK_ROWS) -> Any:
    """Whether the fused kernel can serve this call: interpreted on CPU, Triton on CUDA/ROCm."""
    if not (runs := pallas_runs_on(backend)):
        return runs
    if not is_power_of_two(x.shape[-1]):
        return Unsupported(f"model dim {x.shape[-1]} must be a power of two")
    rows = math.prod(x.shape[:-1])
    if rows % block_rows:
        return Unsupported(f"{rows} rows are not a multiple of {block_rows}")
    return True


def rms_norm(x, scale, *, eps, block_rows: int = BLOCK_ROWS, interpret: bool | None = None):
    """Fused RMSNorm; arguments and result as :meth:`titan.ops.Ops.rms_norm`.

    Args:
        block_rows: rows per program (power of two).
        interpret: run in the Pallas interpreter; default: on CPU only.
    """
    if interpret is None:
        interpret = pallas_interpret(jax.default_backend())
    flat = x.reshape(-1, x.shape[-1])
    return _fused(flat, scale, eps, block_rows, interpret).reshape(x.shape)


def _forward_kernel(x_ref, scale_ref, y_ref, rstd_ref, *, eps):
    x = x_ref[...].astype(F32)
    rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=1) + eps)
    y_ref[...] = (x * rstd[:, None] * scale_ref[...].astype(F32)).astype(y_ref.dtype)
    rstd_ref[...] = rstd


def _backward_kernel(x_ref, scale_ref, rstd_ref, dy_ref, dx_ref, dscale_ref):
    rstd = rstd_ref[...]
    normed = x_ref[...].astype(F32) * rstd[:, None]
    dy = dy_ref[...].astype(F32)
    grad_normed = dy * scale_ref[...].astype(F32)
    mean_dot = jnp.mean(grad_normed * normed, axis=1)
    dx_ref[...] = (rstd[:, None] * (grad_normed - normed * mean_dot[:, None])).astype(dx_ref.dtype)
    dscale_ref[...] = jnp.sum(dy * normed, axis=0)


class _Specs:
    """BlockSpecs over a grid of row blocks: a (block_rows, dim) tile, its (block_rows,) per-row
    values, and the whole (dim,) scale."""

    def __init__(self, block_rows: int, dim: int) -> None:
        self.rows = pl.BlockSpec((block_rows, dim), lambda i: (i, 0))
        self.per_row = pl.BlockSpec((block_rows,), lambda i: (i,))
        self.scale = pl.BlockSpec((dim,), lambda i: (0,))
        self.partial = pl.BlockSpec((pl.squeezed, dim), lambda i: (i, 0))


def _call(kernel, blocks: int, interpret: bool, in_specs, out_specs, out_shape, name, *args):
    return pl.pallas_call(
        kernel,
        grid=(blocks,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pallas_compiler_params(interpret, NUM_WARPS, 1),
        interpret=interpret,
        name=name,
    )(*args)


def _forward(x, scale, eps: float, block_rows: int, interpret: bool):
    rows, dim = x.shape
    specs = _Specs(block_rows, dim)
    return _call(
        functools.partial(_forward_kernel, eps=eps),
        rows // block_rows,
        interpret,
        [specs.rows, specs.scale],
        [specs.rows, specs.per_row],
        [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((rows,), F32)],
        "titan_rms_norm",
        x,
        scale,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _fused(x, scale, eps: float, block_rows: int, interpret: bool):
    return _forward(x, scale, eps, block_rows, interpret)[0]


def _fused_forward(x, scale, eps: float, block_rows: int, interpret: bool):
    y, rstd = _forward(x, scale, eps, block_rows, interpret)
    return y, (x, scale, rstd)


def _fused_backward(eps: float, block_rows: int, interpret: bool, residuals, dy):
    x, scale, rstd = residuals
    rows, dim = x.shape
    blocks = rows // block_rows
    specs = _Specs(block_rows, dim)
    dx, dscale = _call(
        _backward_kernel,
        blocks,
        interpret,
        [specs.rows, specs.scale, specs.per_row, specs.rows],
        [specs.rows, specs.partial],
        [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((blocks, dim), F32)],
        "titan_rms_norm_backward",
        x,
        scale,
        rstd,
        dy,
    )
    return dx, dscale.sum(axis=0).astype(scale.dtype)


_fused.defvjp(_fused_forward, _fused_backward)
