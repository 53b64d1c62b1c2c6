"""Config files: the ``train`` part of a run's ``config.json`` and ``--config`` TOML files, both
in the sections of :class:`titan.config.TrainConfig`, and the config of a resumed run.

Saved configs are sectioned (``{"data": {"batch_size": 8}, ...}``); configs of runs recorded
before sections existed are flat by option name and still load. TOML files hold one table per
section; :func:`config_to_toml` writes what :func:`read_config_file` reads back to the same
config.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from titan.config import (
    SECTIONS,
    Option,
    TrainConfig,
    flag_of,
    option_fields,
    options_by_name,
    resumable_options,
)
from titan.errors import TitanError
from titan.reading import json_field, read_json, read_toml


def config_to_data(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """The sectioned plain-data form of ``cfg`` (``config.json``'s ``train``, TOML tables)."""
    data: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for option in option_fields():
        value = getattr(getattr(cfg, option.section), option.field.name)
        data[option.section][option.field.name] = option.codec.dump(value)
    return data


def _is_sectioned(values: Mapping[str, Any]) -> bool:
    return all(key in SECTIONS and isinstance(v, Mapping) for key, v in values.items())


def config_from_dict(values: Mapping[str, Any]) -> TrainConfig:
    """A :class:`TrainConfig` from a mapping: sectioned (``{"data": {"batch_size": 8}, ...}``,
    as saved now and as TOML files hold it) or flat by option name (``config.json`` of runs
    recorded before sections, ``watchdog_abort`` 0/1 and texts such as ``"5:150"`` included).
    Missing options take their defaults.

    Raises:
        TitanError: on an unknown section or option name, or a bad value.
    """
    if not values or not _is_sectioned(values):
        return TrainConfig.of(**values)
    sections = {}
    for name, options in values.items():
        known = {f.name for f in dataclasses.fields(SECTIONS[name])}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TitanError(f"unknown option {unknown[0]!r} in config section [{name}]")
        sections[name] = SECTIONS[name](**options)
    return TrainConfig(**sections)


def read_run_config(path: Path, what: str) -> tuple[TrainConfig, dict[str, Any]]:
    """(the options, the model shape's fields) of a run's ``config.json`` at ``path``
    (``{"train": {...}, "model": {...}}``), read by :func:`titan.reading.read_json`.

    Args:
        what: the flag that named the run (``--resume``), for errors.

    Raises:
        TitanError: a file :func:`titan.reading.read_json` refuses, a Hugging Face model's
            ``config.json`` (its ``model_type``), ``train`` or ``model`` missing or not an
            object, a number option of a sectioned ``train`` recorded as a string (Titan
            writes numbers), or an option :func:`config_from_dict` refuses (each names the
            file and the field).
    """
    where = f"{what} {path}"
    saved = read_json(path, what)
    if isinstance(saved, dict) and "model_type" in saved and "train" not in saved:
        raise TitanError(
            f"{what} {path.parent}: a Hugging Face model's directory, not a Titan run: make it "
            f"one with titan import hf {path.parent} --out RUN_DIR"
        )
    train = json_field(saved, "train", dict, where)
    model = json_field(saved, "model", dict, where)
    if _is_sectioned(train):
        for option in option_fields():
            if option.kind in ("int", "float"):
                section = f"{where} train.{option.section}"
                json_field(train.get(option.section, {}), option.field.name, float, section, 0)
    try:
        return config_from_dict(train), model
    except TitanError as err:
        raise TitanError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:  # a value no option's codec reached
        raise TitanError(f"{where}: field 'train': {err}") from None


def read_config_file(path: str) -> dict[str, Any]:
    """The options of a TOML config file (``--config``), by flat name: the file holds sections
    as tables (``[data]`` ``batch_size = 8``), as :func:`config_to_toml` writes them.

    Raises:
        TitanError: a file :func:`titan.reading.read_toml` refuses (unreadable, not a regular
            file, too large, not UTF-8, bad TOML), unknown section or option, two keys of one
            option (``batch_size`` and ``batch-size``), or a value of the wrong type (names the
            file, section and key).
    """
    values = read_toml(path, "--config")
    flat = {}
    for section, options in values.items():
        if section not in SECTIONS:
            raise TitanError(
                f"--config {path}: unknown section {section!r}; sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(options, dict):
            what = "an array of tables" if isinstance(options, list) else repr(options)
            raise TitanError(f"--config {path}: [{section}] must be one table, got {what}")
        keys: dict[str, str] = {}  # option name -> the key that set it
        for key, value in options.items():
            option = _option_of_key(key)
            if option is None or option.section != section:
                raise TitanError(f"--config {path}: {_unknown_key(key, section, option)}")
            if option.name in keys:
                raise TitanError(
                    f"--config {path}: [{section}] {keys[option.name]} and {key} both set "
                    f"{option.flag}: keep one"
                )
            keys[option.name] = key
            try:
                _check_toml_type(option, value)
                option.checked(value)  # checked here to name the file; kept as written
            except TitanError as err:
                raise TitanError(f"--config {path}: [{section}] {key}: {err}") from None
            flat[option.name] = value
    return flat


TOML_TYPES = {"int": "an integer", "float": "a number", "bool": "true or false"}
"""What a TOML value of an option of each plain kind must be: a TOML integer, float (or
integer) or boolean, never a string or a number standing for a switch (the command line's
texts, ``"8"``, ``"on"``, ``1``, are for the command line)."""


def _check_toml_type(option: Option, value: Any) -> None:
    """Refuse a TOML value of another TOML type than ``option``'s kind (:data:`TOML_TYPES`).

    Raises:
        TitanError: names the flag, the type wanted and the value.
    """
    kind = option.kind
    if kind not in TOML_TYPES:
        return
    accepted: tuple[type, ...] = {"int": (int,), "float": (int, float), "bool": (bool,)}[kind]
    if isinstance(value, bool) != (kind == "bool") or not isinstance(value, accepted):
        raise TitanError(f"{option.flag} must be {TOML_TYPES[kind]}, got {value!r}")


def _option_of_key(key: str) -> Any:
    """The option a TOML key names: its field name (``corpus``), its flag's name (``data``,
    ``batch_size`` or ``batch-size``), or its flat name (``preset``); None for no option."""
    for option in option_fields():
        names = {option.field.name, option.name, option.flag.removeprefix("--")}
        if key in names or key.replace("_", "-") in names:
            return option
    return None


def _unknown_key(key: str, section: str, option: Any) -> str:
    """``unknown option 'steps' in [data]: it belongs in [optimizer] (--steps)``, or the keys
    ``[section]`` takes."""
    if option is not None:
        return (
            f"unknown option {key!r} in [{section}]: it belongs in [{option.section}] "
            f"({option.flag})"
        )
    keys = [toml_key(o) for o in option_fields() if o.section == section]
    return f"unknown option {key!r} in [{section}]; [{section}] takes: {', '.join(keys)}"


def toml_key(option: Option) -> str:
    """The key of ``option`` in its section's TOML table, as :func:`config_to_toml` writes it:
    its flag's name with underscores (``batch_size``, ``model``)."""
    return option.flag.removeprefix("--").replace("-", "_")


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
"""A TOML key written without quotes (TOML 1.0, "Keys": bare keys are ASCII letters, digits,
``_`` and ``-``)."""


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's escapes are TOML's, and DEL (U+007F), which TOML
    forbids raw and JSON leaves raw, is escaped too (TOML 1.0, "String").

    Raises:
        TitanError: ``text`` holds a lone surrogate (bytes that are not UTF-8, as a path's
            undecodable bytes are read): no TOML string can hold it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TitanError(f"{text!r}: bytes that are not UTF-8, which TOML cannot hold") from None
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    items = (
        f"{k if BARE_KEY.fullmatch(k) else _toml_string(k)} = {_toml_value(v)}"
        for k, v in value.items()
    )
    return "{ " + ", ".join(items) + " }" if value else "{}"


def config_to_toml(cfg: TrainConfig) -> str:
    """``cfg`` as a TOML document, one table per section, keyed by flag names (``model``,
    ``data``, ``batch_size``); :func:`read_config_file` reads it
    back to the same config. (Values are strings, numbers, booleans, arrays and inline tables;
    a writer of that much TOML is this function.)

    Raises:
        TitanError: a value holds bytes that are not UTF-8 (names its flag).
    """
    lines: list[str | None] = []
    by_field = {o.field.name: o for o in option_fields()}
    for section, values in config_to_data(cfg).items():
        lines += ["" if lines else None, f"[{section}]"]
        for key, value in values.items():
            try:
                lines.append(f"{toml_key(by_field[key])} = {_toml_value(value)}")
            except TitanError as err:
                raise TitanError(f"{by_field[key].flag} {err}") from None
    return "\n".join(line for line in lines if line is not None) + "\n"


def resumed_config(saved: TrainConfig, explicit: Mapping[str, Any]) -> TrainConfig:
    """The config of a resumed run: ``saved`` with the ``explicit`` options (flat names) that
    may change on resume (:func:`resumable_options`); a saved profiled range is cut to a lowered
    ``--steps``. The learning-rate schedule keeps its length unless ``--decay-steps`` is given,
    and a warmup that the old length cut stays as the run trained it.

    Raises:
        TitanError: an explicit option that differs from the saved one and may not change.
    """
    by_name = options_by_name()
    current, recorded = saved.flat(), saved.record()
    for name, value in explicit.items():
        option = by_name[name]
        if not option.resumable and option.coerce(value) != current[name]:
            raise TitanError(
                f"{option.flag} cannot change on --resume (the run used {recorded[name]!r}); "
                "changeable: " + ", ".join(sorted(flag_of(n) for n in resumable_options()))
            )
    changes = dict(explicit)
    if "decay_steps" not in explicit and not saved.optimizer.decay_steps:
        # a longer --steps continues at the minimum learning rate: the schedule keeps its length
        changes["decay_steps"] = saved.optimizer.steps
    _, warmup = saved.optimizer.schedule_steps()
    if "decay_steps" in explicit and warmup < saved.optimizer.warmup_steps:
        # the warmup was cut to the old horizon: a new one keeps the warmup the run trained with
        changes["warmup_steps"] = warmup
    if "profile_steps" not in explicit and saved.observability.profile_steps is not None:
        steps = by_name["steps"].coerce(explicit.get("steps", saved.optimizer.steps))
        first, last = saved.observability.profile_steps
        changes["profile_steps"] = None if first > steps else (first, min(last, steps))
    return saved.replace(**changes)
