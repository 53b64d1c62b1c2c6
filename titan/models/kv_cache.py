"""Titan's Llama with a key/value cache, for generation (:mod:`titan.generation`).

The same blocks as training (:func:`titan.models.llama.block_forward`, on the whole model's
parameters as :class:`titan.models.llama.LlamaStage` names them), with the attention over a
cache: each call writes its tokens' keys and values into the cache at their positions and
attends over every cached position up to its own. The cache is preallocated to the whole
generation's length (prompt + new tokens), so its shapes never change: a prefill of the
prompt compiles once, and the decode step (one token) once.

The fused attention providers (``cudnn``, ``pallas``) take no cache, so the cached attention is
plain JAX, the formula of the ``native`` provider (:func:`titan.ops.native.attention`) with
the causal mask over absolute positions: decoding runs on the native attention. RMSNorm, RoPE
and SwiGLU go through the operator registry as in training. The output head is a plain matmul
(the ``cross_entropy`` operator returns losses, not logits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titan.models.llama import block_forward
from titan.ops import Ops
from titan.shapes import ModelConfig

F32 = jnp.float32


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype: jnp.dtype) -> dict[str, jax.Array]:
    """An empty cache: ``{"k", "v"}``, each (L, B, T, K, D) zeros in ``dtype`` (L layers,
    T = ``length`` positions, K key/value heads, D head dim)."""
    shape = (cfg.n_layers, batch, length, cfg.n_kv_heads, cfg.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array) -> jax.Array:
    """Grouped-query attention of ``q`` over a whole cache, causal in absolute positions.

    Args:
        q: (B, S, H, D) queries at ``positions`` (B, S) int32.
        k, v: (B, T, K, D) cached keys and values, position t at index t; positions after the
            last written one are masked by causality.

    Returns:
        (B, S, H, D) in q's dtype: softmax(q k^T / sqrt(D)) v in float32 over the cached
        positions <= each query's (Vaswani et al. 2017, Sec. 3.2; GQA: Ainslie et al. 2023).
    """
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bskgd,btkd->bkgst", grouped, k, preferred_element_type=F32)
    scores = scores * (head_dim**-0.5)
    mask = jnp.arange(k.shape[1])[None, None, :] <= positions[:, :, None]  # (B, S, T)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgst,btkd->bskgd", probs.astype(v.dtype), v, preferred_element_type=F32)
    return out.reshape(batch, seq, heads, head_dim).astype(q.dtype)


def cached_forward(
    cfg: ModelConfig,
    ops: Ops,
    params: dict,
    tokens: jax.Array,
    start: jax.Array,
    cache: dict[str, jax.Array],
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The logits of ``tokens`` at positions ``start`` on, given the cache of the positions
    before them; the cache comes back with these tokens' keys and values written in.

    Args:
        params: the whole model's parameters (``embed``, ``layers``, ``final_norm``, ``head``),
            already in the compute dtype.
        tokens: (B, S) int32; start: int32 scalar, the position of ``tokens[:, 0]``.
        cache: from :func:`init_cache`, its T >= start + S.

    Returns:
        ((B, S, V) float32 logits, the updated cache).
    """
    batch, seq = tokens.shape
    positions = jnp.broadcast_to(start + jnp.arange(seq, dtype=jnp.int32), (batch, seq))
    x = jnp.take(params["embed"], tokens, axis=0)

    def layer(x, layer_state):
        weights, k_cache, v_cache = layer_state

        def attend(q, key, value):
            where = (0, start, 0, 0)
            k_new = jax.lax.dynamic_update_slice(k_cache, key.astype(k_cache.dtype), where)
            v_new = jax.lax.dynamic_update_slice(v_cache, value.astype(v_cache.dtype), where)
            return cached_attention(q, k_new, v_new, positions), (k_new, v_new)

        return block_forward(cfg, ops, weights, x, positions, attend)

    x, (k, v) = jax.lax.scan(layer, x, (params["layers"], cache["k"], cache["v"]))
    x = ops.rms_norm(x, params["final_norm"], eps=cfg.norm_eps)
    logits = jnp.einsum("bse,ev->bsv", x, params["head"], preferred_element_type=F32)
    return logits, {"k": k, "v": v}
