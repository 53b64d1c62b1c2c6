"""Samples of a diffusion run: the DiT of a run dir, its parameters restored from its newest
committed checkpoint that can be read (onto one device, re-cut from whatever layout wrote it),
and a grid PNG of class-conditional samples (:mod:`titan.diffusion.samplers`): ``titan sample
RUN_DIR``, and the sample grid of ``titan report``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import jax
import numpy as np

from titan.checkpoint.checkpointer import CHECKPOINT_DIR, Checkpointer
from titan.checkpoint.init_from import saved_model
from titan.checkpoint.resume import RECORD_HEAD_BYTES
from titan.data.images import encode_png
from titan.diffusion.objectives import TRAIN_TIMESTEPS
from titan.diffusion.samplers import grid, sample
from titan.errors import TitanError
from titan.inert import inert
from titan.layouts.builders import one_device_trainer
from titan.models.adapters.base import ImageModelAdapter
from titan.ops import Ops
from titan.out_paths import check_file, check_outside_run
from titan.shapes import ModelConfig
from titan.telemetry.records import EVENTS_FILE, read_first_events
from titan.trainer.image_task import objective_of

# All classes x --per-class samples go through the model as one batch on one device (the grid is
# --per-class columns wide): 64 bounds that batch at 64 images per class.
MAX_PER_CLASS = 64
MAX_SEED = 2**32  # --seed in [0, 2**32): the PRNG seed range, as titan generate's
MAX_GUIDANCE = float(np.finfo(np.float32).max)  # the sampler's arithmetic is float32


def check_options(per_class: int, seed: int, steps: int, guidance: float) -> None:
    """Bounds of ``titan sample``'s options: ``--per-class`` in [1, :data:`MAX_PER_CLASS`],
    ``--seed`` in [0, 2**32), ``--sample-steps`` in [1, T] (T = 1000, the training timesteps
    the sampler steps are spaced over), ``--guidance`` in [0, the float32 maximum] (the
    sampler computes in float32: a larger scale overflows to inf, and the samples to NaN).

    Raises:
        TitanError: the first option out of bounds, named.
    """
    bounds = {
        "--per-class": (per_class, 1, MAX_PER_CLASS),
        "--seed": (seed, 0, MAX_SEED - 1),
        "--sample-steps": (steps, 1, TRAIN_TIMESTEPS),
    }
    for flag, (value, low, high) in bounds.items():
        if not low <= value <= high:
            raise TitanError(f"{flag} must be in [{low}, {high}], got {value}")
    if not 0 <= guidance <= MAX_GUIDANCE:
        raise TitanError(
            f"--guidance must be a number in [0, {MAX_GUIDANCE:.7g}] (the float32 maximum), "
            f"got {guidance}"
        )


def trained_classes(run_dir: Path, model: ModelConfig) -> int:
    """The classes a diffusion run's images had (its first ``run_start``'s ``data.classes``):
    a preset's label table may hold more (``dit-s-2``: ImageNet's 1000) than the data used,
    and rows never trained draw noise. The table's size less the null label when the record
    does not say (or cannot be read).
    """
    table = model.vocab_size - 1
    try:
        events = read_first_events(run_dir / EVENTS_FILE, RECORD_HEAD_BYTES)
    except OSError:
        return table
    for event in events:
        data = event.get("data") if event.get("type") == "run_start" else None
        classes = data.get("classes") if isinstance(data, dict) else None
        if isinstance(classes, int) and not isinstance(classes, bool) and 1 <= classes <= table:
            return classes
    return table


def sample_grid(
    run_dir: Path,
    *,
    checkpoint_step: int | None = None,
    per_class: int = 4,
    seed: int = 0,
    steps: int = 50,
    guidance: float = 1.0,
) -> tuple[np.ndarray, int]:
    """(grid image (H', W', C) uint8, the checkpoint's step): ``per_class`` samples of every
    class, one class per row, of checkpoint ``checkpoint_step`` (None: the newest that can be
    read; ``steps`` are the sampler's).

    Raises:
        TitanError: an option out of :func:`check_options`' bounds, ``run_dir`` is not a
            diffusion run or has no committed checkpoint (or none of ``checkpoint_step``; then
            nothing is created in it).
    """
    check_options(per_class, seed, steps, guidance)
    cfg, model = saved_model(run_dir, "RUN_DIR")
    if cfg.model.task != "diffusion":
        raise TitanError(f"{run_dir}: a --task {cfg.model.task} run has no images to sample")
    if not (run_dir / CHECKPOINT_DIR).is_dir():  # Checkpointer would create it
        raise TitanError(f"{run_dir}: no committed checkpoint to sample from")
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    trainer = one_device_trainer(
        model, cfg.model, cfg.compute, cfg.optimizer, cfg.data.seq_len, ops
    )
    checkpointer = Checkpointer(run_dir, 1, 0, False)
    try:
        checkpointer.check_committed(checkpoint_step)
        [params], step, skipped = checkpointer.read_params(checkpoint_step, trainer)
    finally:
        checkpointer.close()
    for unreadable in skipped:
        line = f"titan sample: {unreadable.error}; using checkpoint {step}"
        print(inert(line), file=sys.stderr)
    # A diffusion run's family: DiT (one_device_trainer builds no other for --task diffusion).
    adapter, dtype = cast(ImageModelAdapter, trainer.adapter), trainer.compute_dtype
    classes = trained_classes(run_dir, model)
    labels = np.repeat(np.arange(classes), per_class)
    predict = jax.jit(lambda x, t, y: adapter.predict(params, x, t, y, dtype))
    images = sample(
        predict,
        objective_of(cfg.diffusion),
        adapter.image_shape,
        labels,
        classes,
        seed=seed,
        steps=steps,
        guidance=guidance,
    )
    if not np.isfinite(images).all():
        raise TitanError(
            f"{run_dir}: the samples of checkpoint {step} are not finite (its weights, or "
            f"--guidance {guidance}, overflow): nothing written"
        )
    return grid(images, columns=per_class), step


def _own_sample(run_dir: Path, out: Path) -> Path | None:
    """``out`` when it names one of the run's own sample grids (``RUN_DIR/samples-*.png``, the
    default of a sampling before), which a new one may replace; else None."""
    whole = out.resolve()
    own = whole.parent == run_dir.resolve() and whole.name.startswith("samples-")
    return whole if own else None


def write_sample_grid(
    run_dir: Path, out: Path | None, scale: int = 1, **options: Any
) -> tuple[Path, int]:
    """Write :func:`sample_grid`'s image, each pixel ``scale`` x ``scale`` pixels (nearest
    neighbour), as the PNG ``out`` (None: ``RUN_DIR/samples-<step>.png``); returns (the path,
    the checkpoint's step).

    Raises:
        TitanError: as :func:`sample_grid`, ``scale`` outside 1 to 16, or ``out`` cannot be
            written (checked first).
    """
    if not 1 <= scale <= 16:
        raise TitanError(f"--scale must be in [1, 16], got {scale}")
    if out is not None:
        check_file(out)
        check_outside_run(out, run_dir, _own_sample(run_dir, out))
    image, step = sample_grid(run_dir, **options)
    out = out or run_dir / f"samples-{step}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(encode_png(image.repeat(scale, axis=0).repeat(scale, axis=1)))
    return out, step
