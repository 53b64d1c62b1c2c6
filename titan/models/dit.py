"""The diffusion transformer (DiT, Peebles & Xie 2023, "Scalable Diffusion Models with
Transformers"), written only against ``titan.ops``.

The image (B, H, W, C) is cut into P x P patches and embedded (``ops.patch_embed``) with a fixed
2-D sine-cosine position embedding (the paper's Sec. 3.2, from MAE). The conditioning
``c = MLP(sinusoid(t)) + label_table[y]`` (the timestep's 256 sinusoidal features, as the
paper's code, and the class label; the last row of the table is the null label of
classifier-free guidance) drives every block through adaLN-Zero (Sec. 3.2): one linear layer of
``silu(c)`` gives shift, scale and gate for the attention and the MLP, zero-initialised so that
each block starts as the identity. Blocks are pre-norm, non-causal attention over the patches
(``ops.attention(causal=False)``) and a SwiGLU MLP (``ops.swiglu``), with RMSNorm
(``ops.rms_norm``) where the paper has LayerNorm without affine parameters. The final layer
(norm, adaLN with shift and scale, a zero-initialised linear map to P x P x C values per patch)
predicts the regression target (noise, v or velocity; :mod:`titan.diffusion.objectives`).

So that pipeline stages hand on one array, as the Llama's do, the conditioning travels as row 0
of the residual stream: a chunk's activation is (B, 1 + N, E), ``c`` then the N patch tokens;
attention and the MLP see only the patch tokens. Layers are stacked with ``nn.scan`` (a leading
``layers`` axis), so chunks re-cut as the Llama's do. Parameters carry logical axis names
(:mod:`titan.parallel.sharding`).

Initialisation: normal(0.02) for every matrix and the label table (Llama's ``INIT_STD``), zeros
for biases, the adaLN modulations and the final linear layer (adaLN-Zero, Sec. 3.2).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from titan.models.layer_stack import layer_stack
from titan.models.llama import INIT_STD
from titan.ops import Ops
from titan.parallel.sharding import ACTIVATION_AXES
from titan.shapes import TIMESTEP_FREQUENCIES, ModelConfig


def _param(module: nn.Module, name: str, axes: tuple[str, ...], shape: tuple[int, ...], init):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, module.param_dtype)


NORMAL = nn.initializers.normal(INIT_STD)
ZEROS = nn.initializers.zeros
ONES = nn.initializers.ones


def timestep_features(t: jax.Array, dim: int = TIMESTEP_FREQUENCIES) -> jax.Array:
    """(B,) timesteps -> (B, dim) float32 sinusoidal features [cos(t f_i), sin(t f_i)] with
    f_i = 10000^(-i / (dim / 2)) (Vaswani et al. 2017, Sec. 3.5; DiT's ``TimestepEmbedder``)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    angles = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def position_embedding(grid: int, dim: int) -> np.ndarray:
    """(grid^2, dim) float32 fixed 2-D sine-cosine position embedding (MAE, He et al. 2022; DiT
    Sec. 3.2): half the features encode the row, half the column, each as 1-D sin-cos with
    frequencies 10000^(-i / (dim / 4))."""
    quarter = dim // 4
    omega = 1.0 / 10_000 ** (np.arange(quarter, dtype=np.float64) / quarter)
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")

    def one_d(pos: np.ndarray) -> np.ndarray:
        angles = pos.reshape(-1)[:, None] * omega[None]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    return np.concatenate([one_d(rows), one_d(cols)], axis=1).astype(np.float32)


def unpatchify(x: jax.Array, patch: int, channels: int) -> jax.Array:
    """(B, N, P * P * C) per-patch values -> (B, H, W, C) image (inverse of the row-major
    patchify of ``ops.patch_embed``), N = (H / P)^2."""
    b, n, _ = x.shape
    grid = math.isqrt(n)
    x = x.reshape(b, grid, grid, patch, patch, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, grid * patch, grid * patch, channels)


def weighted_mse(prediction: jax.Array, target: jax.Array, weight: jax.Array) -> jax.Array:
    """(B,) float32 ``weight_b * mean((prediction_b - target_b)^2)`` over each row's pixels
    (the diffusion loss of :mod:`titan.diffusion.objectives`)."""
    squared = jnp.square(prediction.astype(jnp.float32) - target.astype(jnp.float32))
    return weight.astype(jnp.float32) * jnp.mean(squared, axis=tuple(range(1, squared.ndim)))


def _modulation(module: nn.Module, name: str, c: jax.Array, chunks: int) -> jax.Array:
    """adaLN(-Zero)'s linear map of silu(c): (B, E) -> (B, chunks, E), zero-initialised."""
    e = c.shape[-1]
    w = _param(module, f"{name}_w", ("embed", "modulation", "norm"), (e, chunks, e), ZEROS)
    bias = _param(module, f"{name}_b", ("modulation", "norm"), (chunks, e), ZEROS)
    return jnp.einsum("be,ekf->bkf", jax.nn.silu(c), w) + bias


class DitBlock(nn.Module):
    """One DiT block with adaLN-Zero. Input and output (B, 1 + N, E): row 0 the conditioning,
    then the patch tokens, in the compute dtype."""

    config: ModelConfig
    ops: Ops
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, _):
        cfg, ops = self.config, self.ops
        e, h, d, f = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.ffn_dim
        c, tokens = x[:, 0], x[:, 1:]
        attn_norm = _param(self, "attn_norm", ("norm",), (e,), ONES)
        wq = _param(self, "wq", ("embed", "heads", "head_dim"), (e, h, d), NORMAL)
        wk = _param(self, "wk", ("embed", "heads", "head_dim"), (e, h, d), NORMAL)
        wv = _param(self, "wv", ("embed", "heads", "head_dim"), (e, h, d), NORMAL)
        wo = _param(self, "wo", ("heads", "head_dim", "embed"), (h, d, e), NORMAL)
        mlp_norm = _param(self, "mlp_norm", ("norm",), (e,), ONES)
        w_gate = _param(self, "w_gate", ("embed", "mlp"), (e, f), NORMAL)
        w_up = _param(self, "w_up", ("embed", "mlp"), (e, f), NORMAL)
        w_down = _param(self, "w_down", ("mlp", "embed"), (f, e), NORMAL)
        mod = _modulation(self, "ada", c, 6).astype(x.dtype)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = (mod[:, i] for i in range(6))

        hidden = ops.modulate(ops.rms_norm(tokens, attn_norm, eps=cfg.norm_eps), shift_a, scale_a)
        q = jnp.einsum("bse,ehd->bshd", hidden, wq)
        k = jnp.einsum("bse,ehd->bshd", hidden, wk)
        v = jnp.einsum("bse,ehd->bshd", hidden, wv)
        attended = ops.attention(q, k, v, causal=False)
        tokens = tokens + gate_a[:, None] * jnp.einsum("bshd,hde->bse", attended, wo)
        hidden = ops.modulate(ops.rms_norm(tokens, mlp_norm, eps=cfg.norm_eps), shift_m, scale_m)
        tokens = tokens + gate_m[:, None] * ops.swiglu(hidden, w_gate, w_up, w_down)
        x = jnp.concatenate([c[:, None], tokens], axis=1)
        return nn.with_logical_constraint(x, ACTIVATION_AXES), None


