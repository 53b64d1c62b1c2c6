"""Provider ``fused`` of ``rope``: rotary position embedding with a hand-written backward pass.

RoPE rotates each (x1, x2) pair of the rotate-half layout by the angle position * theta^(-2i/D)
(Su et al. 2021, Eq. 34). A rotation's transpose is the rotation by the negated angle, so the
gradient is

    d x = rotate(g, cos, -sin)

the forward formula applied to the incoming gradient. Autodiff of the native provider instead
transposes its slices and concatenation into pads and adds of the two halves, a fusion slower
than the forward's. The forward pass saves only the positions: cos and sin are recomputed,
inside the same fusion, in the backward pass.

Values equal the native provider's (the same float32 operations, rounded once to x's dtype).
Gradients are computed in float32 too and rounded once to x's dtype: in float32 they equal
native's up to rounding, in bfloat16 a few elements can differ from native's by one bfloat16 ulp
(the two sum the halves' products in another order), so a bf16 run drifts from a native-RoPE run
the way two reduction orders do. Runs on every backend; the registry chooses it before
``native``. Restrictions, none of which the model runs into: reverse-mode autodiff only
(``jax.custom_vjp``), ``theta`` a Python number and ``scaling`` a frozen dataclass or None
(both static), no gradient for the (integer) positions.

Measurements (``bench/mfu.py --levers rope``, ``titan train --preset llama3-1b``):
``docs/benchmarks.md``.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np

from titan.ops.native import rope_cos_sin, rotate_halves


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rope(x, positions, theta, scaling):
    return rotate_halves(x, *rope_cos_sin(positions, x.shape[-1] // 2, theta, scaling))


def _forward(x, positions, theta, scaling):
    return _rope(x, positions, theta, scaling), positions


def _backward(theta, scaling, positions, g):
    cos, sin = rope_cos_sin(positions, g.shape[-1] // 2, theta, scaling)
    no_gradient = np.zeros(positions.shape, jax.dtypes.float0)  # integer positions
    return rotate_halves(g, cos, -sin), no_gradient


_rope.defvjp(_forward, _backward)


def rope(x, positions, *, theta, scaling=None):
    """RoPE; arguments and result as :meth:`titan.ops.Ops.rope` (x (B, S, N, D) with D even,
    positions (B, S) integers, ``scaling`` Llama 3.1's or None; returns x's shape and dtype)."""
    return _rope(x, positions, theta, scaling)
