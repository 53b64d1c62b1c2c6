"""Diffusion training objectives: noise schedules, the noisy input, the regression target and the
per-example loss weight of DDPM (epsilon or v prediction, optional Min-SNR-gamma weighting) and of
flow matching (MaxDiffusion's shifted timesteps and weighting).

Everything here is host-side NumPy (float64 math, float32 results): the data loader draws the
noise and timesteps of every example from the run's seed and its position in the data
(:mod:`titan.data.images`), so a batch, and therefore the loss, is the same on every layout and
after a resume. The model then regresses ``target`` from ``noisy`` with the loss
``mean_b(weight_b * mean((prediction_b - target_b)^2))`` (:func:`weighted_mse`).

Sources:

- DDPM: Ho et al. 2020, "Denoising Diffusion Probabilistic Models": the forward process
  ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`` (Eq. 4), the linear beta schedule from 1e-4
  to 0.02 over T = 1000 steps (Sec. 4) and the epsilon target (Eq. 14).
- Cosine schedule: Nichol & Dhariwal 2021, "Improved Denoising Diffusion Probabilistic Models",
  Eq. 17 (s = 0.008, betas clipped at 0.999).
- v prediction: Salimans & Ho 2022, "Progressive Distillation", Sec. 4 and Appendix D:
  ``v = sqrt(abar_t) eps - sqrt(1 - abar_t) x_0``.
- Min-SNR-gamma weighting: Hang et al. 2023, "Efficient Diffusion Training via Min-SNR Weighting
  Strategy", Sec. 3.4, with SNR = abar / (1 - abar): the loss weight ``min(SNR, gamma) / SNR`` for
  epsilon prediction and ``min(SNR, gamma) / (SNR + 1)`` for v prediction (as diffusers'
  ``train_text_to_image.py`` and MaxDiffusion's Stable Diffusion trainer apply ``snr_gamma``).
- Flow matching as MaxDiffusion trains Wan and Flux (its ``FlowMatchScheduler``, from
  DiffSynth-Studio): T = 1000 training sigmas spaced linearly from 1 to 0.003/1.002, shifted by
  ``shift * s / (1 + (shift - 1) * s)`` (Esser et al. 2024, SD3, Eq. 23), timestep = 1000 x sigma,
  the noisy input ``(1 - sigma) x_0 + sigma noise``, the target ``noise - x_0`` (rectified flow,
  Liu et al. 2022), and the ``gaussian`` weighting ``exp(-2 ((t - T/2) / T)^2)`` minus its minimum,
  scaled to mean 1 over the T timesteps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from titan.errors import TitanError

OBJECTIVES = ("flow", "epsilon", "v")
BETA_SCHEDULES = ("linear", "cosine")
FLOW_WEIGHTINGS = ("gaussian", "none")
TRAIN_TIMESTEPS = 1000  # T of DDPM (Ho et al. 2020, Sec. 4) and of MaxDiffusion's flow schedule
FLOW_SIGMA_MIN = 0.003 / 1.002  # MaxDiffusion's FlowMatchScheduler default


def beta_schedule(kind: str, steps: int = TRAIN_TIMESTEPS) -> np.ndarray:
    """(steps,) float64 DDPM betas: ``linear`` (1e-4 to 0.02, Ho et al. 2020) or ``cosine``
    (Nichol & Dhariwal 2021, Eq. 17).

    Raises:
        TitanError: unknown ``kind``.
    """
    if kind == "linear":
        return np.linspace(1e-4, 0.02, steps, dtype=np.float64)
    if kind == "cosine":
        s = 0.008
        f = np.cos((np.arange(steps + 1) / steps + s) / (1 + s) * np.pi / 2) ** 2
        return np.clip(1 - f[1:] / f[:-1], 0.0, 0.999)
    raise TitanError(f"--beta-schedule must be one of {', '.join(BETA_SCHEDULES)}, got {kind!r}")


def alphas_cumprod(kind: str, steps: int = TRAIN_TIMESTEPS) -> np.ndarray:
    """(steps,) float64 abar_t = prod_{s <= t} (1 - beta_s)."""
    return np.cumprod(1.0 - beta_schedule(kind, steps))


def flow_sigmas(shift: float, steps: int = TRAIN_TIMESTEPS) -> np.ndarray:
    """(steps,) float64 MaxDiffusion's training sigmas, from 1 down to :data:`FLOW_SIGMA_MIN`,
    shifted: ``shift * s / (1 + (shift - 1) * s)``."""
    return shift_sigmas(np.linspace(1.0, FLOW_SIGMA_MIN, steps, dtype=np.float64), shift)


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """The timestep shift of SD3 (Esser et al. 2024, Eq. 23) as MaxDiffusion applies it."""
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def flow_weights(sigmas: np.ndarray, weighting: str) -> np.ndarray:
    """(T,) float64 loss weight per training timestep: ``gaussian`` (MaxDiffusion's
    ``training_weight``: ``exp(-2 ((t - T/2) / T)^2)`` with t = T x sigma, minus its minimum,
    scaled so that the T weights sum to T) or ``none`` (ones)."""
    steps = len(sigmas)
    if weighting == "none":
        return np.ones(steps)
    t = sigmas * steps
    y = np.exp(-2.0 * ((t - steps / 2) / steps) ** 2)
    shifted = y - y.min()
    return shifted * (steps / shifted.sum())


@dataclass(frozen=True)
class Objective:
    """What the model is trained to predict, and how the loss is weighted.

    Attributes:
        kind: ``flow`` (flow matching: predict ``noise - x_0``), ``epsilon`` (DDPM: predict the
            noise) or ``v`` (DDPM: predict v).
        beta_schedule: DDPM betas (``linear`` or ``cosine``); unused by ``flow``.
        snr_gamma: Min-SNR-gamma weighting for DDPM (Hang et al. 2023; 5 in the paper); 0: none.
        flow_shift: MaxDiffusion's timestep shift (1: none; Wan trains with 5, SD3 uses 3).
        flow_weighting: ``gaussian`` or ``none`` (:func:`flow_weights`).

    Raises (on construction):
        TitanError: an unknown kind, schedule or weighting, or a negative gamma or shift <= 0.
    """

    kind: str = "flow"
    beta_schedule: str = "linear"
    snr_gamma: float = 0.0
    flow_shift: float = 1.0
    flow_weighting: str = "gaussian"

    def __post_init__(self) -> None:
        for flag, value, allowed in (
            ("--objective", self.kind, OBJECTIVES),
            ("--beta-schedule", self.beta_schedule, BETA_SCHEDULES),
            ("--flow-weighting", self.flow_weighting, FLOW_WEIGHTINGS),
        ):
            if value not in allowed:
                raise TitanError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")
        if self.snr_gamma < 0:
            raise TitanError(f"--snr-gamma must be >= 0, got {self.snr_gamma}")
        if not self.flow_shift > 0:
            raise TitanError(f"--flow-shift must be > 0, got {self.flow_shift}")

    def model_timesteps(self, indices: np.ndarray) -> np.ndarray:
        """(B,) float32 timestep the model is conditioned on for training-step ``indices``:
        the DDPM step t itself, or 1000 x sigma for flow matching."""
        if self.kind == "flow":
            return (flow_sigmas(self.flow_shift)[indices] * TRAIN_TIMESTEPS).astype(np.float32)
        return indices.astype(np.float32)

    def example(
        self, x0: np.ndarray, noise: np.ndarray, indices: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(noisy input, target, weight) of a batch.

        Args:
            x0: (B, ...) clean images in [-1, 1]; noise: (B, ...) standard normal;
                indices: (B,) int training-timestep indices in [0, 1000).

        Returns:
            noisy and target (B, ...) float32, weight (B,) float32.
        """
        if self.kind == "flow":
            return flow_example(x0, noise, indices, self.flow_shift, self.flow_weighting)
        return ddpm_example(
            x0, noise, indices, alphas_cumprod(self.beta_schedule), self.kind, self.snr_gamma
        )


