"""Typed configuration: the training options of ``titan train``, with their validation.

:class:`TrainConfig` is a tree of frozen sections (:data:`SECTIONS`: model, optimizer, data,
compute, parallel, checkpoint, observability, debugging, run), one dataclass each, holding every
option of ``titan train`` with its real type: switches are ``bool``, choices ``Literal``,
``stage_layers`` a tuple of counts, ``profile_steps`` an optional (first, last) pair, ``ops`` a
mapping, the model a :class:`ModelConfig`. Values are parsed and checked once, when a section is
constructed (a text such as ``"3,5,5,3"`` is accepted and parsed there); a bad value raises a
one-line :class:`~titan.errors.TitanError` naming its flag. Each field carries its CLI flag, help
text and what it is (resumable, part of the performance key) as metadata, so that the
``titan train`` and ``titan plan`` CLIs (:func:`add_arguments`), TOML config files
(:func:`read_config_file`, :func:`config_to_toml`) and the console's forms (``tui``) are all
derived from this one place. Every option also has a flat name (its field name; ``data`` for the
corpus and ``preset`` for the model), which the CLI, the forms and the records of runs use. A
run's ``config.json`` holds :func:`config_to_data`; flat configs of older runs still load
(:func:`config_from_dict`).

This module imports neither JAX nor Textual, so the console and the planner can import it cheaply.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, dataclass_transform

from titan.errors import TitanError
from titan.inert import inert
from titan.ops.registry import parse_overrides
from titan.parsing import parse_counts, parse_range
from titan.remat import AUTO, REMAT_POLICIES
from titan.schedules import SCHEDULES, check_schedule_options
from titan.shapes import (
    DEFAULT_VOCAB_SIZE,
    MIN_TRAINED_VOCAB,
    PRESETS,
    SHAPE_FIELDS,
    ModelConfig,
    check_shape,
    model_text,
    parse_model,
)
from titan.stopping import PHASES

MAX_STEPS = 2**31 - 1
"""The most optimizer steps of a run: optax counts its updates in an int32
(``ScaleByAdamState.count``), which its bias correction and schedules read."""

Dtype = Literal["float32", "bfloat16"]
DTYPES: tuple[Dtype, ...] = ("float32", "bfloat16")
# "auto" and the names of titan.remat's registry
Remat = Literal["auto", "none", "dots", "dots-attention", "full"]
AttentionMask = Literal["document", "causal"]
ATTENTION_MASKS: tuple[AttentionMask, ...] = ("document", "causal")
MatmulDtype = Literal["compute", "float8"]
MATMUL_DTYPES: tuple[MatmulDtype, ...] = ("compute", "float8")
TrainLayout = Literal["spmd", "mpmd"]
LAYOUTS: tuple[TrainLayout, ...] = ("spmd", "mpmd")
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]  # titan.schedules
ModelSource = Literal["titan", "maxtext"]
MODEL_SOURCES: tuple[ModelSource, ...] = ("titan", "maxtext")
Task = Literal["lm", "diffusion"]
# The model family each --task trains.
TASK_FAMILIES = {"lm": "llama", "diffusion": "dit"}
TASKS: tuple[Task, ...] = ("lm", "diffusion")
NonFinite = Literal["skip", "abort"]
NONFINITE_ACTIONS: tuple[NonFinite, ...] = ("skip", "abort")
MetricsSink = Literal["none", "tensorboard"]  # titan.telemetry.sinks.LIVE_SINKS
METRICS_SINKS: tuple[MetricsSink, ...] = ("none", "tensorboard")


# Characters of a run id (the run dir's name): ASCII letters, digits, dot, underscore, hyphen.
_RUN_ID = re.compile(r"[A-Za-z0-9._-]+")
MAX_RUN_ID_CHARS = 200


def check_run_id(text: str) -> None:
    """Refuse a run id that is not a plain, safe dir name.

    A run id names the run dir and is shown by every reader, so only ASCII letters, digits,
    ``.``, ``_`` and ``-`` are allowed (no path separators, no control characters or escapes, no
    markup), it must not start with a dot (``.``, ``..`` and hidden dirs) and it has at most
    :data:`MAX_RUN_ID_CHARS` characters.

    Raises:
        TitanError: the id breaks one of these rules (the message names which).
    """
    shown = inert(text[: MAX_RUN_ID_CHARS + 1])
    if not text:
        raise TitanError("--run-id: empty; use ASCII letters, digits, '.', '_' and '-'")
    if len(text) > MAX_RUN_ID_CHARS:
        raise TitanError(
            f"--run-id: {len(text)} characters; at most {MAX_RUN_ID_CHARS} are allowed"
        )
    if not _RUN_ID.fullmatch(text):
        raise TitanError(
            f"--run-id '{shown}': only ASCII letters, digits, '.', '_' and '-' are allowed"
        )
    if text.startswith("."):
        raise TitanError(f"--run-id '{shown}': must not start with '.'")


# --- codecs: how an option's value is parsed, checked, written to files and to the CLI ---------


@dataclass(frozen=True)
class Codec:
    """How values of one kind of option convert.

    Attributes:
        coerce: (value or its text, flag) -> the typed value; raises TitanError.
        dump: typed value -> plain data for JSON and TOML (str, int, float, bool, list, dict).
        text: typed value -> the text ``titan train`` takes for it (``""`` for none).
    """

    coerce: Callable[[Any, str], Any]
    dump: Callable[[Any], Any] = lambda value: value
    text: Callable[[Any], str] = str


def _number(kind: type) -> Callable[[Any, str], Any]:
    def coerce(value: Any, flag: str) -> Any:
        if isinstance(value, str):
            try:
                value = kind(value.strip())
            except ValueError:
                raise TitanError(
                    f"argument {flag}: invalid {kind.__name__} value: {value.strip()!r}"
                ) from None
        accepted = (int, float) if kind is float else (int,)
        if isinstance(value, bool) or not isinstance(value, accepted):
            what = "an integer" if kind is int else "a number"
            raise TitanError(f"{flag} must be {what}, got {value!r}")
        return kind(value)

    return coerce


def _string(value: Any, flag: str) -> str:
    if not isinstance(value, str):
        raise TitanError(f"{flag} must be a string, got {value!r}")
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _switch(value: Any, flag: str) -> bool:
    text = value.strip().lower() if isinstance(value, str) else value
    if text in _TRUE or text is True or (type(text) is int and text == 1):
        return True
    if text in _FALSE or text is False or (type(text) is int and text == 0):
        return False
    raise TitanError(f"{flag} must be 0 or 1 (true or false), got {value!r}")


def _counts(value: Any, flag: str) -> tuple[int, ...]:
    if isinstance(value, str):
        return parse_counts(value, flag)
    if not isinstance(value, list | tuple) or not all(type(v) is int for v in value):
        raise TitanError(f"{flag} must be a list of integers, got {value!r}")
    return tuple(value)


def _steps_range(value: Any, flag: str) -> tuple[int, int] | None:
    if value is None or value == "" or value == [] or value == ():
        return None
    if isinstance(value, str):
        return parse_range(value, flag)
    if isinstance(value, list | tuple) and len(value) == 2 and all(type(v) is int for v in value):
        return (value[0], value[1])
    raise TitanError(f"{flag} must be 'A:B' (two step numbers), got {value!r}")


def _ops(value: Any, flag: str) -> dict[str, str]:
    if isinstance(value, str):
        return parse_overrides(value, source=flag)
    if not isinstance(value, Mapping):
        raise TitanError(f"{flag} must be op=provider entries, got {value!r}")
    return parse_overrides(",".join(f"{op}={name}" for op, name in value.items()), source=flag)


def _shape(value: Any, flag: str) -> ModelConfig:
    if isinstance(value, ModelConfig):
        return value
    if isinstance(value, str):
        return parse_model(value, flag)
    if isinstance(value, Mapping):
        if value.get("name") in PRESETS and set(value) <= {"name"}:
            return PRESETS[value["name"]]
        _check_shape_fields(value, flag)
        shape = ModelConfig(**{"name": "custom", **value})
        preset = PRESETS.get(shape.name)
        if preset is not None:  # its vocabulary may be filled in (tokenizer, --init-from)
            preset = dataclasses.replace(preset, vocab_size=shape.vocab_size)
        if preset is not None and preset != shape:
            raise TitanError(
                f"{flag}: name {shape.name!r} is a preset of another shape "
                f"({_shape_difference(preset, shape)}); leave name out for a custom shape"
            )
        if preset is None:
            check_shape(shape, flag)
        return shape
    raise TitanError(f"{flag} must be a preset name or a shape, got {value!r}")


def _shape_difference(preset: ModelConfig, shape: ModelConfig) -> str:
    """The first field in which ``shape`` differs from ``preset``: ``d_model 32, not 2048``."""
    for f in dataclasses.fields(ModelConfig):
        mine, theirs = getattr(shape, f.name), getattr(preset, f.name)
        if mine != theirs:
            return f"{f.name} {mine}, not {theirs}"
    return "the same"


_FIELD_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,)}


def _check_shape_fields(value: Mapping[str, Any], flag: str) -> None:
    """Refuse a shape given as a mapping (a TOML table, a saved ``config.json``) with a field
    that ModelConfig lacks, without one of :data:`SHAPE_FIELDS`, or with a value of another
    type than its field's (a bool is no number)."""
    fields = {f.name: f.type for f in dataclasses.fields(ModelConfig)}
    for key, item in value.items():
        if key not in fields:
            raise TitanError(f"{flag}: unknown field {key!r}; fields: {', '.join(fields)}")
        kinds = _FIELD_KINDS.get(str(fields[key]), (object,))
        if isinstance(item, bool) or not isinstance(item, kinds):
            raise TitanError(f"{flag}: {key} must be of type {fields[key]}, got {item!r}")
    missing = [key for key in SHAPE_FIELDS if key not in value]
    if missing:
        raise TitanError(f"{flag}: missing {', '.join(missing)}")


