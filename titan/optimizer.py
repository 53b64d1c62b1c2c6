"""The optimizer: AdamW with linear warmup, cosine decay and global-norm gradient clipping.

AdamW: Loshchilov & Hutter 2019 (decoupled weight decay), betas (0.9, 0.95) and eps 1e-8 as in
Llama 2 (Touvron et al. 2023, Sec. 2.2). Weight decay is not applied to RMSNorm scales. The learning
rate rises linearly from 0 to ``lr`` over ``warmup_steps`` and follows a cosine down to
``lr * min_lr_ratio`` at ``decay_steps`` (``steps`` when 0) and stays there (Loshchilov & Hutter
2017); a resumed run keeps the length it started with (:func:`titan.config_files.resumed_config`),
so extending it continues at the minimum (MaxText's ``learning_rate_schedule_steps`` is the same
separate length). Step N trains at the schedule's value after N - 1 updates, so step 1 trains at
0 (as optax's ``warmup_cosine_decay_schedule`` and MaxText's warmup start) and a value reached
"after step N" is the rate of step N + 1. Clipping by global norm: Pascanu et al. 2013.
Optimizer moments are kept in the parameters' dtype (float32 master weights).

A step whose loss or global gradient norm is not finite leaves the parameters and optimizer
state as they were (:func:`finite_step`, :func:`keep_if_not_finite`, selected on the device),
as ``optax.apply_if_finite`` does: AdamW's own step count (its bias correction and schedule)
does not advance for a skipped step. After k skipped steps, step N therefore trains at the
schedule's value after N - 1 - k updates, the rate that :func:`applied_learning_rate` reports.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from titan.config import OptimizerOptions

ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.95, 1e-8


def schedule_text(opt: OptimizerOptions) -> str:
    """The learning rate's course in words: ``learning rate: cosine to 3.00e-04 after step 20,
    then constant`` (``steps`` past the horizon), or, when the warmup takes the whole horizon,
    ``linear warmup to 3.00e-03 after step 20, the last step: no decay``, and only when steps
    go past the horizon (``--decay-steps``) the drop that follows, ``then 3.00e-04 after step
    21`` (a value reached after step N is the rate of step N + 1: module docstring)."""
    horizon, warmup = opt.schedule_steps()
    end = opt.lr * opt.min_lr_ratio
    if warmup == horizon:
        rise = f"learning rate: linear warmup to {opt.lr:.2e} after step {horizon}"
        if opt.steps <= horizon:
            return f"{rise}, the last step: no decay"
        return f"{rise}, then {end:.2e} after step {horizon + 1}: no decay"
    after = ", then constant" if opt.steps > horizon else ""
    return f"learning rate: cosine to {end:.2e} after step {horizon}{after}"


def warmup_note(opt: OptimizerOptions) -> str | None:
    """A note when ``--warmup-steps`` is not below the horizon
    (:meth:`OptimizerOptions.schedule_steps`): the learning rate then rises through the whole
    schedule and never decays. None otherwise."""
    horizon, _ = opt.schedule_steps()
    if opt.warmup_steps < horizon:
        return None
    return (
        f"--warmup-steps {opt.warmup_steps} is not below the schedule's {horizon} steps "
        f"(--decay-steps, else --steps): {schedule_text(opt)}"
    )


def learning_rate_schedule(opt: OptimizerOptions) -> optax.Schedule:
    """Learning rate (per step, unitless multiplier of the update) as a function of the step."""
    horizon, warmup = opt.schedule_steps()
    return optax.warmup_cosine_decay_schedule(  # constant at end_value after decay_steps
        init_value=0.0,
        peak_value=opt.lr,
        warmup_steps=warmup,
        decay_steps=max(horizon, warmup + 1),
        end_value=opt.lr * opt.min_lr_ratio,
    )


def applied_learning_rate(schedule: optax.Schedule, opt_state: Any) -> jax.Array:
    """The learning rate (float32 scalar) that the next update of ``opt_state`` applies: the
    schedule at the count of the state's ``ScaleByScheduleState``, the updates applied so far
    (a skipped step does not advance it: module docstring).

    Raises:
        KeyError: ``opt_state`` holds no ``ScaleByScheduleState`` (not :func:`build_optimizer`'s
            state), or several.
    """
    state = optax.tree_utils.tree_get(opt_state, "ScaleByScheduleState")
    if state is None:
        raise KeyError("the optimizer state holds no ScaleByScheduleState")
    return jnp.asarray(schedule(state.count), jnp.float32)


def _decay_mask(params: Any) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "norm" not in str(getattr(path[-1], "key", "")), params
    )


def clip_by_global_norm(grads: Any, global_norm: jax.Array, max_norm: float) -> Any:
    """Scale ``grads`` by min(1, max_norm / global_norm); ``max_norm <= 0`` disables clipping.

    Kept outside the optax chain so that pipeline stages, which each hold part of the gradients,
    apply the same scale from the norm over all stages.
    """
    if max_norm <= 0:
        return grads
    scale = jnp.minimum(1.0, max_norm / jnp.maximum(global_norm, 1e-30))
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), grads)


def build_optimizer(
    opt: OptimizerOptions,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW of ``--lr``, ``--weight-decay`` and the schedule of ``opt`` (clipping is applied
    before it with :func:`clip_by_global_norm`); returns (transformation, schedule)."""
    schedule = learning_rate_schedule(opt)
    adamw = optax.adamw(
        schedule,
        b1=ADAM_B1,
        b2=ADAM_B2,
        eps=ADAM_EPS,
        weight_decay=opt.weight_decay,
        mask=_decay_mask,
    )
    return adamw, schedule


def finite_step(loss: jax.Array, global_norm: jax.Array) -> jax.Array:
    """Scalar bool: the step's loss and global gradient norm are both finite. A NaN or infinity
    in any gradient makes the norm NaN or infinite, so this covers every gradient; for a
    pipeline, ``global_norm`` is the norm over all stages and ``loss`` the last stage's."""
    return jnp.isfinite(loss) & jnp.isfinite(global_norm)


def keep_if_not_finite(finite: jax.Array, updated: Any, previous: Any) -> Any:
    """``updated`` when ``finite`` (a scalar bool on the device), else ``previous``, leaf by
    leaf: a select inside the step's program (no host synchronisation), so a non-finite step
    leaves parameters and optimizer state unchanged."""
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, previous)
