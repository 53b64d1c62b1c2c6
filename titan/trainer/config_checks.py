"""The checks of ``titan train --print-config``: what a run would refuse that needs neither a
device nor a file."""

from __future__ import annotations

from titan.config import DataOptions, ModelOptions, ParallelOptions, trained_vocab_size
from titan.data.mixture import mixture_parts
from titan.parallel.chunks import plan_chunks


def check_without_devices(
    model: ModelOptions, data: DataOptions, par: ParallelOptions, init_from: str, resumed: bool
) -> None:
    """The checks of a run that need neither a device nor a file, for ``--print-config``: the
    ``--data`` mixture's parts and weights, a custom shape's vocabulary when a tokenizer is
    trained (neither ``resumed`` nor ``--init-from``: ``init_from``), and the layer split of a
    pipeline of a Titan model (the run makes them again).

    Raises:
        TitanError: as :func:`titan.data.mixture.mixture_parts`,
            :func:`titan.config.trained_vocab_size` or :func:`titan.parallel.chunks.plan_chunks`.
    """
    if model.task == "lm":
        mixture_parts(data.corpus)
        if not (resumed or data.tokenizer or init_from):
            trained_vocab_size(model.shape, data.vocab_size)
    if par.layout == "mpmd" and model.model_source == "titan":
        plan_chunks(model.shape.n_layers, par.pp, par.virtual_stages, par.stage_layers, model.label)
