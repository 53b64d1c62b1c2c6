"""``titan train --init-from CHECKPOINT``: the options a run takes from the checkpoint it starts
from (its model shape and tokenizer), read without JAX; the weights themselves are read by
:func:`titan.checkpoint.checkpointer.initial_state`.

CHECKPOINT is a run dir or a ``titan import hf`` output (its newest committed checkpoint), or
one step of it, ``<dir>/checkpoints/<step>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from titan.checkpoint.resume import TOKENIZER_FILE
from titan.config import TASK_FAMILIES, TrainConfig
from titan.config_files import read_run_config
from titan.errors import TitanError
from titan.out_paths import CHECKPOINT_DIR
from titan.shapes import DEFAULT_VOCAB_SIZE, SHAPE_FIELDS, ModelConfig, model_text
from titan.telemetry.records import CONFIG_FILE

# What each --model-source builds, as errors name it.
SOURCE_MODELS = {"titan": "titan's llama", "maxtext": "a maxtext model"}


def checkpoint_location(text: str) -> tuple[Path, int | None]:
    """(the dir holding ``checkpoints/``, the step or None for the newest) of a CHECKPOINT."""
    path = Path(text)
    if path.parent.name == CHECKPOINT_DIR and path.name.isdigit() and path.is_dir():
        return path.parent.parent, int(path.name)
    return path, None


def resolve_source(source: str, step: int | None) -> tuple[Path, int | None]:
    """(run dir, step or None for the newest) of ``RUN_DIR`` or ``RUN_DIR/checkpoints/STEP``.

    Raises:
        TitanError: ``source`` is neither, or ``step`` contradicts a checkpoint path.
    """
    path = Path(source)
    if (path / CONFIG_FILE).is_file():
        return path, step
    run_dir = path.parent.parent
    if path.parent.name == CHECKPOINT_DIR and path.name.isdigit() and path.is_dir():
        if (run_dir / CONFIG_FILE).is_file():
            if step is not None and step != int(path.name):
                raise TitanError(f"--step {step} contradicts the checkpoint {source}")
            return run_dir, int(path.name)
    raise TitanError(
        f"{source}: neither a run dir (with {CONFIG_FILE}) nor a checkpoint "
        f"<run dir>/{CHECKPOINT_DIR}/<step>"
    )


def saved_model(run_dir: Path, flag: str) -> tuple[TrainConfig, ModelConfig]:
    """The options and the model shape recorded in a run dir's (or an import's) ``config.json``.

    Raises:
        TitanError: no ``config.json`` there, or one :func:`titan.config_files.read_run_config`
            refuses, or a ``model`` that is no shape.
    """
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise TitanError(f"{flag} {run_dir}: no {CONFIG_FILE} there (not a run dir)")
    cfg, model = read_run_config(path, flag)
    try:
        return cfg, ModelConfig(**model)
    except (TypeError, ValueError, TitanError) as err:
        raise TitanError(f"{flag} {path}: field 'model': {err}") from None


def init_from_options(explicit: dict[str, Any]) -> dict[str, Any]:
    """``explicit`` (flat option names) with the model shape of ``init_from``'s checkpoint and,
    unless ``tokenizer`` is given, its tokenizer; unchanged without ``init_from``.

    Raises:
        TitanError: the checkpoint's dir is not a run dir, its model was built by another
            ``--model-source`` than this run's, its model is not of the family ``task``
            trains, ``preset`` (``--model``) names another shape than the checkpoint's, or
            ``vocab_size`` (``--vocab-size``) another vocabulary (:func:`check_vocab_size`).
    """
    text = explicit.get("init_from")
    if not text:
        return explicit
    run_dir, _ = checkpoint_location(str(text))
    saved, model = saved_model(run_dir, "--init-from")
    check_model_source(text, saved.model.model_source, explicit.get("model_source", "titan"))
    task = explicit.get("task", "lm")
    if model.family != TASK_FAMILIES.get(task, model.family):
        raise TitanError(
            f"--init-from {text} holds a {model.family} model; --task {task} trains "
            f"{TASK_FAMILIES[task]} models"
        )
    if "preset" in explicit:
        asked = TrainConfig.of(preset=explicit["preset"], task=task).model.shape
        fields = [f for f in SHAPE_FIELDS if f != "vocab_size" or asked.vocab_size]  # 0: data's
        if any(getattr(asked, f) != getattr(model, f) for f in fields):
            raise TitanError(
                f"--model {model_text(asked)} conflicts with the model of --init-from {text} "
                f"({model_text(model)}); leave --model out"
            )
    if model.family == "dit":  # no text: no vocabulary, no tokenizer
        return {**explicit, "preset": model}
    check_vocab_size(text, explicit.get("vocab_size"), model.vocab_size)
    tokenizer = explicit.get("tokenizer") or str(run_dir / TOKENIZER_FILE)
    return {**explicit, "preset": model, "tokenizer": tokenizer}


def check_model_source(text: str, saved: str, asked: str) -> None:
    """Raises TitanError when the checkpoint ``text`` holds a model of another
    ``--model-source`` (``saved``, as its ``config.json`` records it) than the run builds
    (``asked``): their parameter trees differ, so no restore could match them."""
    if saved != asked:
        raise TitanError(
            f"--init-from {text} holds {SOURCE_MODELS[saved]} (--model-source {saved}); "
            f"this run builds {SOURCE_MODELS[asked]} (--model-source {asked})"
        )


def check_vocab_size(text: str, asked: Any, saved: int) -> None:
    """Refuse a ``--vocab-size`` (``asked``; None when not given) other than the vocabulary of
    the checkpoint ``text`` (``saved``, its embedding's rows): a run from it keeps its model (and
    its tokenizer unless ``--tokenizer`` is given), so the option would be ignored. The default
    (:data:`titan.shapes.DEFAULT_VOCAB_SIZE`) passes: a config file that ``--print-config``
    wrote holds it, given or not.

    Raises:
        TitanError: names both vocabularies.
    """
    if asked is not None and int(asked) not in (saved, DEFAULT_VOCAB_SIZE):
        raise TitanError(
            f"--vocab-size {asked} conflicts with --init-from {text}, whose model has a "
            f"vocabulary of {saved} (the run keeps it); leave --vocab-size out"
        )
