"""The Llama decoder (Touvron et al. 2023; Meta 2024), written only against ``titan.ops``.

Pre-norm blocks: x + Attention(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)); RoPE on queries and
keys (with Llama 3.1's frequency scaling when the shape has it); grouped-query attention; untied
input embedding and output head (a tied checkpoint is imported with the head a copy of the
embedding, :mod:`titan.models.hf_llama`). Layers are stacked with ``nn.scan`` so each parameter
of the blocks has a leading ``layers`` axis.

Every parameter carries logical axis names (``vocab``, ``embed``, ``heads``, ``kv_heads``,
``head_dim``, ``mlp``, ``norm``, ``layers``), and the residual stream between blocks is
constrained to logical activation axes, as is the embedding lookup's output;
:mod:`titan.parallel.sharding` maps both to mesh axes
when the trainer traces the model under its mesh. The model never mentions devices or meshes.

Initialisation: normal(0.02) for every matrix, with the residual output projections (``wo``,
``w_down``) scaled by 1/sqrt(2 * n_layers) (Radford et al. 2019, GPT-2, Sec. 2.3); norm scales 1.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax.numpy as jnp

from titan.models.layer_stack import layer_stack
from titan.ops import Ops
from titan.ops.linear import Linear
from titan.parallel.sharding import ACTIVATION_AXES, EMBEDDING_LOOKUP_AXES
from titan.shapes import ModelConfig

INIT_STD = 0.02
PLAIN = Linear()  # the compute dtype's GEMMs, one per weight


def _param(module: nn.Module, name: str, axes: tuple[str, ...], shape: tuple[int, ...], std):
    init = nn.initializers.ones if std is None else nn.initializers.normal(std)
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, module.param_dtype)


class Block(nn.Module):
    """One decoder block. Input and output (B, S, E) in the compute dtype."""

    config: ModelConfig
    ops: Ops
    param_dtype: jnp.dtype = jnp.float32
    linear: Linear = PLAIN

    @nn.compact
    def __call__(self, x, positions, segment_ids):
        cfg, ops = self.config, self.ops
        e, h, k, d, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
        out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
        specs = {  # name: (logical axes, shape, init std; None: ones), in creation order
            "attn_norm": (("norm",), (e,), None),
            "wq": (("embed", "heads", "head_dim"), (e, h, d), INIT_STD),
            "wk": (("embed", "kv_heads", "head_dim"), (e, k, d), INIT_STD),
            "wv": (("embed", "kv_heads", "head_dim"), (e, k, d), INIT_STD),
            "wo": (("heads", "head_dim", "embed"), (h, d, e), out_std),
            "mlp_norm": (("norm",), (e,), None),
            "w_gate": (("embed", "mlp"), (e, f), INIT_STD),
            "w_up": (("embed", "mlp"), (e, f), INIT_STD),
            "w_down": (("mlp", "embed"), (f, e), out_std),
        }
        weights = {name: _param(self, name, *spec) for name, spec in specs.items()}

        def attend(q, key, value):
            return ops.attention(q, key, value, segment_ids=segment_ids, causal=True), None

        x, _ = block_forward(cfg, ops, weights, x, positions, attend, self.linear)
        return nn.with_logical_constraint(x, ACTIVATION_AXES), None


def block_forward(
    cfg: ModelConfig, ops: Ops, weights: dict, x, positions, attend, linear: Linear = PLAIN
):
    """One decoder block's math on its ``weights`` (the parameters :class:`Block` creates, by
    name), shared by :class:`Block` and the KV-cache decoder (:mod:`titan.models.kv_cache`).
    Its linear layers (Q, K, V, the output projection and the MLP's) compute as ``linear``
    says; norms, RoPE and attention as the ops' providers do.

    Args:
        x: (B, S, E) in the compute dtype; positions: (B, S) int32.
        attend: ``(q (B, S, H, D), k (B, S, K, D), v (B, S, K, D)) -> ((B, S, H, D), aux)``,
            the attention over this block's keys and values (with a cache: over the cached
            ones too); ``aux`` is passed back (the updated cache).

    Returns:
        ((B, S, E) in x's dtype, aux).
    """
    hidden = ops.rms_norm(x, weights["attn_norm"], eps=cfg.norm_eps)
    qkv = (weights["wq"], weights["wk"], weights["wv"])
    q, key, value = linear.project("bse,ehd->bshd", hidden, qkv)
    rope = functools.partial(ops.rope, theta=cfg.rope_theta, scaling=cfg.rope_scaling)
    q, key = rope(q, positions), rope(key, positions)
    attended, aux = attend(q, key, value)
    x = x + linear.einsum("bshd,hde->bse", attended, weights["wo"])
    hidden = ops.rms_norm(x, weights["mlp_norm"], eps=cfg.norm_eps)
    mlp = (weights["w_gate"], weights["w_up"], weights["w_down"])
    x = x + ops.swiglu(hidden, *mlp, linear=linear)
    return x, aux


class LlamaStage(nn.Module):
    """A contiguous slice of the Llama decoder: optionally the embedding, ``n_layers`` blocks,
    optionally the final norm, output head and loss. With both ends it is the whole model
    (:func:`Llama`); pipeline stages (:mod:`titan.layouts.mpmd`) are slices of it, with the same
    parameter names, so the same sharding rules and checkpoints apply.

    Attributes:
        config: the model shape.
        ops: semantic operators (providers chosen per backend).
        n_layers: blocks in this slice.
        has_embedding: the slice starts with the token embedding (input: (B, S) int32 ids).
        has_head: the slice ends with the final norm, output head and loss (output: (B, S)
            float32 nats); otherwise it returns (B, S, E) hidden states in the compute dtype.
        remat: ``none``, ``dots`` (save matmul outputs without batch dims, recompute the rest),
            ``dots-attention`` (also the fused attention kernels' outputs) or ``full`` (save
            only block inputs).
        layer_unroll: blocks per iteration of the layer scan (``unroll`` of ``jax.lax.scan``);
            0: chosen by depth and remat (:func:`titan.models.layer_stack.layer_unroll_for`);
            at least ``n_layers``: fully unrolled. Unrolled, XLA slices each block's
            parameters and stacks its residuals at fixed offsets instead of copying them through
            a loop's buffers, and schedules across block boundaries (measured with
            ``bench/mfu.py --levers layer_unroll``: ``docs/benchmarks.md``). Parameters and
            checkpoints are the same either way.
        document_mask: attention stays within a document (``segment_ids``); False: causal over
            the whole packed sequence (``segment_ids`` ignored).
        param_dtype: dtype parameters are created in (float32 master weights by default).
        linear: how the blocks' linear layers compute (:class:`titan.ops.linear.Linear`: the
            compute dtype or FP8, fused projections or not); the embedding and the output head
            compute in the compute dtype either way.

    Call args:
        inputs: (B, S) int32 token ids (with embedding) or (B, S, E) hidden states;
        positions: (B, S) int32; segment_ids: (B, S) int32 document ids (attention stays within
        a document); targets: (B, S) int32 next-token ids (with head). The caller casts
        parameters to the compute dtype before ``apply``.
    """

    config: ModelConfig
    ops: Ops
    n_layers: int
    has_embedding: bool = True
    has_head: bool = True
    remat: str = "none"
    layer_unroll: int = 0
    document_mask: bool = True
    param_dtype: jnp.dtype = jnp.float32
    linear: Linear = PLAIN

    @nn.compact
    def __call__(self, inputs, positions, segment_ids, targets=None):
        cfg = self.config
        if not self.document_mask:
            segment_ids = None
        x = inputs
        if self.has_embedding:
            shape = (cfg.vocab_size, cfg.d_model)
            embed = _param(self, "embed", ("vocab", "embed"), shape, INIT_STD)
            x = nn.with_logical_constraint(jnp.take(embed, inputs, axis=0), EMBEDDING_LOOKUP_AXES)
        x = nn.with_logical_constraint(x, ACTIVATION_AXES)
        stack = layer_stack(Block, self.remat, self.n_layers, self.layer_unroll, args=2)
        blocks = stack(cfg, self.ops, self.param_dtype, self.linear, name="layers")
        x, _ = blocks(x, positions, segment_ids)
        if not self.has_head:
            return x
        final_norm = _param(self, "final_norm", ("norm",), (cfg.d_model,), None)
        x = self.ops.rms_norm(x, final_norm, eps=cfg.norm_eps)
        head = _param(self, "head", ("embed", "vocab"), (cfg.d_model, cfg.vocab_size), INIT_STD)
        return self.ops.cross_entropy(x, head, targets)


def Llama(  # noqa: N802 - reads as the model class it builds
    config: ModelConfig, ops: Ops, remat: str = "none", param_dtype=jnp.float32
) -> LlamaStage:
    """The whole decoder: embedding, ``config.n_layers`` blocks, head and per-token loss
    ((B, S) float32 nats); call as ``(tokens, positions, segment_ids, targets)``."""
    return LlamaStage(config, ops, config.n_layers, remat=remat, param_dtype=param_dtype)
