"""How the decoder's linear layers compute: in the compute dtype or in FP8, one GEMM per weight
or one per input (fused projections).

A linear layer is an einsum ``"X,W->O"`` of activations x and a weight w in which every index
appears in exactly two of the three terms (no batch index shared by all three): the contracted
indices are those of both x and w, the output holds the rest. Its gradients are then the
einsums ``"O,W->X"`` (dx) and ``"X,O->W"`` (dw).

FP8 (:func:`float8_einsum`): x and w are quantized to E4M3 and the incoming gradient to E5M2
(Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv:2209.05433, Sec. 3: E4M3 for
weights and activations, E5M2 for gradients; largest finite values 448 and 57344, Table 1),
each tensor with one scale per call from its own absolute maximum: current (per-tensor,
per-step) scaling, so the training state holds nothing more than in the compute dtype and
checkpoints resume across the switch. A tensor t becomes q = clip(t / s, -max, max) in FP8 with
s = amax(|t|) / max. Each GEMM multiplies the dequantized operands, q converted to the compute
dtype times s: the FP8 -> dequantize -> dot pattern that XLA's GPU compiler rewrites into one
cuBLASLt (hipBLASLt) FP8 GEMM with the two scales as its scaling factors (NVIDIA, "User Guide on
Native XLA-FP8", JAX-Toolbox documentation; the pattern of flax's ``flax.linen.fp8_ops``). A
``dot_general`` on FP8 operands directly would take one scale of 1 and cannot mix E4M3 with
E5M2 (ibid.). Where nothing rewrites it (the CPU) the same pattern runs in the compute dtype,
with the FP8 rounding exact, so the CPU's numbers are the GPU's up to the order of the sums.
The backward pass keeps the FP8 operands and their scales, not the compute-dtype ones.

Fused projections (:meth:`Linear.project`): the weights of projections that share an input
(Q, K and V; gate and up) are concatenated along their first output index inside the step and
multiplied in one GEMM, whose result is split again. Parameters and checkpoints keep the
separate weights. Under tensor parallelism the concatenation joins arrays split along that
index, which moves data: measure before turning it on there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

F32 = jnp.float32
# (forward, gradient) FP8 dtypes: the OCP formats (NVIDIA Hopper and later, AMD MI350), and the
# "fnuz" variants (no negative zero, one exponent bias more) that AMD MI300 GPUs compute in
# (AMD ROCm documentation, "Data types and precision support", FP8 on gfx942).
OCP_FP8 = (jnp.float8_e4m3fn, jnp.float8_e5m2)
FNUZ_FP8 = (jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz)


def _terms(spec: str) -> tuple[str, str, str]:
    """``"X,W->O"`` as (X, W, O).

    Raises:
        ValueError: ``spec`` is not a two-operand einsum in which every index appears in exactly
            two of the three terms.
    """
    inputs, _, out = spec.replace(" ", "").partition("->")
    x, _, w = inputs.partition(",")
    letters = x + w + out
    if not (x and w and out) or any(letters.count(c) != 2 for c in letters):
        raise ValueError(
            f"{spec!r} is not a linear layer's einsum: every index must appear in exactly two "
            "of the three terms"
        )
    return x, w, out


def quantize(t, dtype):
    """(q, scale): ``t`` (any shape, any float dtype) as ``dtype`` (an FP8 dtype) and the
    float32 scalar scale s = amax(|t|) / max(dtype), so that t ~ q * s (current scaling; an
    all-zero or non-finite amax takes s = 1, so q stays finite; values beyond max * s are
    clipped)."""
    top = float(jnp.finfo(dtype).max)
    amax = jnp.max(jnp.abs(t)).astype(F32)
    scale = jnp.where((amax > 0) & jnp.isfinite(amax), amax / top, 1.0).astype(F32)
    q = jnp.clip(t.astype(F32) / scale, -top, top).astype(dtype)
    return q, scale


def _dequantized(q, scale, dtype):
    """q (FP8) as ``dtype`` times ``scale`` (the dequantization XLA folds into an FP8 GEMM)."""
    return q.astype(dtype) * scale.astype(dtype)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def float8_einsum(spec: str, fnuz: bool, x, w):
    """A linear layer's einsum (module docstring) in FP8 with current scaling.

    Args:
        spec: ``"X,W->O"``, every index in exactly two terms (e.g. ``"bse,ehd->bshd"``).
        fnuz: the "fnuz" FP8 formats (:data:`FNUZ_FP8`, AMD MI300) instead of the OCP ones.
        x: activations in the compute dtype; w: the weight in the compute dtype.

    Returns:
        The einsum of the E4M3-rounded x and w, in x's dtype. Its gradients use the incoming
        gradient rounded to E5M2; dx comes back in x's dtype, dw in w's.

    Raises:
        ValueError: ``spec`` is not a linear layer's einsum.
    """
    return _float8_forward(spec, fnuz, x, w)[0]


def _float8_forward(spec: str, fnuz: bool, x, w):
    _terms(spec)
    forward = (FNUZ_FP8 if fnuz else OCP_FP8)[0]
    (qx, sx), (qw, sw) = quantize(x, forward), quantize(w, forward)
    dx, dw = _dequantized(qx, sx, x.dtype), _dequantized(qw, sw, w.dtype)
    out = jnp.einsum(spec, dx, dw, preferred_element_type=x.dtype)
    # the output and so its gradient are in x's dtype; an empty array carries w's
    return out, (qx, sx, qw, sw, jnp.zeros((0,), w.dtype))


def _float8_backward(spec: str, fnuz: bool, residuals, g):
    x_spec, w_spec, out_spec = _terms(spec)
    qx, sx, qw, sw, w_like = residuals
    qg, sg = quantize(g, (FNUZ_FP8 if fnuz else OCP_FP8)[1])
    g8 = _dequantized(qg, sg, g.dtype)
    w8, x8 = _dequantized(qw, sw, g.dtype), _dequantized(qx, sx, g.dtype)
    dx = jnp.einsum(f"{out_spec},{w_spec}->{x_spec}", g8, w8, preferred_element_type=g.dtype)
    dw = jnp.einsum(f"{x_spec},{out_spec}->{w_spec}", x8, g8, preferred_element_type=w_like.dtype)
    return dx, dw


float8_einsum.defvjp(_float8_forward, _float8_backward)


@dataclass(frozen=True)
class Linear:
    """How the decoder's linear layers compute (``--matmul-dtype``, ``--fused-projections``).

    Attributes:
        float8: FP8 GEMMs with current scaling (:func:`float8_einsum`); False: the compute
            dtype's (``jnp.einsum``, accumulated in float32 by the GEMM, rounded to the compute
            dtype).
        fused: projections that share an input run as one GEMM (:meth:`project`).
        fnuz: with ``float8``, the "fnuz" FP8 formats (:data:`FNUZ_FP8`, AMD MI300).
    """

    float8: bool = False
    fused: bool = False
    fnuz: bool = False

    def einsum(self, spec: str, x, w):
        """One linear layer (module docstring): x and w in the compute dtype; the result in
        x's dtype.

        Raises:
            ValueError: ``spec`` is not a linear layer's einsum (FP8 only checks it).
        """
        if self.float8:
            return float8_einsum(spec, self.fnuz, x, w)
        return jnp.einsum(spec, x, w)

    def project(self, spec: str, x, weights: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
        """The projections of one input ``x`` by each of ``weights`` (the same ``spec``; the
        weights may differ in the size of their first index that x lacks, as Q and K do in
        their heads), one result per weight in order.

        Fused: the weights concatenated along that index, one GEMM, the result split along it.

        Raises:
            ValueError: ``spec`` is not a linear layer's einsum, or its weight has no index
                that x lacks.
        """
        if not self.fused or len(weights) == 1:
            return tuple(self.einsum(spec, x, w) for w in weights)
        x_spec, w_spec, out_spec = _terms(spec)
        index = next((c for c in w_spec if c not in x_spec), None)
        if index is None:
            raise ValueError(f"{spec!r}: the weight has no output index to fuse along")
        w_axis, out_axis = w_spec.index(index), out_spec.index(index)
        sizes = [w.shape[w_axis] for w in weights]
        joined = self.einsum(spec, x, jnp.concatenate(weights, axis=w_axis))
        bounds = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
        return tuple(jnp.split(joined, bounds, axis=out_axis))