def _settings(value: Any, flag: str) -> dict[str, str]:
    """``key=value`` entries (texts of them separated by spaces: a value holds none) or a
    mapping of keys to scalar values (a TOML table: a value may hold spaces) as a key ->
    value-text mapping.

    Raises:
        TitanError: an entry that is not ``key=value``, or a mapping's value that is a table or
            an array (names the key).
    """
    if isinstance(value, Mapping):
        return {str(key).strip(): _setting_text(key, text, flag) for key, text in value.items()}
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list | tuple):
        raise TitanError(f"{flag} must be key=value entries, got {value!r}")
    settings = {}
    for entry in [word for item in value for word in str(item).split()]:
        key, sep, text = str(entry).partition("=")
        if not sep or not key.strip():
            raise TitanError(
                f"{flag}: {inert(str(entry))!r} is not key=value (entries are separated by "
                "spaces; a value with spaces goes in a TOML table)"
            )
        settings[key.strip()] = text.strip()
    return settings


def _setting_text(key: Any, value: Any, flag: str) -> str:
    """One value of a settings mapping as MaxText's command line takes it (booleans as
    ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list | tuple) or not str(key).strip():
        raise TitanError(f"{flag}: {inert(str(key))!r} must be key = a text or number")
    return str(value).strip()


def _dump_shape(m: ModelConfig) -> str | dict[str, Any]:
    """A preset's name, else the shape's fields (None ones left out: TOML has no null)."""
    if PRESETS.get(m.name) == m:
        return m.name
    return {k: v for k, v in m.record().items() if v is not None}


CODECS: dict[str, Codec] = {
    "int": Codec(_number(int)),
    "float": Codec(_number(float)),
    "str": Codec(_string),
    "bool": Codec(_switch, text=lambda v: "true" if v else "false"),
    "counts": Codec(_counts, list, lambda v: ",".join(map(str, v))),
    "range": Codec(
        _steps_range,
        lambda v: [] if v is None else list(v),
        lambda v: "" if v is None else f"{v[0]}:{v[1]}",
    ),
    "ops": Codec(_ops, dict, lambda v: ",".join(f"{op}={name}" for op, name in v.items())),
    "shape": Codec(_shape, _dump_shape, model_text),
    "settings": Codec(_settings, dict, lambda v: " ".join(f"{k}={t}" for k, t in v.items())),
}


CODECS_PLAIN = ("int", "float", "str", "bool")  # kinds recorded and shown as they are


def _opt(
    flag: str,
    help: str,
    *,
    codec: str | None = None,
    name: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    resumable: bool = False,
    perf: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """Field metadata of an option.

    Args:
        flag: its ``titan train`` flag.
        codec: a :data:`CODECS` key when the annotation does not say (composite values).
        name: its flat name when not the field name.
        minimum: smallest allowed value (``"{flag} must be >= {minimum}"``).
        maximum: largest allowed value (``"{flag} must be <= {maximum}"``).
        above, below: exclusive bounds (``"{flag} must be > {above}"``, ``< {below}``);
            ``titan train --help`` and ``docs/options.md`` state every bound.
        resumable: may change when a run is resumed; everything else must match the saved run.
        perf: part of the performance database's key (``titan.analysis.perfdb``): runs
            that differ in it are not compared.
        extra: ``choices`` (allowed values), ``planner`` (``titan plan`` takes it too).
    """
    meta = {"flag": flag, "help": help, "resumable": resumable, "perf": perf}
    bounds = {"minimum": minimum, "maximum": maximum, "above": above, "below": below}
    return meta | {"codec": codec, "name": name, **bounds, **extra}


def _kind(f: dataclasses.Field) -> str:
    """The :data:`CODECS` key of a field: its ``codec``, ``str`` for choices (``Literal``), else
    its annotation (``int``, ``float``, ``str``, ``bool``)."""
    meta = f.metadata
    return meta["codec"] or ("str" if meta.get("choices") else str(f.type))


def _checked(f: dataclasses.Field, value: Any) -> Any:
    """``value`` of the option field ``f``, coerced to its type and checked against its choices
    and bounds.

    Raises:
        TitanError: a value of another type, not finite, not a choice or out of bounds (names
            the flag).
    """
    meta = f.metadata
    flag = meta["flag"]
    value = CODECS[_kind(f)].coerce(value, flag)
    if isinstance(value, float) and not math.isfinite(value):
        raise TitanError(f"{flag} must be a finite number, got {value}")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise TitanError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
    if meta["minimum"] is not None and value < meta["minimum"]:
        raise TitanError(f"{flag} must be >= {meta['minimum']}, got {value}")
    if meta["maximum"] is not None and value > meta["maximum"]:
        raise TitanError(f"{flag} must be <= {meta['maximum']}, got {value}")
    if meta["above"] is not None and not value > meta["above"]:
        raise TitanError(f"{flag} must be > {meta['above']}, got {value}")
    if meta["below"] is not None and not value < meta["below"]:
        raise TitanError(f"{flag} must be < {meta['below']}, got {value}")
    return value


def _normalize(section: Any) -> None:
    """Coerce every field of a section to its type and check it (``__post_init__``)."""
    for f in dataclasses.fields(section):
        object.__setattr__(section, f.name, _checked(f, getattr(section, f.name)))


_Section = TypeVar("_Section")


@dataclass_transform(frozen_default=True)  # the checker then knows each section's fields
def _section(cls: type[_Section]) -> type[_Section]:
    """A frozen config section whose fields are coerced and checked on construction, then by its
    own ``_check`` (when it has one)."""

    def __post_init__(self: Any) -> None:
        _normalize(self)
        getattr(self, "_check", lambda: None)()

    cls.__post_init__ = __post_init__  # type: ignore[attr-defined]  # dataclass() calls it
    return dataclass(frozen=True)(cls)


# --- the sections -------------------------------------------------------------------------------


@_section
class RunOptions:
    """Where the run is recorded, and its seed."""

    runs_root: str = field(
        default="",
        metadata=_opt("--runs-root", "folder holding run dirs (default: $TITAN_RUNS or ./runs)"),
    )
    run_id: str = field(
        default="", metadata=_opt("--run-id", "name of the run dir (default: generated)")
    )
    seed: int = field(
        default=0, metadata=_opt("--seed", "seed for initialisation and shuffling", minimum=0)
    )
    exit_zero_on_stop: bool = field(
        default=False,
        metadata=_opt(
            "--exit-zero-on-stop",
            "exit 0 when a signal stops the run (for wrappers that need it) instead of code 4, "
            "which tells a stopped run (resume it) from a completed one (0); "
            "--no-exit-zero-on-stop undoes a saved one",
            resumable=True,
        ),
    )

    def _check(self) -> None:
        if self.seed >= 2**32:
            raise TitanError(f"--seed must be < 2**32, got {self.seed}")
        if self.run_id.startswith(".") or "/" in self.run_id or "\\" in self.run_id:
            raise TitanError(f"--run-id must be a plain folder name, got {inert(self.run_id)!r}")
        if self.run_id:
            check_run_id(self.run_id)


@_section
class ModelOptions:
    """The model's shape."""

    shape: ModelConfig = field(
        default=PRESETS["tiny"],
        metadata=_opt(
            "--model",
            f"model shape: a preset ({', '.join(PRESETS)}) or a custom shape "
            "d_model=..,n_layers=..,n_heads=..,n_kv_heads=..,ffn_dim=..,vocab_size=.. and "
            "optionally rope_theta=.. (default 500000, Llama 3's; the tiny preset's is 10000) "
            "(as titan plan --model takes it); --preset NAME is the same for a preset "
            "(default: 'tiny')",
            codec="shape",
            name="preset",
        ),
    )
    model_source: ModelSource = field(
        default="titan",
        metadata=_opt(
            "--model-source",
            "who builds the model: 'titan' (Titan's Llama of --model), 'maxtext' (a MaxText "
            "model, --maxtext-model; needs the [maxtext] extra, Python 3.12+; docs/maxtext.md)",
            choices=MODEL_SOURCES,
        ),
    )
    maxtext_model: str = field(
        default="",
        metadata=_opt(
            "--maxtext-model",
            "MaxText model name (a yml of maxtext/configs/models: llama2-7b, llama3-8b, "
            "mistral-7b, gemma2-2b, qwen3-0.6b, mixtral-8x7b, ...) with --model-source maxtext",
        ),
    )
    maxtext_set: dict[str, str] = field(
        default_factory=dict,
        metadata=_opt(
            "--maxtext-set",
            "MaxText config overrides KEY=VALUE ... (as MaxText's command line takes them, e.g. "
            "base_emb_dim=256 base_num_decoder_layers=4; a value with spaces goes in a TOML "
            "table); repeatable",
            codec="settings",
        ),
    )
    task: Task = field(
        default="lm",
        metadata=_opt(
            "--task",
            "'lm': a causal language model on --data; 'diffusion': a DiT (--preset dit-tiny, the "
            "default there, to dit-xl-2) on --images, see the diffusion options",
            choices=TASKS,
        ),
    )

    @property
    def label(self) -> str:
        """How errors name the model: ``--preset tiny``, ``--model`` (a shape given field by
        field), or ``--maxtext-model NAME``."""
        if self.model_source == "maxtext":
            return f"--maxtext-model {self.maxtext_model}"
        return f"--preset {self.shape.name}" if self.shape.name in PRESETS else "--model"

    def _check(self) -> None:
        if self.model_source == "maxtext" and not self.maxtext_model:
            raise TitanError("--model-source maxtext needs --maxtext-model NAME")
        if self.model_source == "maxtext" and self.task != "lm":
            raise TitanError("--model-source maxtext trains language models (--task lm)")
        if self.model_source == "maxtext" and self.shape != PRESETS["tiny"]:
            raise TitanError(
                "--preset/--model: not with --model-source maxtext (the shape comes from "
                "--maxtext-model and --maxtext-set)"
            )
        if self.model_source != "maxtext" and (self.maxtext_model or self.maxtext_set):
            flag = "--maxtext-model" if self.maxtext_model else "--maxtext-set"
            raise TitanError(f"{flag} needs --model-source maxtext")
        if self.task == "diffusion" and self.shape == PRESETS["tiny"]:
            object.__setattr__(self, "shape", PRESETS["dit-tiny"])  # the task's default model
        wanted = TASK_FAMILIES[self.task]
        if self.shape.family != wanted:
            given = f"--preset {self.shape.name}" if self.shape.name in PRESETS else "--model"
            what = "" if self.shape.name in PRESETS else " (its family field)"
            raise TitanError(
                f"{given} is a {self.shape.family} model{what}; --task {self.task} "
                f"trains {wanted} models"
            )


