"""Provider ``fused`` of ``cross_entropy``: the output head and the loss with a hand-written
backward pass, so that the loss costs two passes over the (B, S, V) logits instead of several.

Autodiff of the native loss (logsumexp, then ``take_along_axis`` of the target logit) saves float32
logits and builds the logits' gradient as a float32 scatter of the one-hot targets into zeros plus
a float32 softmax, then casts it to the compute dtype for the head's matmuls: about six
float32-sized passes over B * S * V values. Here the forward pass keeps the logits in the matmul's
output dtype (the compute dtype) and the float32 log-normaliser per position; the backward pass
writes the logits' gradient in one elementwise pass,

    d logits[b, s, v] = g[b, s] * (exp(logits[b, s, v] - log_z[b, s]) - [v == target[b, s]])

(the softmax gradient of the negative log-likelihood; Bishop 2006, Pattern Recognition and Machine
Learning, Sec. 4.3.4), directly in the compute dtype, with the one-hot comparison fused in.
Results equal the native provider's up to float32 rounding: the forward values are the same
operations, and the native backward rounds the same gradient to the compute dtype before the
matmuls.

Runs on every backend; the registry chooses it before ``native``. Measurements (``bench/mfu.py``,
``titan train --preset llama3-1b``, ``titan ops check``): ``docs/benchmarks.md``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


@jax.custom_vjp
def cross_entropy(x, w_out, targets):
    """Head + per-token negative log-likelihood; arguments and result as
    :meth:`titan.ops.Ops.cross_entropy` (x (B, S, E), w_out (E, V), targets (B, S) int32;
    returns (B, S) float32 nats)."""
    nll, _ = _forward(x, w_out, targets)
    return nll


def _forward(x, w_out, targets):
    logits = jnp.einsum("bse,ev->bsv", x, w_out)
    log_z = jax.nn.logsumexp(logits.astype(F32), axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return log_z - target_logit.astype(F32), (x, w_out, targets, logits, log_z)


def _backward(residuals, g):
    x, w_out, targets, logits, log_z = residuals
    vocab = jnp.arange(logits.shape[-1], dtype=targets.dtype)
    one_hot = (vocab == targets[..., None]).astype(F32)
    softmax = jnp.exp(logits.astype(F32) - log_z[..., None])
    d_logits = (g[..., None] * (softmax - one_hot)).astype(logits.dtype)
    d_x = jnp.einsum("bsv,ev->bse", d_logits, w_out)
    d_w = jnp.einsum("bse,bsv->ev", x, d_logits)
    return d_x, d_w, None


cross_entropy.defvjp(_forward, _backward)
