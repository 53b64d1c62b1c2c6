"""The config of a resumed run (``titan train --resume RUN_DIR``): the run's saved options with
the allowed overrides of the command line, read without JAX (``--print-config`` uses it too).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from titan.config import (
    PIPELINE_ONLY_OPTIONS,
    ParallelOptions,
    TrainConfig,
    flag_of,
    resumable_options,
)
from titan.config_files import read_run_config, resumed_config
from titan.errors import TitanError
from titan.inert import inert
from titan.reading import lines_from_end, parse_json
from titan.schedules import SCHEDULES
from titan.shapes import ModelConfig
from titan.telemetry.records import CONFIG_FILE, EVENTS_FILE, read_first_events

TOKENIZER_FILE = "tokenizer.model"
# The bytes of a record read for its run_start event (a run_start line is tens of kB).
RECORD_HEAD_BYTES = 4 << 20


def resume_options(run_dir: Path, explicit: dict[str, Any]) -> TrainConfig:
    """The saved options of ``run_dir`` with the allowed explicit overrides applied.

    A resume onto ``--layout spmd`` resets the pipeline options the saved run set
    (:data:`titan.config.PIPELINE_ONLY_OPTIONS`) to their defaults, unless ``explicit`` gives
    them; ``--microbatches`` stays (SPMD accumulates gradients over it). One of an interleaved
    run onto a schedule of one chunk per stage resets ``--virtual-stages`` and
    ``--stage-layers`` likewise (:func:`pipeline_reset`).

    Raises:
        TitanError: ``run_dir`` holds no run (no ``config.json``, no tokenizer of a text run),
            or an option that cannot change was changed.
    """
    config_path = run_dir / CONFIG_FILE
    if not config_path.exists():
        raise TitanError(f"--resume {run_dir}: no {CONFIG_FILE} there (not a run dir)")
    saved, _ = read_run_config(config_path, "--resume")
    check_saved_config(run_dir, saved)
    if saved.model.task == "lm" and not (run_dir / TOKENIZER_FILE).is_file():
        raise TitanError(
            f"--resume {run_dir}: no {TOKENIZER_FILE} there (a copy of a run record without "
            "its tokenizer and checkpoints cannot be resumed)"
        )
    placed = sorted({"runs_root", "run_id"} & explicit.keys())
    if placed:
        raise TitanError(f"{flag_of(placed[0])} cannot be given with --resume (the run dir is)")
    whole = Path(run_dir).resolve()  # `--resume .` names its run too, a link the run it is
    placement = {"runs_root": _runs_root(saved.run.runs_root, whole.parent), "run_id": whole.name}
    changes = {**pipeline_reset(explicit, saved.parallel), **explicit}
    return resumed_config(saved, changes).replace(**placement)


def check_saved_config(run_dir: Path, saved: TrainConfig) -> None:
    """Refuse a ``config.json`` whose options that cannot change on a resume differ from those
    the run's first ``run_start`` recorded (an option left out of an edited file is read as its
    default: the resume would silently train another run). Options the record lacks, the
    pipeline's (a resume onto another layout resets them) and the run's place are not compared;
    an unreadable record is for :func:`check_record` to refuse.

    Raises:
        TitanError: names the flag, the recorded value and the saved one.
    """
    try:
        events = read_first_events(run_dir / EVENTS_FILE, RECORD_HEAD_BYTES)
    except OSError:
        return
    starts = [e.get("config") for e in events if e["type"] == "run_start"]
    recorded = starts[0] if starts and isinstance(starts[0], dict) else {}
    skipped = {*PIPELINE_ONLY_OPTIONS, "runs_root", "run_id", *resumable_options()}
    for name, value in saved.record().items():
        if name not in skipped and name in recorded and recorded[name] != value:
            raise TitanError(
                f"--resume {run_dir}: {CONFIG_FILE} says {flag_of(name)} {value!r} but the run "
                f"recorded {recorded[name]!r} in its {EVENTS_FILE} ({CONFIG_FILE} was edited or "
                "damaged: put the recorded value back)"
            )


def _runs_root(saved: str | None, parent: Path) -> str:
    """The runs root a resume records: the saved one where it names ``parent``, the absolute
    folder of the run (however ``--resume`` spells the path), else ``parent`` (the run was
    moved; a relative path would hang on the directory the resume was started in)."""
    if saved and Path(saved).resolve() == parent.resolve():
        return saved
    return str(parent)


# The fields of a DiT's shape that its images decide (titan.trainer.image_task.image_model_config),
# as errors name them.
IMAGE_SHAPE_FIELDS = {
    "vocab_size": "labels (classes and the null label)",
    "image_size": "pixels a side",
    "channels": "channels",
}


def check_resumed_images(run_dir: Path, model: ModelConfig) -> None:
    """Refuse a resume of a diffusion run whose images now ask for another model (``model``)
    than the one it trained (its ``config.json``): another number of classes (labels), image
    size or channels, which no checkpoint of the run could be restored into.

    Raises:
        TitanError: one line naming both and why they may differ.
    """
    _, saved = read_run_config(run_dir / CONFIG_FILE, "--resume")
    changed = [f for f in IMAGE_SHAPE_FIELDS if f in saved and saved[f] != getattr(model, f)]
    if changed:
        now = ", ".join(f"{getattr(model, f)} {IMAGE_SHAPE_FIELDS[f]}" for f in changed)
        then = ", ".join(f"{saved[f]} {IMAGE_SHAPE_FIELDS[f]}" for f in changed)
        raise TitanError(
            f"--resume {run_dir}: the images now give {now}; the run trained {then} (the "
            f"folder changed, or {OLDER_IMAGE_RULES})"
        )


OLDER_IMAGE_RULES = (
    "the run is an older titan's, which read folders otherwise: hidden folders as classes, "
    "hidden files as images, 16-bit images clipped to 8 bits"
)
"""Why an image folder that did not change may give other classes or pixels than an older
titan's read of it."""


