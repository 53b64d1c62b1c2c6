"""What a task gives a run (``--task lm``: :class:`titan.trainer.text_data.TextTask`;
``--task diffusion``: :class:`titan.trainer.image_task.ImageTask`): first the model's shape once
its data is read (a text run's vocabulary is its tokenizer's, a DiT's label table holds its
classes), then, with the trainer built, the batches and the rest of :class:`RunData`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from titan.data.images import ImageBatches
from titan.data.mixture import Batches
from titan.layouts.contract import Trainer
from titan.shapes import ModelConfig
from titan.stopping import StopFlag
from titan.trainer.evaluation import Evaluation
from titan.trainer.progress import TrainProgress


@dataclass(frozen=True)
class RunData:
    """What a task's data gives the run: the batches, the run files beside ``config.json``,
    the ``tokenizer``/``data`` sections of ``run_start``, tokens per batch row and whether rows
    are images (``step`` events' ``images_per_s``), and the evaluation (``--eval-every``)."""

    batches: Batches | ImageBatches
    files: dict[str, bytes]
    record: dict[str, Any]
    tokens_per_row: int
    images: bool = False
    evaluation: Evaluation | None = None


class Task(Protocol):
    """A task's data, read in two steps around the building of the trainer."""

    def model_shape(
        self, shape: ModelConfig, progress: TrainProgress, stop: StopFlag
    ) -> ModelConfig:
        """The shape to build of the preset or custom ``shape`` (``--model``), once the data
        that completes it is read.

        Raises:
            TitanError: the data cannot be read, or does not fit ``shape``.
        """
        ...

    def run_data(self, trainer: Trainer, progress: TrainProgress, stop: StopFlag) -> RunData:
        """The run's data for ``trainer`` (its rows in this process), after :meth:`model_shape`.

        Raises:
            TitanError: the data holds less than a batch, or cannot be read.
        """
        ...
