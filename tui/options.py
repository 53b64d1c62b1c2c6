"""The launch form's model: ``TrainConfig`` options as text, and back to a validated config.

The option list is never copied here: it comes from :func:`titan.config.option_fields`, and the
check is :func:`titan.config.validate_train_config`, the same code the ``titan train`` CLI runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from titan.config import TrainConfig, option_fields, validate_train_config
from titan.errors import TitanError

# Field types as the dataclass annotations spell them (the CLI parses with the same table).
_PARSERS = {"int": int, "float": float, "str": str}


def default_texts(runs_root: Path) -> dict[str, str]:
    """Every option's default as the form shows it, keyed by field name.

    ``runs_root`` shows the console's own runs root (where the run dir will be created) instead
    of the empty default, so that the form tells where the run goes.
    """
    texts = {f.name: str(f.default) for f in option_fields()}
    texts["runs_root"] = str(runs_root)
    return texts


def parse_option(option: dataclasses.Field, text: str) -> Any:
    """The typed value of one option typed as ``text``.

    Raises:
        TitanError: when ``text`` is not a value of the option's type; the message has argparse's
            wording, as ``titan train`` prints it for the same input.
    """
    type_name = str(option.type)
    value = text.strip() if type_name != "str" else text
    try:
        return _PARSERS[type_name](value)
    except ValueError:
        raise TitanError(
            f"argument {option.metadata['flag']}: invalid {type_name} value: {value!r}"
        ) from None


def config_from_texts(texts: Mapping[str, str]) -> TrainConfig:
    """Parse the form's texts (keyed by field name) into a validated :class:`TrainConfig`.

    Raises:
        TitanError: one line naming the first bad option, from :func:`parse_option` or from
            :func:`titan.config.validate_train_config`.
    """
    values = {f.name: parse_option(f, texts[f.name]) for f in option_fields()}
    config = TrainConfig(**values)
    validate_train_config(config)
    return config