def check_typed_shape(typed: str, model: ModelOptions) -> None:
    """Refuse a shape typed on the command line (``--preset tiny``, ``--model``) where the
    default one would be replaced: ``--task diffusion`` puts its own default (``dit-tiny``) in
    the place of ``tiny``, and ``--model-source maxtext`` takes its shape from
    ``--maxtext-model``; typed, such a shape is refused as any other of the wrong kind is. (A
    config file names the shape whatever it is: ``--print-config`` writes ``tiny`` for a MaxText
    run.)

    Raises:
        TitanError: names the shape and what the task or source trains.
    """
    given = options_by_name()["preset"].coerce(typed)
    if model.model_source == "maxtext":
        raise TitanError(
            "--preset/--model: not with --model-source maxtext (the shape comes from "
            "--maxtext-model and --maxtext-set)"
        )
    if given != model.shape:  # the task put its own default in its place
        flag = f"--preset {given.name}" if given.name in PRESETS else "--model"
        raise TitanError(
            f"{flag} is a {given.family} model; --task {model.task} trains "
            f"{TASK_FAMILIES[model.task]} models"
        )


_WEIGHT_TAIL = re.compile(r":\s*[0-9.eE+-]+\s*$")  # a mixture part's ':WEIGHT'
# Largest --data-workers: the cores of the largest two-socket hosts (2 x 128); each
# worker holds up to two 4 Mi-character chunks (titan.data.tokenize), 10000 would fork that many.
MAX_DATA_WORKERS = 256
# Largest --image-size: the largest resolution of Peebles & Xie 2023 (DiT, Sec. 5: ImageNet
# 512 x 512). Titan's DiT works on pixels and holds the images in host memory as float32
# (size^2 x channels x 4 bytes each: 3 MiB per RGB image at 512); a 512 image is already
# (512 / 2)^2 = 65,536 tokens at patch 2, and 2048 made the digits alone 30 GB.
MAX_IMAGE_SIZE = 512