class DitStage(nn.Module):
    """A contiguous slice of the DiT: optionally the embedding (patches, timestep, label),
    ``n_layers`` blocks, optionally the final layer and the loss. Slices keep the whole model's
    parameter names (as :class:`titan.models.llama.LlamaStage`).

    Call args:
        inputs: (B, H, W, C) noisy images (with the embedding) or (B, 1 + N, E) activations;
        t: (B,) float32 timesteps; labels: (B,) int32 class labels (the null label
        ``vocab_size - 1`` for unconditional rows); target: (B, H, W, C) and weight (B,) float32
        (with the head). Returns the activations, or with the head the (B,) float32 weighted
        mean squared errors, or the (B, H, W, C) float32 prediction when ``target`` is None.
    """

    config: ModelConfig
    ops: Ops
    n_layers: int
    has_embedding: bool = True
    has_head: bool = True
    remat: str = "none"
    layer_unroll: int = 0
    param_dtype: jnp.dtype = jnp.float32

    def _embed(self, images, t, labels):
        cfg, e, p = self.config, self.config.d_model, self.config.patch_size
        patch_w = _param(
            self, "patch_w", ("patch", "patch", "patch", "embed"), (p, p, cfg.channels, e), NORMAL
        )
        patch_b = _param(self, "patch_b", ("norm",), (e,), ZEROS)
        t_w1 = _param(self, "t_w1", ("timestep", "embed"), (TIMESTEP_FREQUENCIES, e), NORMAL)
        t_b1 = _param(self, "t_b1", ("norm",), (e,), ZEROS)
        t_w2 = _param(self, "t_w2", ("embed", "norm"), (e, e), NORMAL)
        t_b2 = _param(self, "t_b2", ("norm",), (e,), ZEROS)
        label_table = _param(self, "label_table", ("label", "embed"), (cfg.vocab_size, e), NORMAL)
        dtype = images.dtype
        tokens = self.ops.patch_embed(images, patch_w, patch_b, patch=p)
        grid = cfg.image_size // p
        tokens = tokens + jnp.asarray(position_embedding(grid, e), dtype)[None]
        hidden = jax.nn.silu(timestep_features(t).astype(dtype) @ t_w1 + t_b1)
        c = hidden @ t_w2 + t_b2 + jnp.take(label_table, labels, axis=0)
        return jnp.concatenate([c[:, None].astype(dtype), tokens], axis=1)

    def _final(self, x):
        cfg, e = self.config, self.config.d_model
        out = cfg.patch_size**2 * cfg.channels
        c, tokens = x[:, 0], x[:, 1:]
        final_norm = _param(self, "final_norm", ("norm",), (e,), ONES)
        shift, scale = (
            m for m in _modulation(self, "final_ada", c, 2).astype(x.dtype).swapaxes(0, 1)
        )
        out_w = _param(self, "out_w", ("embed", "patch"), (e, out), ZEROS)
        out_b = _param(self, "out_b", ("patch",), (out,), ZEROS)
        hidden = self.ops.modulate(
            self.ops.rms_norm(tokens, final_norm, eps=cfg.norm_eps), shift, scale
        )
        values = jnp.einsum("bne,eo->bno", hidden, out_w, preferred_element_type=jnp.float32)
        return unpatchify(values + out_b.astype(jnp.float32), cfg.patch_size, cfg.channels)

    @nn.compact
    def __call__(self, inputs, t, labels, target=None, weight=None):
        x = self._embed(inputs, t, labels) if self.has_embedding else inputs
        x = nn.with_logical_constraint(x, ACTIVATION_AXES)
        stack = layer_stack(DitBlock, self.remat, self.n_layers, self.layer_unroll, args=1)
        x, _ = stack(self.config, self.ops, self.param_dtype, name="layers")(x, None)
        if not self.has_head:
            return x
        prediction = self._final(x)
        if target is None:
            return prediction
        return weighted_mse(prediction, target, weight)
