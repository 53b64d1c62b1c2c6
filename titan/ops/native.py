"""Reference implementations of the semantic operators in plain JAX (provider ``native``).

They run on every backend, accumulate matmuls and reductions in float32 and return the input's
dtype (except :func:`cross_entropy`, which returns float32 losses). Shapes and formulas are
documented on the public wrappers in :mod:`titan.ops`.

The MLP and output-head matmuls return the compute dtype (accumulated in float32, rounded once),
and elementwise math upcasts after them. Asking those matmuls for float32 results instead would
make autodiff run the gradient matmuls on float32 cotangents, i.e. in float32 rather than on the
bf16 tensor cores, a much slower train step. Mixed-precision training rounds activations and
their gradients to the compute dtype likewise (Micikevicius et al. 2018, Sec. 3.3). Attention keeps
float32 scores (the softmax needs them); it serves on GPUs only when no fused provider can.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from titan.ops.linear import Linear

F32 = jnp.float32


def attention(q, k, v, *, segment_ids=None, causal=True, sliding_window=None):
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bskgd,btkd->bkgst", grouped, k, preferred_element_type=F32)
    scores = scores * (head_dim**-0.5)
    query_pos = jnp.arange(seq)[:, None]
    key_pos = jnp.arange(seq)[None, :]
    mask = jnp.ones((seq, seq), dtype=bool)
    if causal:
        mask = key_pos <= query_pos
    if sliding_window is not None:
        mask = mask & (query_pos - key_pos < sliding_window)
    mask = mask[None, None, None]
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = mask & same[:, None, None]
    scores = jnp.where(mask, scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgst,btkd->bskgd", probs.astype(v.dtype), v, preferred_element_type=F32)
    return out.reshape(batch, seq, heads, head_dim).astype(q.dtype)


def rms_norm(x, scale, *, eps):
    x32 = x.astype(F32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale.astype(F32)).astype(x.dtype)


def rope_inv_freq(half: int, theta: float, scaling=None):
    """(half,) float32 RoPE frequencies theta^(-i/half) (Su et al. 2021, Eq. 34), with Llama 3.1's
    scaling when ``scaling`` (a :class:`titan.shapes.RopeScaling`) is given: wavelengths
    2 pi / f above L / low_freq_factor are divided by ``factor``, those below
    L / high_freq_factor kept, and in between f ((1 - s) / factor + s) with
    s = (L / wavelength - low) / (high - low), L = ``original_max_position_embeddings``
    (Meta's ``llama_models`` ``apply_scaling``; transformers' ``_compute_llama3_parameters``)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=F32) / half))
    if scaling is None:
        return inv_freq
    context, low, high = (
        scaling.original_max_position_embeddings,
        scaling.low_freq_factor,
        scaling.high_freq_factor,
    )
    wavelength = 2 * math.pi / inv_freq
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = jnp.where(wavelength > context / low, inv_freq / scaling.factor, inv_freq)
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return jnp.where(medium, blended, scaled)


def rope_cos_sin(positions, half: int, theta: float, scaling=None):
    """cos and sin of RoPE's angles position * :func:`rope_inv_freq`, each (B, S, 1, half)
    float32."""
    angles = positions.astype(F32)[..., None] * rope_inv_freq(half, theta, scaling)
    return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def rotate_halves(x, cos, sin):
    """(x1 cos - x2 sin, x2 cos + x1 sin) over the two halves x1, x2 of x's last axis, computed
    in float32 and returned in x's dtype."""
    half = x.shape[-1] // 2
    x1 = x[..., :half].astype(F32)
    x2 = x[..., half:].astype(F32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rope(x, positions, *, theta, scaling=None):
    return rotate_halves(x, *rope_cos_sin(positions, x.shape[-1] // 2, theta, scaling))


def swiglu_gating(gate, up):
    """silu(gate) * up, computed in float32 and returned in gate's dtype."""
    return (jax.nn.silu(gate.astype(F32)) * up.astype(F32)).astype(gate.dtype)


def swiglu(x, w_gate, w_up, w_down, *, gating=swiglu_gating, linear: Linear | None = None):
    """The MLP around ``gating`` (elementwise on the (B, S, F) projections; providers may pass
    their own, with another backward pass), its matmuls computed as ``linear`` says (None:
    ``Linear()``)."""
    linear = Linear() if linear is None else linear
    gate, up = linear.project("bse,ef->bsf", x, (w_gate, w_up))
    return linear.einsum("bsf,fe->bse", gating(gate, up), w_down)


def cross_entropy(x, w_out, targets):
    logits = jnp.einsum("bse,ev->bsv", x, w_out).astype(F32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return log_z - target_logit


def modulate(x, shift, scale):
    x32 = x.astype(F32)
    shift32, scale32 = shift.astype(F32)[:, None, :], scale.astype(F32)[:, None, :]
    return (x32 * (1.0 + scale32) + shift32).astype(x.dtype)


def patchify(images, patch: int):
    """(B, H, W, C) -> (B, H/p * W/p, p, p, C): non-overlapping p x p patches in row-major
    order (ViT, Dosovitskiy et al. 2021, Sec. 3.1)."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // patch) * (w // patch), patch, patch, c)


def patch_embed(images, w, bias, *, patch):
    x = patchify(images, patch)
    out = jnp.einsum("bnijc,ijce->bne", x, w, preferred_element_type=F32)
    return (out + bias.astype(F32)).astype(images.dtype)