@_section
class DataOptions:
    """The corpus, its tokenizer and the batch."""

    corpus: str = field(
        default="stdlib",
        metadata=_opt(
            "--data",
            "corpus: 'stdlib' (this Python's standard library sources), a file, a directory or "
            "a glob (hidden files and directories left out); each file's format by its name: "
            ".jsonl or .ndjson, plain or .gz, .zst, .bz2, .xz (one JSON object per line), "
            ".parquet, anything else plain text (one document per file); a "
            "weighted mixture as 'web/*.jsonl.zst:0.7,code/:0.3' (each part sampled in "
            "proportion to its weight)",
            name="data",
        ),
    )
    text_field: str = field(
        default="text",
        metadata=_opt(
            "--text-field", "the JSON field (.jsonl*) or column (.parquet) holding the text"
        ),
    )
    tokenizer: str = field(
        default="",
        metadata=_opt(
            "--tokenizer",
            "tokenizer to use, told by content: a sentencepiece .model or a Hugging Face "
            "tokenizer.json (BOS/EOS from the tokenizer_config.json beside it, else its "
            "template); empty trains one on the corpus (cached)",
        ),
    )
    data_workers: int = field(
        default=0,
        metadata=_opt(
            "--data-workers",
            "worker processes that tokenize the corpus (0: one per usable CPU, as the affinity "
            "mask and a container limit allow; a corpus of one chunk, 4 Mi characters, is "
            "tokenized in the training process)",
            minimum=0,
            maximum=MAX_DATA_WORKERS,
            resumable=True,
        ),
    )
    vocab_size: int = field(
        default=DEFAULT_VOCAB_SIZE,
        metadata=_opt(
            "--vocab-size",
            "vocabulary of the tokenizer trained when none is given (a custom --model shape's "
            "vocab_size instead; refused beside --tokenizer); at least 3 special tokens and 256 "
            "byte pieces",
            minimum=MIN_TRAINED_VOCAB,
        ),
    )
    batch_size: int = field(
        default=16,
        metadata=_opt(
            "--batch-size",
            "global batch in sequences per step (tokens per step: --batch-size x --seq-len)",
            minimum=1,
            perf=True,
        ),
    )
    seq_len: int = field(
        default=128, metadata=_opt("--seq-len", "tokens per sequence", minimum=1, perf=True)
    )
    eval_data: str = field(
        default="",
        metadata=_opt(
            "--eval-data",
            "held-out corpus for --eval-every: one corpus (a file, a directory or a glob, read "
            "like --data with the same tokenizer), no mixture or weights; or use --eval-split",
        ),
    )
    eval_split: float = field(
        default=0.0,
        metadata=_opt(
            "--eval-split",
            "fraction of --data's documents held out for --eval-every, chosen per document by "
            "a hash of its text and never trained on (0: none)",
            minimum=0,
            below=1,
        ),
    )

    def _check(self) -> None:
        if not self.corpus.strip():
            raise TitanError("--data is empty")
        if not self.text_field.strip():
            raise TitanError("--text-field is empty: name the field (.jsonl) or column (.parquet)")
        if self.eval_data and not self.eval_data.strip():
            raise TitanError("--eval-data is empty")
        if "," in self.eval_data or _WEIGHT_TAIL.search(self.eval_data):
            raise TitanError(
                f"--eval-data {self.eval_data}: takes one corpus (files, globs, dirs), no "
                "mixture or weights"
            )
        if self.eval_split and self.eval_data:
            raise TitanError("--eval-split and --eval-data exclude each other: give one")


@_section
class OptimizerOptions:
    """AdamW and its learning-rate schedule (linear warmup, cosine decay)."""

    steps: int = field(
        default=200,
        metadata=_opt(
            "--steps",
            "total optimizer steps of the run (a resumed run stops here); at most 2^31 - 1, "
            "optax's int32 step count",
            minimum=1,
            maximum=MAX_STEPS,
            resumable=True,
        ),
    )
    lr: float = field(default=3e-3, metadata=_opt("--lr", "peak learning rate (AdamW)", above=0))
    min_lr_ratio: float = field(
        default=0.1,
        metadata=_opt(
            "--min-lr-ratio", "final learning rate as a fraction of --lr", minimum=0, maximum=1
        ),
    )
    warmup_steps: int = field(
        default=30,
        metadata=_opt(
            "--warmup-steps",
            "linear warmup steps before cosine decay: step 1 trains at 0 and the rate reaches "
            "--lr after this many steps (step N trains at the rate after N - 1 updates); at most "
            "the schedule's length (--decay-steps, else --steps): a longer warmup is cut to it",
            minimum=0,
        ),
    )
    decay_steps: int = field(
        default=0,
        metadata=_opt(
            "--decay-steps",
            "step after which the cosine decay reaches --min-lr-ratio x --lr, which later steps "
            "keep (0: --steps); a resumed run keeps its schedule's length unless this is given",
            minimum=0,
            resumable=True,
        ),
    )
    weight_decay: float = field(
        default=0.1,
        metadata=_opt("--weight-decay", "AdamW decoupled weight decay", minimum=0),
    )
    grad_clip: float = field(
        default=1.0,
        metadata=_opt("--grad-clip", "global gradient-norm clip (0 disables)", minimum=0),
    )
    nonfinite: NonFinite = field(
        default="skip",
        metadata=_opt(
            "--nonfinite",
            "a step whose loss or gradient norm is not finite (checked on the device) never "
            "changes the parameters or optimizer state; 'skip': record it and go on, failing "
            "after --nonfinite-patience such steps in a row; 'abort': record run_end failed "
            "(reason nonfinite) and exit with code 5, keeping the last checkpoint",
            choices=NONFINITE_ACTIONS,
            resumable=True,
        ),
    )
    nonfinite_patience: int = field(
        default=5,
        metadata=_opt(
            "--nonfinite-patience",
            "under --nonfinite skip: end the run as --nonfinite abort does after N non-finite "
            "steps in a row",
            minimum=1,
            resumable=True,
        ),
    )

    def schedule_steps(self) -> tuple[int, int]:
        """(horizon, warmup) in steps: where the cosine ends (``--decay-steps``, else
        ``--steps``) and where the linear warmup does (``--warmup-steps``, at most the
        horizon)."""
        horizon = self.decay_steps or self.steps
        return horizon, min(self.warmup_steps, horizon)


