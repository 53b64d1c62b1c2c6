"""The data of a ``--task diffusion`` run: its images, the DiT shape they ask for and the
training batches (:mod:`titan.data.images`, :mod:`titan.diffusion.objectives`)."""

from __future__ import annotations

import dataclasses

from titan.config import TrainConfig
from titan.data.images import ImageBatches, open_images
from titan.diffusion.objectives import Objective
from titan.errors import TitanError
from titan.shapes import ModelConfig


def objective_of(cfg: TrainConfig) -> Objective:
    """The training objective of the diffusion options."""
    d = cfg.diffusion
    return Objective(d.objective, d.beta_schedule, d.snr_gamma, d.flow_shift, d.flow_weighting)


def image_model_config(cfg: TrainConfig, classes: int) -> ModelConfig:
    """The DiT shape of the run: the preset's, at ``--image-size`` when given, with a label table
    of ``classes`` + 1 rows (the null label last) when the preset leaves it open (``dit-tiny``).

    Raises:
        TitanError: the data has more classes than the preset's label table holds.
    """
    shape = cfg.model.shape
    size = cfg.diffusion.image_size or shape.image_size
    if size % shape.patch_size:
        raise TitanError(
            f"--image-size {size} is not a multiple of the patch size {shape.patch_size} of "
            f"--preset {shape.name}"
        )
    if shape.vocab_size and classes + 1 > shape.vocab_size:
        raise TitanError(
            f"--images has {classes} classes but --preset {shape.name} holds "
            f"{shape.vocab_size - 1} labels"
        )
    return dataclasses.replace(shape, vocab_size=shape.vocab_size or classes + 1, image_size=size)


def image_batches(cfg: TrainConfig) -> tuple[ModelConfig, ImageBatches]:
    """(model shape, batches) of a diffusion run.

    Raises:
        TitanError: bad ``--images``, ``--image-size`` or a batch larger than the data.
    """
    shape = cfg.model.shape
    data = open_images(
        cfg.diffusion.images, cfg.diffusion.image_size or shape.image_size, shape.channels
    )
    model = image_model_config(cfg, data.classes)
    d = cfg.diffusion
    null_label = model.vocab_size - 1  # the label table's last row
    batches = ImageBatches(
        data, objective_of(cfg), cfg.data.batch_size, cfg.run.seed, d.label_dropout, null_label
    )
    return model, batches
