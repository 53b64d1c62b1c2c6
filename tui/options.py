"""The launch form's model: ``TrainConfig`` options as text, and back to a validated config.

The option list is never copied here: it comes from :func:`titan.config.option_fields` (section
by section, keyed by flat option name), and the texts are parsed and checked by constructing the
:class:`titan.config.TrainConfig`, the same code the ``titan train`` CLI runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from titan.checkpoint.resume import resume_options
from titan.config import Option, TrainConfig, option_fields
from titan.errors import TitanError

# Form presets: options set over the defaults (by field name, as the form's texts).
FORM_PRESETS: dict[str, dict[str, str]] = {
    "defaults": {},
    "cpu smoke test": {
        "steps": "20",
        "batch_size": "4",
        "seq_len": "64",
        "vocab_size": "1024",
        "warmup_steps": "5",
        "checkpoint_every": "10",
        "dp": "1",
    },
    "mpmd 2 stages": {"layout": "mpmd", "pp": "2", "microbatches": "4", "dp": "1"},
    "watchdog drill": {
        "steps": "40",
        "debug_stall_at_step": "10",
        "watchdog_floor": "5",
        "watchdog_abort": "true",
    },
}


def default_texts(runs_root: Path) -> dict[str, str]:
    """Every option's default as the form shows it, keyed by field name.

    ``runs_root`` shows the console's own runs root (where the run dir will be created) instead
    of the empty default, so that the form tells where the run goes.
    """
    texts = {o.name: o.text(o.default) for o in option_fields()}
    texts["runs_root"] = str(runs_root)
    return texts


def config_texts(config: TrainConfig) -> dict[str, str]:
    """The form's texts of ``config``, keyed by field name."""
    return {o.name: o.text(v) for o, v in zip(option_fields(), config.flat().values(), strict=True)}


def resume_texts(run_dir: Path) -> dict[str, str]:
    """The form's texts to resume ``run_dir``: its saved options (``titan train --resume``'s).

    Raises:
        TitanError: ``run_dir`` cannot be resumed (no ``config.json`` or tokenizer there).
    """
    return config_texts(resume_options(run_dir, {}))


def preset_texts(runs_root: Path, preset: str) -> dict[str, str]:
    """The form's texts of a :data:`FORM_PRESETS` entry: the defaults, then the preset's."""
    return default_texts(runs_root) | FORM_PRESETS[preset]


def parse_option(option: Option, text: str) -> Any:
    """The typed value of one option typed as ``text``.

    Raises:
        TitanError: when ``text`` is not a value of the option's type; the message has argparse's
            wording for numbers, as ``titan train`` prints it for the same input.
    """
    return option.coerce(text)


def config_from_texts(texts: Mapping[str, str]) -> TrainConfig:
    """Parse the form's texts (keyed by flat option name) into a validated :class:`TrainConfig`.

    Raises:
        TitanError: one line naming the first bad option, from :func:`parse_option` or from the
            config's own checks.
    """
    return TrainConfig.of(**{o.name: parse_option(o, texts[o.name]) for o in option_fields()})


# Copies launched at once: each is a ``titan train`` process of this host, with its own compile
# and its own devices' share; more than this is a typo (10000 for 1), not a sweep.
MAX_COPIES = 64


def copies_of(config: TrainConfig, text: str) -> list[TrainConfig]:
    """``text`` (the form's copies field) runs of ``config`` launched together: seeds
    ``seed``, ``seed + 1``, ...; an explicit run id gets ``-1``, ``-2``, ... (generated ids are
    unique anyway).

    Raises:
        TitanError: ``text`` is not a whole number from 1 to :data:`MAX_COPIES`.
    """
    try:
        copies = int(text)
    except ValueError:
        raise TitanError(
            f"copies must be a whole number from 1 to {MAX_COPIES}, got {text!r}"
        ) from None
    if not 1 <= copies <= MAX_COPIES:
        raise TitanError(f"copies must be from 1 to {MAX_COPIES}, got {copies}")
    if copies == 1:
        return [config]
    seed, run_id = config.run.seed, config.run.run_id
    return [
        config.replace(seed=seed + i, run_id=run_id and f"{run_id}-{i + 1}") for i in range(copies)
    ]