@_section
class ComputeOptions:
    """How the model computes: dtypes, attention mask, operator providers, the layer loop and
    what the backward pass recomputes."""

    param_dtype: Dtype = field(
        default="float32",
        metadata=_opt(
            "--param-dtype",
            "master weights and optimizer state",
            choices=DTYPES,
            perf=True,
            planner=True,
        ),
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = field(
        default="auto",
        metadata=_opt(
            "--compute-dtype",
            "matmul/activation dtype ('auto': bfloat16 on GPU/TPU, float32 on CPU)",
            choices=("auto", *DTYPES),
            perf=True,
            planner=True,
        ),
    )
    matmul_dtype: MatmulDtype = field(
        default="compute",
        metadata=_opt(
            "--matmul-dtype",
            "dtype of the decoder blocks' linear layers (Q, K, V, output, MLP): 'compute': the "
            "compute dtype; 'float8': FP8 GEMMs, E4M3 operands and E5M2 gradients with one "
            "scale per tensor and step (GPUs with FP8 only, e.g. Hopper; emulated on the CPU); "
            "master weights, optimizer, norms, attention, embedding, head and loss unchanged, "
            "no state added, so a resume may switch it",
            choices=MATMUL_DTYPES,
            resumable=True,
            perf=True,
            planner=True,
        ),
    )
    fused_projections: bool = field(
        default=False,
        metadata=_opt(
            "--fused-projections",
            "Q, K and V in one GEMM and gate and up in another, their weights concatenated in "
            "the step (parameters and checkpoints keep them apart; under --tp the "
            "concatenation moves data)",
            resumable=True,
            perf=True,
        ),
    )
    remat: Remat = field(
        default="auto",
        metadata=_opt(
            "--remat",
            "activation recomputation per layer ('auto': on GPUs and TPUs the fastest of "
            "dots-attention, dots, full that fits: titan train takes the estimate's choice and "
            "holds it against the compiled program, titan plan adds its margin; on the CPU none)",
            choices=(AUTO, *REMAT_POLICIES),
            resumable=True,
            perf=True,
            planner=True,
        ),
    )
    attention_mask: AttentionMask = field(
        default="document",
        metadata=_opt(
            "--attention-mask",
            "'document': causal within each packed document (segment ids; Llama 3's choice); "
            "'causal': causal over the whole packed sequence, documents see earlier ones "
            "(cheaper: fused kernels without a segment mask)",
            choices=ATTENTION_MASKS,
            perf=True,
        ),
    )
    layer_unroll: int = field(
        default=0,
        metadata=_opt(
            "--layer-unroll",
            "decoder blocks per iteration of the layer scan; 0: chosen by depth (all of them, "
            "the loop fully unrolled, up to 28 layers with --remat none or dots-attention and "
            "16 with dots or full: faster on GPUs; deeper models 1, a rolled loop that "
            "compiles in seconds); N >= the layer count: fully unrolled",
            minimum=0,
            resumable=True,
            perf=True,
        ),
    )
    compilation_cache: bool = field(
        default=True,
        metadata=_opt(
            "--compilation-cache",
            "keep compiled programs in $TITAN_CACHE/xla (default ~/.cache/titan/xla), so that a "
            "second start of the same configuration loads its step instead of compiling it",
            resumable=True,
        ),
    )
    ops: dict[str, str] = field(
        default_factory=dict,
        metadata=_opt(
            "--ops",
            "operator providers, e.g. 'attention=pallas,cross_entropy=chunked' (default: the "
            "registry's choice per backend; $TITAN_OPS applies under these)",
            codec="ops",
            resumable=True,
        ),
    )
    memory_check: bool = field(
        default=True,
        metadata=_opt(
            "--memory-check",
            "before the state is made, compare the planner's memory estimate per device of the "
            "model and layout with the device's usable memory (a GPU's allocator pool; on CPU "
            "the host's memory divided by the run's devices) and refuse a run above it (naming "
            "what would fit); --no-memory-check: run anyway",
            resumable=True,
        ),
    )


def _parallel(flag: str, help: str, default: int, minimum: int, **extra: Any) -> Any:
    meta = _opt(flag, help, minimum=minimum, resumable=True, perf=True, planner=True, **extra)
    return field(default=default, metadata=meta)


@_section
class ParallelOptions:
    """How the model and the batch are split over devices. ``titan plan`` takes the same
    options (those marked ``planner``); ``layout`` and ``stage_layers`` are the trainer's."""

    layout: TrainLayout = field(
        default="spmd",
        metadata=_opt("--layout", "training layout", choices=LAYOUTS, resumable=True, perf=True),
    )
    dp: int = _parallel(
        "--dp", "data-parallel size (0: all devices left by fsdp x tp, and pp)", 0, 0
    )
    fsdp: int = _parallel("--fsdp", "fully-sharded data-parallel size", 1, 1)
    tp: int = _parallel("--tp", "tensor-parallel size", 1, 1)
    pp: int = _parallel("--pp", "pipeline stages (device groups; titan train: --layout mpmd)", 1, 1)
    microbatches: int = _parallel(
        "--microbatches",
        "microbatches per step (pipelined under --layout mpmd, gradient accumulation under spmd)",
        1,
        1,
    )
    schedule: Schedule = field(
        default="1f1b",
        metadata=_opt(
            "--schedule",
            "pipeline schedule (titan train: --layout mpmd)",
            choices=tuple(SCHEDULES),
            resumable=True,
            perf=True,
            planner=True,
        ),
    )
    virtual_stages: int = _parallel(
        "--virtual-stages", "model chunks per device group (--schedule interleaved-1f1b)", 1, 1
    )
    stage_layers: tuple[int, ...] = field(
        default=(),
        metadata=_opt(
            "--stage-layers",
            "layers per model chunk in pipeline order, e.g. '3,5,5,3' (default: even split)",
            codec="counts",
            resumable=True,
            perf=True,
        ),
    )

    def check_schedule(self) -> None:
        """Raises TitanError for schedule options the registered schedule rejects."""
        check_schedule_options(self.schedule, self.pp, self.microbatches, self.virtual_stages)


@_section
class CheckpointOptions:
    """When checkpoints are written, how (in the background or not) and which are kept; the
    checkpoint a new run starts from."""

    checkpoint_every: int = field(
        default=100,
        metadata=_opt(
            "--checkpoint-every", "save a checkpoint every N steps", minimum=1, resumable=True
        ),
    )
    checkpoint_every_s: float = field(
        default=0.0,
        metadata=_opt(
            "--checkpoint-every-s",
            "also save after the first step that ends this many seconds after the last save "
            "(0: steps only; one process only)",
            minimum=0,
            resumable=True,
        ),
    )
    checkpoint_keep: int = field(
        default=3,
        metadata=_opt(
            "--checkpoint-keep",
            "keep the N newest committed checkpoints, deleting older ones",
            minimum=1,
            resumable=True,
        ),
    )
    checkpoint_keep_every: int = field(
        default=0,
        metadata=_opt(
            "--checkpoint-keep-every",
            "also keep every checkpoint whose step is a multiple of K, forever (0: none)",
            minimum=0,
            resumable=True,
        ),
    )
    checkpoint_async: bool = field(
        default=True,
        metadata=_opt(
            "--checkpoint-async",
            "write checkpoints in the background: the loop waits only for the copy to host "
            "memory; --no-checkpoint-async: wait for every save to commit",
            resumable=True,
        ),
    )
    checkpoint_pin_host: bool = field(
        default=True,
        metadata=_opt(
            "--checkpoint-pin-host",
            "on GPUs, with asynchronous saves and one before the last, reserve the pinned host "
            "memory that saves copy the state into after the first step, in no step's time "
            "(15 to 22 s for llama3-1b's 18 GB on an H200 host), so that the first save does not "
            "slow the steps it overlaps; --no-checkpoint-pin-host: that save grows it, holding "
            "those steps back about as long",
            resumable=True,
        ),
    )
    init_from: str = field(
        default="",
        metadata=_opt(
            "--init-from",
            "start from the weights of this checkpoint (a run dir or titan import hf output: "
            "its newest readable checkpoint; or <dir>/checkpoints/<step>) at step 0 with a "
            "fresh optimizer, on any layout; its model shape and tokenizer unless --tokenizer "
            "is given (a different --model or --vocab-size is refused)",
        ),
    )


@_section
class ObservabilityOptions:
    """Logs, timings, the stall watchdog and profiler traces."""

    log_every: int = field(
        default=10,
        metadata=_opt(
            "--log-every",
            "print a log line every N steps (no terminal)",
            minimum=1,
            resumable=True,
        ),
    )
    timing_every: int = field(
        default=50,
        metadata=_opt(
            "--timing-every",
            "record a pipeline_timing event (per-action durations) every N steps (--layout mpmd)",
            minimum=1,
            resumable=True,
        ),
    )
    watchdog_floor: float = field(
        default=300.0,
        metadata=_opt(
            "--watchdog-floor",
            "seconds a step may always take before the watchdog reports a stall (the allowance "
            "is the larger of this and --watchdog-factor x the median step time)",
            above=0,
            resumable=True,
        ),
    )
    watchdog_factor: float = field(
        default=10.0,
        metadata=_opt(
            "--watchdog-factor",
            "stall allowance of a step in median step times",
            above=0,
            resumable=True,
        ),
    )
    watchdog_abort: bool = field(
        default=False,
        metadata=_opt(
            "--watchdog-abort",
            "on a stall, record run_end failed (reason stall) and exit with code 3 so that a "
            "supervisor can restart the run; --no-watchdog-abort: only record the stall",
            resumable=True,
        ),
    )
    loss_spike_window: int = field(
        default=100,
        metadata=_opt(
            "--loss-spike-window",
            "finite losses of the steps before that a loss spike is measured against (a "
            "loss_spike event: loss > mean + --loss-spike-sigma x standard deviation of them)",
            minimum=2,
            resumable=True,
        ),
    )
    loss_spike_sigma: float = field(
        default=6.0,
        metadata=_opt(
            "--loss-spike-sigma",
            "how many standard deviations above the window's mean a loss spike is",
            above=0,
            resumable=True,
        ),
    )
    eval_every: int = field(
        default=0,
        metadata=_opt(
            "--eval-every",
            "evaluate the held-out data (--eval-data or --eval-split) after every N-th step, "
            "recorded as eval events (0: never)",
            minimum=0,
            resumable=True,
        ),
    )
    eval_batches: int = field(
        default=4,
        metadata=_opt(
            "--eval-batches",
            "batches of --batch-size x --seq-len held-out tokens per evaluation (the same ones "
            "each time; fewer when the held-out data holds fewer)",
            minimum=1,
            resumable=True,
        ),
    )
    profile_steps: tuple[int, int] | None = field(
        default=None,
        metadata=_opt(
            "--profile-steps",
            "'A:B': capture a JAX profiler trace of steps A to B (1-based, inclusive) into "
            "<run dir>/profile/ (open with TensorBoard's or XProf's profile plugin, or Perfetto); "
            "empty: no trace",
            codec="range",
            resumable=True,
        ),
    )
    metrics: MetricsSink = field(
        default="none",
        metadata=_opt(
            "--metrics",
            "live metrics writer that follows events.jsonl while the run trains: 'tensorboard' "
            "writes TensorBoard event files into <run dir>/tensorboard/ (needs the [sinks] "
            "extra); 'none': only events.jsonl (titan export writes sinks afterwards)",
            choices=METRICS_SINKS,
            resumable=True,
        ),
    )


@_section
class DebuggingOptions:
    """Testing aids."""

    debug_stall_at_step: int = field(
        default=0,
        metadata=_opt(
            "--debug-stall-at-step",
            "testing aid: hang the loop before step N to exercise the watchdog (0: never)",
            minimum=0,
            resumable=True,
        ),
    )
    debug_nonfinite_at_step: int = field(
        default=0,
        metadata=_opt(
            "--debug-nonfinite-at-step",
            "testing aid: poison the batch of step N with token ids beyond the vocabulary (their "
            "embedding is NaN) to exercise --nonfinite (0: never)",
            minimum=0,
            resumable=True,
        ),
    )
    debug_usable_memory: float = field(
        default=0.0,
        metadata=_opt(
            "--debug-usable-memory",
            "testing aid: usable device memory in bytes for the memory check, in place of the "
            "device's own figure (0: the device's, or on CPU the host's share)",
            minimum=0,
            resumable=True,
        ),
    )
    debug_signal_in: str = field(
        default="",
        metadata=_opt(
            "--debug-signal-in",
            "testing aid: send SIGINT to the process in this start-up phase (scan: the corpus, "
            "tokenizer: its training, build: the model, tokenize: the corpus, restore: the "
            "checkpoint or a new run's initial state, trace: the step; '': never)",
            choices=("", *PHASES),
            resumable=True,
        ),
    )


@_section
class DiffusionOptions:
    """The images and the training objective of ``--task diffusion``
    (:mod:`titan.diffusion.objectives`, :mod:`titan.data.images`)."""

    images: str = field(
        default="digits",
        metadata=_opt(
            "--images",
            "'digits' (scikit-learn's 1,797 8x8 digits, read from its installed files) or a "
            "folder of PNG/JPEG files, one subfolder per class (sorted names are labels 0, 1, ..)",
        ),
    )
    image_size: int = field(
        default=0,
        metadata=_opt(
            "--image-size",
            "side in pixels the images are resized and centre-cropped to (0: the preset's)",
            minimum=0,
            maximum=MAX_IMAGE_SIZE,
        ),
    )
    objective: Literal["flow", "epsilon", "v"] = field(
        default="flow",
        metadata=_opt(
            "--objective",
            "'flow': flow matching (target noise - x); 'epsilon' or 'v': DDPM predicting the "
            "noise or v",
            choices=("flow", "epsilon", "v"),
        ),
    )
    beta_schedule: Literal["linear", "cosine"] = field(
        default="linear",
        metadata=_opt(
            "--beta-schedule",
            "DDPM noise schedule over 1000 steps (Ho et al. 2020; cosine: Nichol & Dhariwal 2021)",
            choices=("linear", "cosine"),
        ),
    )
    snr_gamma: float = field(
        default=0.0,
        metadata=_opt(
            "--snr-gamma",
            "DDPM Min-SNR-gamma loss weighting (Hang et al. 2023 use 5; 0: unweighted)",
            minimum=0,
        ),
    )
    flow_shift: float = field(
        default=1.0,
        metadata=_opt(
            "--flow-shift",
            "flow matching timestep shift (1: none; SD3 uses 3, Wan 5; the bounds keep the "
            "shifted training sigmas distinct in float64)",
            minimum=1e-3,
            maximum=1e3,
        ),
    )
    flow_weighting: Literal["gaussian", "none"] = field(
        default="gaussian",
        metadata=_opt(
            "--flow-weighting",
            "flow matching loss weight per timestep: MaxDiffusion's 'gaussian' or 'none'",
            choices=("gaussian", "none"),
        ),
    )
    label_dropout: float = field(
        default=0.1,
        metadata=_opt(
            "--label-dropout",
            "fraction of examples trained with the null label, for classifier-free guidance "
            "(DiT uses 0.1)",
            minimum=0,
            maximum=1,
        ),
    )


# Section name -> its dataclass, in ``titan train --help`` and TOML order.
SECTIONS: dict[str, type] = {
    "model": ModelOptions,
    "optimizer": OptimizerOptions,
    "data": DataOptions,
    "compute": ComputeOptions,
    "parallel": ParallelOptions,
    "checkpoint": CheckpointOptions,
    "observability": ObservabilityOptions,
    "debugging": DebuggingOptions,
    "run": RunOptions,
    "diffusion": DiffusionOptions,
}


@dataclass(frozen=True)
class Option:
    """One option of ``titan train``: a field of a section.

    Attributes:
        section: its section's name (a :data:`SECTIONS` key).
        field: the dataclass field (its metadata: :func:`_opt`).
    """

    section: str
    field: dataclasses.Field

    @property
    def name(self) -> str:
        """The flat name (the field name, or ``data`` / ``preset``)."""
        return self.field.metadata["name"] or self.field.name

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.field.metadata

    @property
    def flag(self) -> str:
        return self.field.metadata["flag"]

    @property
    def help(self) -> str:
        return self.field.metadata["help"]

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.field.metadata.get("choices") or ())

    @property
    def resumable(self) -> bool:
        return self.field.metadata["resumable"]

    @property
    def perf_key(self) -> bool:
        return self.field.metadata["perf"]

    @property
    def planner(self) -> bool:
        """``titan plan`` takes it too (a layout option of the planner's)."""
        return bool(self.field.metadata.get("planner", False))

    @property
    def kind(self) -> str:
        """The :data:`CODECS` key: ``int``, ``float``, ``str``, ``bool`` or a composite."""
        return _kind(self.field)

    @property
    def codec(self) -> Codec:
        return CODECS[self.kind]

    @property
    def default(self) -> Any:
        f = self.field
        if f.default is not dataclasses.MISSING:
            return f.default
        assert callable(f.default_factory), self.name  # every option has a default
        return f.default_factory()

    def coerce(self, value: Any) -> Any:
        """The typed value of ``value`` (typed already, plain data, or text)."""
        return self.codec.coerce(value, self.flag)

    def checked(self, value: Any) -> Any:
        """:meth:`coerce`, then checked against the option's choices and bounds, as a section
        checks it.

        Raises:
            TitanError: as a section's construction does for this option (names the flag).
        """
        return _checked(self.field, value)

    def text(self, value: Any) -> str:
        """``value`` as ``titan train`` takes it on its command line."""
        return self.codec.text(value)