def check_record(run_dir: Path) -> None:
    """Refuse a record that a resume could not continue: ``events.jsonl`` missing, not a
    regular file (a FIFO is refused, never waited on) or unreadable, or without a ``run_start``
    event in its first :data:`RECORD_HEAD_BYTES` bytes (not a Titan record).

    Raises:
        TitanError: one line naming the file.
    """
    path = run_dir / EVENTS_FILE
    try:
        events = read_first_events(path, RECORD_HEAD_BYTES)
    except OSError as err:
        reason = err.strerror or str(err)
        raise TitanError(
            f"--resume {run_dir}: cannot read the run record {path} ({reason})"
        ) from None
    if not any(event["type"] == "run_start" for event in events):
        raise TitanError(
            f"--resume {run_dir}: the run record {path} starts with no run_start event "
            "(not a Titan record, or damaged)"
        )


def launch_dir(run_dir: Path) -> Path | None:
    """The working directory the run started in: its first ``run_start`` event's ``env.cwd``
    (None: not recorded, or no readable record)."""
    try:
        events = read_first_events(run_dir / EVENTS_FILE, RECORD_HEAD_BYTES)
    except OSError:
        return None
    starts = [event for event in events if event["type"] == "run_start"]
    env = starts[0].get("env") if starts else None
    cwd = env.get("cwd") if isinstance(env, dict) else None
    return Path(cwd) if isinstance(cwd, str) and os.path.isabs(cwd) else None


def enter_launch_dir(run_dir: Path) -> Path:
    """Work in the directory the run in ``run_dir`` started in (:func:`launch_dir`), when it is
    another one that exists, so that a resume started anywhere reads the run's relative paths
    (``--data corpus.jsonl``, ``--eval-data``) as its start did; one line says so, or, where
    that directory is gone, that the paths are read from here.

    Returns:
        ``run_dir`` as named from the working directory now (absolute once it moved).
    """
    launch = launch_dir(run_dir)
    if launch is None or (launch.is_dir() and launch.resolve() == Path.cwd().resolve()):
        return run_dir
    if not launch.is_dir():
        print(
            f"titan: the run started in {inert(str(launch))}, which is gone: its relative paths "
            f"are read from {inert(os.getcwd())}",
            flush=True,
        )
        return run_dir
    run_dir = run_dir.absolute()
    os.chdir(launch)
    print(
        f"titan: working in {inert(str(launch))}, where the run started: its relative paths "
        "name the same files there",
        flush=True,
    )
    return run_dir


def pipeline_reset(explicit: dict[str, Any], saved: ParallelOptions) -> dict[str, Any]:
    """The defaults of the pipeline options ``explicit`` leaves out when it asks for
    ``--layout spmd``: the saved run's pipeline does not carry over. Likewise
    ``--virtual-stages`` and ``--stage-layers`` (which counts each virtual stage) when it asks
    for a schedule of one chunk per stage (``--schedule gpipe``) and the saved run had several.
    None otherwise."""
    defaults = ParallelOptions()
    if explicit.get("layout") == "spmd":
        names: tuple[str, ...] = PIPELINE_ONLY_OPTIONS
    elif saved.virtual_stages > 1 and _one_chunk_per_stage(explicit.get("schedule")):
        names = ("virtual_stages", "stage_layers")
    else:
        names = ()
    return {n: getattr(defaults, n) for n in names if n not in explicit}


def _one_chunk_per_stage(schedule: Any) -> bool:
    """Whether ``schedule`` (a ``--schedule`` value, or None) names a registered schedule of one
    model chunk per stage."""
    spec = SCHEDULES.get(schedule) if isinstance(schedule, str) else None
    return spec is not None and not spec.virtual_stages


CHECKPOINT_EVENT = b'"type": "checkpoint"'
"""How a ``checkpoint`` event's type reads in a record line (``json.dumps``' separators)."""


def recorded_checkpoint(run_dir: Path) -> int | None:
    """The step that the last ``checkpoint`` event (a committed save) of the run's record names,
    or None (no such event, or no readable record). The record is read backwards from its end
    (:func:`titan.reading.lines_from_end`) and only lines naming the event are parsed, so a
    resume reads the record's tail, not a record of real size whole."""
    try:
        for line in lines_from_end(run_dir / EVENTS_FILE):
            if CHECKPOINT_EVENT in line:
                event = parse_json(line)
                step = event.get("step") if isinstance(event, dict) else None
                if isinstance(step, int) and not isinstance(step, bool):
                    return step
    except OSError:
        return None
    return None
