"""The training loop's guard on the host: non-finite steps and loss spikes, as read one step late.

The device decides: a step whose loss or global gradient norm is not finite leaves the state
unchanged (:func:`titan.optimizer.keep_if_not_finite`) and returns ``finite`` False in its
metrics. When the loop reads them (one step late, with no extra synchronisation),
:class:`NonFiniteGuard` applies ``--nonfinite``:

- ``skip`` (the default): the step is recorded (``step`` event with ``skipped`` and
  ``nonfinite``) and the run goes on; ``--nonfinite-patience`` such steps in a row end it as
  ``abort`` does. Skipping is the default because an isolated bad batch (a corrupt document, one
  overflow) then costs one step of an unattended run, while a divergence, which repeats every
  step, still ends the run within a few steps (PaLM, Chowdhery et al. 2022, Sec. 5.1, trained on
  through loss spikes by skipping the batches around them).
- ``abort``: :class:`NonFiniteAbort` at the first one; the trainer records ``run_end`` ``failed``
  (reason ``nonfinite``) and exits with :data:`titan.exit_codes.EXIT_NONFINITE`, writing no
  checkpoint: the last committed one, from before the step, stays the latest.

:class:`LossSpikeDetector` flags finite losses far above the recent ones (``loss_spike``
events); :func:`poison_batch` is the testing aid behind ``--debug-nonfinite-at-step``.

Before each save, :class:`titan.checkpoint.finite_check.FiniteCheck` checks that the weights are
finite.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from titan.layouts.contract import Batch
from titan.telemetry.events import LossSpike

GUARDED_METRICS = ("loss", "grad_norm")  # the values the device checks (finite_step)


class NonFiniteAbort(Exception):
    """The run must end: non-finite steps under ``--nonfinite abort``, too many in a row under
    ``skip``, or non-finite weights about to be saved.

    Attributes:
        step: the step the run ends after (the last step dispatched or read).
    """

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step = step


def nonfinite_fields(values: dict[str, float]) -> dict[str, str]:
    """The guarded metrics of ``values`` that are not finite, as ``nan``, ``inf`` or ``-inf``."""
    return {
        name: str(values[name]).lower()
        for name in GUARDED_METRICS
        if name in values and not math.isfinite(values[name])
    }


@dataclass
class NonFiniteGuard:
    """What the loop does with a step the device found non-finite (``--nonfinite``).

    Attributes:
        action: ``skip`` or ``abort``.
        patience: under ``skip``, non-finite steps in a row that end the run
            (``--nonfinite-patience``).
        in_a_row: non-finite steps in a row so far.
    """

    action: str
    patience: int
    in_a_row: int = 0

    def check(self, step: int, finite: bool, nonfinite: dict[str, str]) -> None:
        """Account for step ``step``'s ``finite`` flag (``nonfinite``: which values were not).

        Raises:
            NonFiniteAbort: under ``abort``, or the ``patience``-th non-finite step in a row.
        """
        self.in_a_row = 0 if finite else self.in_a_row + 1
        if finite:
            return
        what = ", ".join(f"{name} {value}" for name, value in nonfinite.items()) or "non-finite"
        if self.action == "abort":
            raise NonFiniteAbort(step, f"step {step}: {what} (--nonfinite abort)")
        if self.in_a_row >= self.patience:
            raise NonFiniteAbort(
                step,
                f"step {step}: {what}, {self.in_a_row} non-finite steps in a row "
                f"(--nonfinite-patience {self.patience})",
            )


@dataclass
class LossSpikeDetector:
    """Flags a loss spike: ``loss > mean + sigma x std`` of the finite losses of the last
    ``window`` steps before it, std the population standard deviation: the z-score outlier
    test against a rolling window. Under Gaussian step-to-step noise a 6-sigma excess (the
    default) has a one-sided probability of about 1e-9 per step, so a flagged step is no noise;
    a falling loss stays below its window's mean and is never flagged. Nothing is flagged before
    the window is full, and a spike's own loss joins the window, so a lasting jump is flagged on
    its first steps and then becomes the new level.

    Attributes:
        window: losses in the window (``--loss-spike-window``).
        sigma: standard deviations above the mean (``--loss-spike-sigma``).
    """

    window: int
    sigma: float
    _losses: deque = field(init=False)

    def __post_init__(self) -> None:
        self._losses = deque(maxlen=self.window)

    def observe(self, step: int, loss: float) -> LossSpike | None:
        """Step ``step``'s loss: the spike it is, or None. Non-finite losses are ignored (the
        non-finite guard records them)."""
        if not math.isfinite(loss):
            return None
        spike = None
        if len(self._losses) == self.window:
            mean = statistics.fmean(self._losses)
            std = statistics.pstdev(self._losses, mean)
            threshold = mean + self.sigma * std
            if loss > threshold:
                spike = LossSpike(
                    step=step,
                    loss=loss,
                    mean=mean,
                    std=std,
                    threshold=threshold,
                    window=self.window,
                )
        self._losses.append(loss)
        return spike


def poison_batch(batch: Batch) -> Batch:
    """``--debug-nonfinite-at-step``: ``batch`` made to give a NaN loss and NaN gradients, as
    a corrupt batch does. A text batch gets every token id beyond any vocabulary (the int32
    maximum), for which the embedding lookup (``jnp.take``, fill mode) returns NaN; an image
    batch (:meth:`titan.data.images.ImageBatches.batch_of`) a ``noisy`` input of NaN."""
    if "tokens" in batch:
        tokens = batch["tokens"]
        return {**batch, "tokens": np.full_like(tokens, np.iinfo(tokens.dtype).max)}
    return {**batch, "noisy": np.full_like(batch["noisy"], np.nan)}
