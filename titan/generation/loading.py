"""A run's model and tokenizer for generation: the whole model's parameters from one of its
checkpoints, on one device, whatever layout wrote it.

The checkpoint's parameters, not its optimizer state, are restored onto a one-device SPMD
trainer of the run's own config (:meth:`titan.checkpoint.checkpointer.Checkpointer.restore_params`):
a checkpoint of another layout, such as an MPMD run's per-stage (and virtual-stage) chunks, is
joined along the layer axis into the one chunk of the whole model
(:func:`titan.parallel.chunks.join_layers`), as a resume onto SPMD does. Without a step, the
newest checkpoint that can be read is taken, as a resume does; the newer ones that cannot are
listed (:attr:`LoadedModel.unreadable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from titan.checkpoint.checkpointer import CHECKPOINT_DIR, Checkpointer, Unrestorable
from titan.checkpoint.init_from import resolve_source, saved_model
from titan.checkpoint.resume import TOKENIZER_FILE
from titan.data.tokenizer import Tokenizer, load_tokenizer
from titan.errors import TitanError
from titan.layouts.builders import one_device_trainer
from titan.models.adapters.base import cast_tree
from titan.models.adapters.maxtext_checkpoints import refuse_maxtext_source
from titan.ops import Ops
from titan.shapes import ModelConfig


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint's model, ready to decode.

    Attributes:
        model: the model shape (vocabulary resolved).
        params: the whole model's parameters in ``dtype`` on one device (the names of
            :class:`titan.models.llama.LlamaStage`).
        dtype: the run's compute dtype on this backend.
        tokenizer: the run's tokenizer.
        run_dir: the run dir; step: the checkpoint's step.
        seq_len: the run's ``--seq-len``, the positions its model was trained to attend to.
        unreadable: the committed checkpoints newer than ``step`` that could not be read
            (corrupt), newest first; empty when a step was asked for.
    """

    model: ModelConfig
    params: Any
    dtype: jnp.dtype
    tokenizer: Tokenizer
    run_dir: Path
    step: int
    seq_len: int
    unreadable: tuple[Unrestorable, ...] = ()


def load_model(source: str, step: int | None = None) -> LoadedModel:
    """The model of ``source`` (a run dir, or one of its checkpoints ``<run dir>/checkpoints/
    <step>``) at ``step`` (default: the checkpoint named, else the newest committed one that can
    be read). Only the parameters are read, not the optimizer state.

    Raises:
        TitanError: ``source`` is no run or checkpoint, a diffusion run's (no text), the run
            has no committed checkpoint (or not ``step``; names those it has), or the checkpoint
            asked for cannot be read (names it and its folder), or without a step none can
            (names the checkpoints' folder).
    """
    run_dir, asked = resolve_source(source, step)
    cfg, model = saved_model(run_dir, "RUN_DIR")
    refuse_maxtext_source(cfg.model.model_source, run_dir, "titan generate")
    if model.family == "dit":
        raise TitanError(f"{run_dir}: a diffusion run (no text): use titan sample")
    if not (run_dir / TOKENIZER_FILE).is_file():
        raise TitanError(f"{run_dir}: no {TOKENIZER_FILE} there")
    if not (run_dir / CHECKPOINT_DIR).is_dir():
        raise TitanError(f"{run_dir}: no checkpoints (no {CHECKPOINT_DIR}/ folder)")
    tokenizer = load_tokenizer(run_dir / TOKENIZER_FILE)
    checkpointer = Checkpointer(run_dir)
    try:
        checkpointer.check_committed(asked)
        ops = Ops(jax.default_backend())
        trainer = one_device_trainer(
            model, cfg.model, cfg.compute, cfg.optimizer, cfg.data.seq_len, ops
        )
        chunks, step, skipped = checkpointer.read_params(asked, trainer)
    finally:
        checkpointer.close()
    dtype = trainer.compute_dtype
    params = cast_tree(chunks[0], dtype)
    return LoadedModel(
        model, params, dtype, tokenizer, run_dir, step, cfg.data.seq_len, tuple(skipped)
    )