def option_fields() -> tuple[Option, ...]:
    """Every option of ``titan train``, section by section, in CLI order."""
    return tuple(
        Option(section, f) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
    )


def options_by_name() -> dict[str, Option]:
    return {o.name: o for o in option_fields()}


def flag_of(name: str) -> str:
    """The CLI flag of an option's flat name (``batch_size`` -> ``--batch-size``)."""
    return options_by_name()[name].flag


def resumable_options() -> frozenset[str]:
    """Flat names of the options that may change when a run is resumed."""
    return frozenset(o.name for o in option_fields() if o.resumable)


def perf_key_options() -> tuple[str, ...]:
    """Flat names of the options in the performance database's key."""
    return tuple(o.name for o in option_fields() if o.perf_key)


@dataclass(frozen=True)
class TrainConfig:
    """Every option of ``titan train``, in sections. Construct it from flat names with
    :meth:`of`, from a saved or TOML mapping with :func:`config_from_dict`.

    Raises (on construction):
        TitanError: one line naming the first bad option (within a section, then across them:
            pipeline options other than ``--microbatches`` without ``--layout mpmd``, a batch
            that does not split into microbatches, a profiled range beyond ``--steps``).
    """

    model: ModelOptions = field(default_factory=ModelOptions)
    optimizer: OptimizerOptions = field(default_factory=OptimizerOptions)
    data: DataOptions = field(default_factory=DataOptions)
    compute: ComputeOptions = field(default_factory=ComputeOptions)
    parallel: ParallelOptions = field(default_factory=ParallelOptions)
    checkpoint: CheckpointOptions = field(default_factory=CheckpointOptions)
    observability: ObservabilityOptions = field(default_factory=ObservabilityOptions)
    debugging: DebuggingOptions = field(default_factory=DebuggingOptions)
    run: RunOptions = field(default_factory=RunOptions)
    diffusion: DiffusionOptions = field(default_factory=DiffusionOptions)

    def __post_init__(self) -> None:
        validate_train_config(self)

    @classmethod
    def of(cls, **options: Any) -> TrainConfig:
        """The config with these options (flat names) over the defaults; values may be typed,
        plain data or the texts the CLI takes (``profile_steps="5:150"``).

        Raises:
            TitanError: an unknown option name, or a bad value.
        """
        return TrainConfig().replace(**options)

    def replace(self, **options: Any) -> TrainConfig:
        """This config with some options (flat names) changed."""
        by_name = options_by_name()
        unknown = sorted(set(options) - set(by_name))
        if unknown:
            raise TitanError(f"unknown option {unknown[0]!r} in config")
        sections: dict[str, dict[str, Any]] = {}
        for name, value in options.items():
            option = by_name[name]
            sections.setdefault(option.section, {})[option.field.name] = value
        return dataclasses.replace(
            self,
            **{
                name: dataclasses.replace(getattr(self, name), **values)
                for name, values in sections.items()
            },
        )

    @property
    def trainer(self) -> TrainerOptions:
        """The options the run's trainer is built from."""
        data = self.data
        return TrainerOptions(
            self.model,
            self.compute,
            self.parallel,
            self.optimizer,
            data.batch_size,
            data.seq_len,
            self.observability.timing_every,
        )

    def flat(self) -> dict[str, Any]:
        """Every option's typed value by flat name."""
        return {o.name: getattr(getattr(self, o.section), o.field.name) for o in option_fields()}

    def record(self) -> dict[str, Any]:
        """The flat form of the run records (``run_start``'s ``config``): numbers, names and
        switches as they are, composite values as their CLI texts (``"3,5,5,3"``, ``"5:150"``),
        as runs have always recorded them."""
        return {
            o.name: value if o.kind in CODECS_PLAIN else o.text(value)
            for o, value in zip(option_fields(), self.flat().values(), strict=True)
        }