def _rows(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    """(B,) values shaped to broadcast over the rows of ``like`` (B, ...)."""
    return values.reshape(-1, *([1] * (like.ndim - 1)))


def ddpm_example(
    x0: np.ndarray,
    noise: np.ndarray,
    indices: np.ndarray,
    abar: np.ndarray,
    prediction: str,
    snr_gamma: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DDPM's (noisy, target, weight) at steps ``indices`` (see the module docstring)."""
    a = abar[indices]
    noisy = _rows(np.sqrt(a), x0) * x0 + _rows(np.sqrt(1 - a), x0) * noise
    if prediction == "epsilon":
        target = noise
    else:
        target = _rows(np.sqrt(a), x0) * noise - _rows(np.sqrt(1 - a), x0) * x0
    weight = np.ones_like(a)
    if snr_gamma > 0:
        snr = a / (1 - a)
        clipped = np.minimum(snr, snr_gamma)
        weight = clipped / snr if prediction == "epsilon" else clipped / (snr + 1)
    return noisy.astype(np.float32), target.astype(np.float32), weight.astype(np.float32)


def flow_example(
    x0: np.ndarray, noise: np.ndarray, indices: np.ndarray, shift: float, weighting: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flow matching's (noisy, target, weight) at training-timestep ``indices``:
    ``(1 - sigma) x_0 + sigma noise``, ``noise - x_0``, MaxDiffusion's weight."""
    sigmas = flow_sigmas(shift)
    sigma = _rows(sigmas[indices], x0)
    noisy = (1 - sigma) * x0 + sigma * noise
    weight = flow_weights(sigmas, weighting)[indices]
    return noisy.astype(np.float32), (noise - x0).astype(np.float32), weight.astype(np.float32)
