"""The data of a ``--task diffusion`` run (:class:`ImageTask`): its images, the DiT shape they
ask for and the training batches (:mod:`titan.data.images`, :mod:`titan.diffusion.objectives`)."""

from __future__ import annotations

import dataclasses

from titan.config import DiffusionOptions
from titan.data.images import ImageBatches, open_images
from titan.diffusion.objectives import Objective
from titan.errors import TitanError
from titan.layouts.contract import Trainer
from titan.shapes import ModelConfig
from titan.stopping import StopFlag
from titan.trainer.processes import batch_rows
from titan.trainer.progress import TrainProgress
from titan.trainer.task import RunData

PIXEL_CHANNELS = (1, 3)  # grayscale, RGB
RGB = 3


def objective_of(diffusion: DiffusionOptions) -> Objective:
    """The training objective of the diffusion options."""
    d = diffusion
    return Objective(d.objective, d.beta_schedule, d.snr_gamma, d.flow_shift, d.flow_weighting)


def image_channels(shape: ModelConfig) -> int:
    """The channels of the pixels a DiT preset trains on: its own (1: grayscale, 3: RGB), or
    RGB for a preset shaped for the paper's 4-channel latents (``dit-s-2`` to ``dit-xl-2``;
    Titan's DiT models pixels, it has no autoencoder)."""
    return shape.channels if shape.channels in PIXEL_CHANNELS else RGB


def image_model_config(shape: ModelConfig, image_size: int, classes: int) -> ModelConfig:
    """The DiT shape of the run: the preset ``shape``, at ``image_size`` (``--image-size``) when
    given, over :func:`image_channels`, with a label table of ``classes`` + 1 rows (the null
    label last) when the preset leaves it open (``dit-tiny``).

    Raises:
        TitanError: the data has more classes than the preset's label table holds.
    """
    size = image_size or shape.image_size
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
    return dataclasses.replace(
        shape,
        vocab_size=shape.vocab_size or classes + 1,
        image_size=size,
        channels=image_channels(shape),
    )


def image_batches(
    shape: ModelConfig, diffusion: DiffusionOptions, batch_size: int, seed: int
) -> tuple[ModelConfig, ImageBatches]:
    """(model shape, batches) of a diffusion run of the preset ``shape``: ``batch_size`` images a
    step, shuffled from ``seed``.

    Raises:
        TitanError: bad ``--images``, ``--image-size`` or a batch larger than the data.
    """
    d = diffusion
    data = open_images(d.images, d.image_size or shape.image_size, image_channels(shape))
    model = image_model_config(shape, d.image_size, data.classes)
    null_label = model.vocab_size - 1  # the label table's last row
    batches = ImageBatches(data, objective_of(d), batch_size, seed, d.label_dropout, null_label)
    return model, batches


class ImageTask:
    """The data of a ``--task diffusion`` run: the images of ``diffusion``'s ``--images``,
    ``batch_size`` a step, shuffled from ``seed``."""

    def __init__(self, diffusion: DiffusionOptions, batch_size: int, seed: int) -> None:
        self.diffusion = diffusion
        self.batch_size = batch_size
        self.seed = seed
        self.batches: ImageBatches | None = None  # model_shape reads them

    def model_shape(
        self, shape: ModelConfig, progress: TrainProgress, stop: StopFlag
    ) -> ModelConfig:
        """The DiT shape the images ask for (:func:`image_batches`), the images read first."""
        with stop.during("scan"):
            model, self.batches = image_batches(shape, self.diffusion, self.batch_size, self.seed)
        return model

    def run_data(self, trainer: Trainer, progress: TrainProgress, stop: StopFlag) -> RunData:
        """The batches :meth:`model_shape` made, and the images' record; a row's tokens are the
        DiT's patches per image."""
        assert self.batches is not None  # model_shape came first
        self.batches.rows = batch_rows(trainer, self.batch_size)  # this process's rows
        record = {"tokenizer": None, "data": self.batches.data.record()}
        return RunData(self.batches, {}, record, trainer.adapter.config.patches, True)