@dataclass(frozen=True)
class TrainerOptions:
    """The options a run's trainer is built from (:attr:`TrainConfig.trainer`,
    :func:`titan.layouts.builders.build_run_trainer`): the model family's sections (``model``,
    ``compute``), the layout's (``parallel``, ``optimizer``), the batch (``--batch-size`` x
    ``--seq-len``) and how often a pipeline records its actions' timings (``--timing-every``)."""

    model: ModelOptions
    compute: ComputeOptions
    parallel: ParallelOptions
    optimizer: OptimizerOptions
    batch_size: int
    seq_len: int
    timing_every: int


# The options only --layout mpmd reads (SPMD takes --microbatches too: gradient accumulation).
PIPELINE_ONLY_OPTIONS = ("pp", "virtual_stages", "schedule", "stage_layers")


def validate_train_config(cfg: TrainConfig) -> None:
    """The checks across sections (each section checks its own options on construction); run
    when a :class:`TrainConfig` is constructed.

    Raises:
        TitanError: one line naming the first bad option and what is allowed.
    """
    parallel = cfg.parallel
    if parallel.layout == "spmd":
        defaults = ParallelOptions()
        for name in PIPELINE_ONLY_OPTIONS:
            if getattr(parallel, name) != getattr(defaults, name):
                raise TitanError(f"{flag_of(name)} needs --layout mpmd")
    if cfg.data.batch_size % parallel.microbatches:
        raise TitanError(
            f"--batch-size {cfg.data.batch_size} is not a multiple of --microbatches "
            f"{parallel.microbatches}"
        )
    if parallel.layout == "mpmd":
        parallel.check_schedule()
    check_task_options(cfg)
    shape = cfg.model.shape  # its embedding's and output's vocab rows are split over --tp
    if (
        cfg.model.task == "lm"
        and cfg.model.model_source == "titan"
        and shape.vocab_size % parallel.tp
    ):
        vocab = f"{trained_vocab_source(shape)}{shape.vocab_size}"
        if shape.name != "custom":
            vocab = f"--model {shape.name}'s vocab_size {shape.vocab_size}"
        raise TitanError(
            f"--tp {parallel.tp} does not divide {vocab} (the embedding's rows are split over --tp)"
        )
    # Held-out data without --eval-every is held out and not evaluated (a resume may turn
    # evaluation off; the documents held out stay out of training).
    if cfg.observability.eval_every and not (cfg.data.eval_data or cfg.data.eval_split):
        raise TitanError("--eval-every N needs --eval-data or --eval-split")
    bounds, steps = cfg.observability.profile_steps, cfg.optimizer.steps
    if bounds is not None and not 1 <= bounds[0] <= bounds[1] <= steps:
        raise TitanError(
            f"--profile-steps {bounds[0]}:{bounds[1]}: need 1 <= A <= B <= --steps ({steps}), "
            f"got A={bounds[0]}, B={bounds[1]}"
        )


