"""Deterministic samplers of a trained diffusion model, with classifier-free guidance, and the
grid image they are shown in.

- Flow matching: Euler steps of the probability-flow ODE ``dx/dsigma = v`` from sigma = 1 (pure
  noise) to 0 over sigmas spaced linearly and shifted as in training
  (:func:`titan.diffusion.objectives.shift_sigmas`), ``x <- x + (sigma_next - sigma) v`` (as
  MaxDiffusion's ``FlowMatchScheduler.step``).
- DDPM: DDIM with eta = 0 (Song et al. 2021, "Denoising Diffusion Implicit Models", Eq. 12):
  from the prediction, x_0 = (x - sqrt(1 - abar) eps) / sqrt(abar) (epsilon) or
  sqrt(abar) x - sqrt(1 - abar) v and eps = sqrt(1 - abar) x + sqrt(abar) v (v; Salimans & Ho
  2022, Appendix D); x_0 clipped to [-1, 1] (diffusers' ``clip_sample``); then
  ``x_prev = sqrt(abar_prev) x_0 + sqrt(1 - abar_prev) eps``, over ``steps`` timesteps evenly
  spaced from 999 down to 0 (abar_prev = 1 after the last).
- Classifier-free guidance (Ho & Salimans 2022, Eq. 6): the prediction is
  ``uncond + guidance (cond - uncond)``, the unconditional one with the null label; guidance 1
  is the conditional model alone.

A sample depends only on the parameters, the labels, the seed (the initial noise is
``jax.random.normal(jax.random.key(seed))``), the steps and the guidance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from titan.diffusion.objectives import TRAIN_TIMESTEPS, Objective, alphas_cumprod, shift_sigmas

# (noisy (B, H, W, C), timesteps (B,) float32, labels (B,) int32) -> prediction (B, H, W, C)
Predict = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def guided(predict: Predict, null_label: int, guidance: float) -> Predict:
    """``predict`` with classifier-free guidance: one call on the rows twice over, with their
    labels and with the null label."""

    def run(x, t, labels):
        both = predict(
            jnp.concatenate([x, x]),
            jnp.concatenate([t, t]),
            jnp.concatenate([labels, jnp.full_like(labels, null_label)]),
        )
        cond, uncond = jnp.split(both.astype(jnp.float32), 2)
        return uncond + guidance * (cond - uncond)

    return run


def euler_flow(predict: Predict, x: jax.Array, labels: jax.Array, steps: int, shift: float):
    """Flow matching's Euler sampler (module docstring) from the noise ``x``."""
    sigmas = shift_sigmas(np.linspace(1.0, 0.0, steps + 1), shift)
    step = jax.jit(
        lambda x, s, s_next: (
            x + (s_next - s) * predict(x, jnp.full(x.shape[:1], s * 1000.0), labels)
        )
    )
    for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True):
        x = step(x, jnp.float32(s), jnp.float32(s_next))
    return x


def ddim(predict: Predict, x: jax.Array, labels: jax.Array, steps: int, objective: Objective):
    """DDIM (eta = 0) for epsilon or v prediction (module docstring) from the noise ``x``."""
    abar = alphas_cumprod(objective.beta_schedule)
    timesteps = np.round(np.linspace(TRAIN_TIMESTEPS - 1, 0, steps)).astype(np.int64)

    def update(x, t, a, a_prev):
        out = predict(x, jnp.full(x.shape[:1], t, jnp.float32), labels)
        if objective.kind == "epsilon":
            eps = out
            x0 = (x - jnp.sqrt(1 - a) * eps) / jnp.sqrt(a)
        else:
            x0 = jnp.sqrt(a) * x - jnp.sqrt(1 - a) * out
            eps = jnp.sqrt(1 - a) * x + jnp.sqrt(a) * out
        x0 = jnp.clip(x0, -1.0, 1.0)
        return jnp.sqrt(a_prev) * x0 + jnp.sqrt(1 - a_prev) * eps

    step = jax.jit(update)
    for i, t in enumerate(timesteps):
        a_prev = abar[timesteps[i + 1]] if i + 1 < len(timesteps) else 1.0
        x = step(x, jnp.float32(t), jnp.float32(abar[t]), jnp.float32(a_prev))
    return x


def sample(
    predict: Predict,
    objective: Objective,
    shape: tuple[int, int, int],
    labels: np.ndarray,
    null_label: int,
    *,
    seed: int = 0,
    steps: int = 50,
    guidance: float = 1.0,
) -> np.ndarray:
    """Images for ``labels`` from the model behind ``predict``.

    Args:
        shape: (H, W, C) of one image; labels: (B,) int class labels.
        null_label: the label of the unconditional model (used when ``guidance != 1``).

    Returns:
        (B, H, W, C) float32 in [-1, 1].
    """
    classes = jnp.asarray(labels, jnp.int32)
    x = jax.random.normal(jax.random.key(seed), (len(classes), *shape), jnp.float32)
    model = predict if guidance == 1.0 else guided(predict, null_label, guidance)
    if objective.kind == "flow":
        x = euler_flow(model, x, classes, steps, objective.flow_shift)
    else:
        x = ddim(model, x, classes, steps, objective)
    return np.clip(np.asarray(x, np.float32), -1.0, 1.0)


def grid(images: np.ndarray, columns: int = 0, pad: int = 1) -> np.ndarray:
    """(B, H, W, C) images in [-1, 1] -> one (rows (H + pad) + pad, cols (W + pad) + pad, C)
    uint8 image, row-major, ``columns`` per row (0: ceil(sqrt(B))), separated by ``pad`` black
    pixels."""
    b, h, w, c = images.shape
    columns = columns or math.ceil(math.sqrt(b))
    rows = math.ceil(b / columns)
    out = np.zeros((rows * (h + pad) + pad, columns * (w + pad) + pad, c), np.uint8)
    pixels = np.round((np.clip(images, -1, 1) + 1) * 127.5).astype(np.uint8)
    for i, image in enumerate(pixels):
        r, col = divmod(i, columns)
        top, left = pad + r * (h + pad), pad + col * (w + pad)
        out[top : top + h, left : left + w] = image
    return out