# Options only --task lm reads (a diffusion run reads --images, its sequence is the image's
# patches, attended to in full); --task lm reads no DiffusionOptions.
LM_ONLY_OPTIONS = (
    "data", "tokenizer", "text_field", "vocab_size", "data_workers", "eval_data", "eval_split",
    "eval_every", "seq_len", "attention_mask",
)  # fmt: skip


def check_task_options(cfg: TrainConfig) -> None:
    """Refuse an option of the other task set away from its default (given, then ignored).

    Raises:
        TitanError: ``--data does not apply to --task diffusion (it reads --images)``, or a
            diffusion option given with ``--task lm``.
    """
    flat = cfg.flat()
    sections = {name: cls() for name, cls in SECTIONS.items()}
    defaults = {o.name: getattr(sections[o.section], o.field.name) for o in option_fields()}
    names, reason = _other_task_options(cfg.model.task)
    for name in names:
        if flat[name] != defaults[name]:
            raise TitanError(f"{flag_of(name)} does not apply to {reason}")


def check_typed_task_options(task: str, typed: Iterable[str]) -> None:
    """Refuse an option of the other task typed on the command line (``typed``: flat names),
    at its default value too (``--images digits`` for a language model):
    :func:`check_task_options` sees only values away from the default, from any source (a
    config file that ``--print-config`` wrote holds every option).

    Raises:
        TitanError: as :func:`check_task_options`.
    """
    names, reason = _other_task_options(task)
    for name in names:
        if name in typed:
            raise TitanError(f"{flag_of(name)} does not apply to {reason}")


def _other_task_options(task: str) -> tuple[tuple[str, ...], str]:
    """The options that ``--task`` ``task`` does not read, and why, as its errors say it."""
    if task == "diffusion":
        return (
            LM_ONLY_OPTIONS,
            "--task diffusion (it reads --images, each one sequence of its patches)",
        )
    names = tuple(o.name for o in option_fields() if o.section == "diffusion")
    return names, f"--task {task} (only --task diffusion reads it)"


def model_config(shape: ModelConfig, tokenizer_vocab: int, tokenizer: str = "") -> ModelConfig:
    """The model shape of a run (``--model``'s ``shape``), with the vocabulary taken from the
    tokenizer when the shape leaves it open (``vocab_size == 0``, the ``tiny`` preset).
    ``tokenizer`` is ``--tokenizer`` (named in the error; empty for a trained one).

    Raises:
        TitanError: when the tokenizer has more pieces than the shape's embedding has rows.
    """
    if shape.vocab_size == 0:
        return dataclasses.replace(shape, vocab_size=tokenizer_vocab)
    if tokenizer_vocab > shape.vocab_size:
        source = f"--tokenizer {tokenizer}" if tokenizer else "the tokenizer"
        raise TitanError(
            f"{source} has {tokenizer_vocab} pieces but --model {shape.name} embeds only "
            f"{shape.vocab_size} (vocab_size)"
        )
    return shape


def check_vocab_size_unused(tokenizer: str, vocab_size: int | None, typed: bool) -> None:
    """Refuse ``--vocab-size`` (``vocab_size``; None when not given) beside ``--tokenizer``
    (``tokenizer``): it sizes only a tokenizer trained on the corpus, so it would be ignored,
    and the run's config would record a vocabulary its model does not have. Any value
    ``typed`` on the command line is refused; from a config file the default
    (:data:`titan.shapes.DEFAULT_VOCAB_SIZE`) passes, which one that ``--print-config`` wrote
    holds, given or not.

    Raises:
        TitanError: names both options.
    """
    if vocab_size is None or (vocab_size == DEFAULT_VOCAB_SIZE and not typed):
        return
    if tokenizer:
        raise TitanError(
            f"--vocab-size {vocab_size} sizes only a tokenizer trained on --data; --tokenizer "
            f"{tokenizer} brings its own vocabulary (the run keeps it): leave --vocab-size out"
        )


def custom_vocab_options(options: dict[str, Any], typed: bool) -> dict[str, Any]:
    """``options`` (flat, of :class:`TrainConfig`) with ``vocab_size`` set to a custom
    ``--model`` shape's (of a Titan language model) when a tokenizer is trained
    on ``--data`` (no ``--tokenizer``; the caller leaves out a resume and ``--init-from``): the
    shape's is the vocabulary trained (:func:`trained_vocab_size`), so ``--print-config`` and
    ``config.json`` show it. ``typed``: ``--vocab-size`` was given on the command line.

    Raises:
        TitanError: a ``--vocab-size`` given (typed, or other than the default in a config file)
            that differs from the shape's, naming both.
    """
    by_name = options_by_name()
    model = ModelOptions(
        **{
            by_name[name].field.name: value
            for name, value in options.items()
            if name in by_name and by_name[name].section == "model"
        }
    )
    given, shape = options.get("vocab_size"), model.shape
    if shape.name != "custom" or model.task != "lm" or model.model_source != "titan":
        return options
    if options.get("tokenizer"):
        return options
    if given is not None and given != shape.vocab_size and (typed or given != DEFAULT_VOCAB_SIZE):
        raise TitanError(
            f"--vocab-size {given} and --model vocab_size={shape.vocab_size} disagree: a custom "
            "--model's vocab_size is the vocabulary trained on --data; leave --vocab-size out "
            "or give the same"
        )
    if shape.vocab_size < MIN_TRAINED_VOCAB:  # refused by trained_vocab_size, naming --model
        return options
    return {**options, "vocab_size": shape.vocab_size}


def trained_vocab_source(shape: ModelConfig) -> str:
    """What sets the vocabulary trained on ``--data`` (:func:`trained_vocab_size`), as an
    error names it before the value: ``--model vocab_size=`` for a custom shape, else
    ``--vocab-size ``."""
    return "--model vocab_size=" if shape.name == "custom" else "--vocab-size "


def trained_vocab_size(shape: ModelConfig, vocab_size: int) -> int:
    """Pieces of the tokenizer trained when ``--tokenizer`` is not given: a custom ``--model``
    ``shape``'s ``vocab_size`` (its embedding's rows), else ``--vocab-size`` (``vocab_size``).

    Raises:
        TitanError: a custom shape's ``vocab_size`` below :data:`MIN_TRAINED_VOCAB`.
    """
    if shape.name != "custom":
        return vocab_size
    if shape.vocab_size < MIN_TRAINED_VOCAB:
        raise TitanError(
            f"--model: vocab_size {shape.vocab_size} is below the {MIN_TRAINED_VOCAB} pieces of "
            "a tokenizer trained on --data (3 special tokens and 256 byte pieces): give a larger "
            "one, or --tokenizer"
        )
    return shape.vocab_size
