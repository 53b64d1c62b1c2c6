"""Typed run events: one frozen dataclass per line type of a run's ``events.jsonl``.

Writers build these (the trainer, the pipeline trainer, the watchdog, the profiler) and hand them
to :meth:`titan.telemetry.records.RunRecord.emit`; readers (summaries, ETTR, the report, the
performance database, the console) turn each JSON line into one with :func:`parse_event` and
read attributes. ``docs/events.md`` is generated from the classes here
(``python -m titan.telemetry.events --markdown > docs/events.md``).

Schema versions (the ``schema`` key of every line, :data:`SCHEMA_VERSION`):

- 0: lines without a ``schema`` key (records written before it existed). Read like version 1.
- 1: the current layout. Every line holds ``schema``, ``type``, ``time`` and ``run_id`` and the
  fields of its type, under the names of the dataclass fields.

Reading (:meth:`Event.from_json`) is lenient the way the readers always were: keys the class does
not know are kept in :attr:`Event.extra` (and written back by :meth:`Event.to_json`); a missing
optional field, or one whose value has the wrong JSON type, is None, and so is a NaN or
infinite number; an integral float is accepted for an int field. A line without a finite
``time``, a string ``type``, or a required field of its class raises :class:`EventError`
(readers count it as a bad line). A ``type`` this module does not know parses to an
:class:`UnknownEvent`, which readers ignore.

This module imports neither JAX nor Textual.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

SCHEMA_VERSION = 1
_T = TypeVar("_T")
_HEADER = ("schema", "type", "time", "run_id")
_SCALARS = frozenset({bool, int, float, str, dict})


class EventError(ValueError):
    """A JSON object that is not a readable event (the message says which key is wrong)."""


def _field(doc: str, unit: str = "", *, required: bool = False, omit_if_none: bool = False) -> Any:
    """A dataclass field with its documentation: ``doc`` (meaning and source), ``unit``;
    ``required`` fields have no default (a line without one is not an event of the type);
    ``omit_if_none`` fields are left out of the JSON line when None (written only when they
    apply, as the trainer always did)."""
    metadata = {"doc": doc, "unit": unit, "omit_if_none": omit_if_none}
    if required:
        return field(metadata=metadata)
    return field(default=None, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class Event:
    """Fields every line has. ``type`` is the class's :attr:`type` name."""

    type: ClassVar[str] = ""

    time: float | None = _field(
        "when the event was written (``time.time()`` in :meth:`RunRecord.emit`); None only on "
        "an event not yet written",
        "unix seconds",
    )
    run_id: str | None = _field("the run dir's name; set by :meth:`RunRecord.emit`")
    schema: int = field(
        default=SCHEMA_VERSION,
        metadata={"doc": "schema version of the line (0: written before the key existed)"},
    )
    extra: Mapping[str, Any] = field(
        default_factory=dict,
        metadata={"doc": "keys of the line this class does not know, kept as read"},
    )

    @property
    def written_time(self) -> float:
        """:attr:`time` of an event that was written or read (a line without one is no event).

        Raises:
            ValueError: the event was not written yet (its ``time`` is None).
        """
        if self.time is None:
            raise ValueError(f"a {self.type or 'event'} event not written yet has no time")
        return self.time

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one line (non-finite floats are left to the writer)."""
        line: dict[str, Any] = {
            "schema": self.schema,
            "type": self.type,
            "time": self.time,
            "run_id": self.run_id,
        }
        line.update(_encode_fields(self))
        line.update((k, v) for k, v in self.extra.items() if k not in line)
        return line

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> Self:
        """The event of one line's JSON object (see the module docstring for what is accepted).

        Raises:
            EventError: no numeric ``time``, or a required field missing or of another type.
        """
        known = _payload_names(cls)
        return cls.from_fields(
            **_header(line),
            extra={k: v for k, v in line.items() if k not in known and k not in _HEADER},
            **{k: v for k, v in line.items() if k in known},
        )

    @classmethod
    def from_fields(cls, **values: Any) -> Self:
        """The event of JSON-shaped field values (nested objects as dicts, e.g. the fields that
        :meth:`titan.telemetry.mfu.FlopsMeter.step_fields` returns), converted as
        :meth:`from_json` does.

        Raises:
            EventError: a required field missing or of another type.
            TypeError: a name that is no field of the class.
        """
        unknown = sorted(values.keys() - _names(cls))
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}")
        kwargs = {}
        for name, decode, required, kind in _decoders(cls):
            value = decode(values.get(name))
            if value is None and required:
                raise EventError(f"{cls.type}: {name!r} must be {kind}, got {values.get(name)!r}")
            kwargs[name] = value
        for name in ("time", "run_id", "schema", "extra"):
            if name in values:
                kwargs[name] = values[name]
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class FlopsPerToken:
    """Model training FLOPs per token (6 N + 12 L s d, forward and backward;
    :func:`titan.flops.model_flops_per_token`), per attention convention."""

    causal: float | None = _field(
        "attention FLOPs halved for the causal mask", "FLOPs per token", omit_if_none=True
    )
    full: float | None = _field(
        "attention FLOPs counted in full", "FLOPs per token", omit_if_none=True
    )

    def to_json(self) -> dict[str, Any]:
        return _encode_fields(self)


@dataclass(frozen=True, kw_only=True)
class Mfu:
    """Model (and hardware) FLOPs utilization of one step: FLOPs per token x tokens/s over the
    peak (:class:`titan.telemetry.mfu.FlopsMeter`). ``causal`` is the headline figure."""

    causal: float | None = _field(
        "MFU with attention halved for the causal mask", "fraction of peak", omit_if_none=True
    )
    full: float | None = _field(
        "MFU with attention counted in full", "fraction of peak", omit_if_none=True
    )
    hfu_causal: float | None = _field(
        "hardware FLOPs utilization (adds the forward work ``--remat`` recomputes), causal",
        "fraction of peak",
        omit_if_none=True,
    )
    hfu_full: float | None = _field(
        "hardware FLOPs utilization, attention in full", "fraction of peak", omit_if_none=True
    )
    peak_flops: float | None = _field(
        "peak of all the run's devices together (:func:`titan.telemetry.mfu.device_peak`)",
        "FLOP/s",
        omit_if_none=True,
    )
    peak_kind: str | None = _field(
        "what the peak is, e.g. ``datasheet_dense_bfloat16``", omit_if_none=True
    )
    peak_source: str | None = _field("where the peak figure comes from", omit_if_none=True)

    def to_json(self) -> dict[str, Any]:
        return _encode_fields(self)


# The MFU convention that summaries and the console show (a field of :class:`Mfu`).
MFU_CONVENTION = "causal"


@dataclass(frozen=True, kw_only=True)
class RunStart(Event):
    """Written once per attempt, after tracing and before compilation
    (:func:`titan.trainer.train.train`). A resumed run appends another one to the same file."""

    type: ClassVar[str] = "run_start"

    config: dict[str, Any] | None = _field(
        "the run's options by flat name (``titan.config.TrainConfig.record``: composite "
        "values as their CLI texts, e.g. ``stage_layers`` ``3,5,5,3``)"
    )
    model: dict[str, Any] | None = _field("the model shape (``titan.config.ModelConfig``)")
    model_source: dict[str, Any] | None = _field(
        "the model adapter's ``describe()``: ``family`` and ``layers_by`` (``titan``, or "
        "``maxtext <version>`` with ``maxtext_model``, ``decoder_block``, ``settings``, "
        "``attention``, ``remat_policy``, ``tied_embedding``; :mod:`titan.models.adapters`)"
    )
    param_count: int | None = _field("parameters of the model", "parameters")
    layout: dict[str, Any] | None = _field(
        "the trainer's ``describe()``: ``layout`` (spmd | mpmd), mesh or stages, ``devices`` "
        "(devices the layout uses), ``chunks`` ([first, end) layers)"
    )
    compute_dtype: str | None = _field("dtype of forward and backward, e.g. ``bfloat16``")
    ops: dict[str, Any] | None = _field("the provider serving each operator")
    env: dict[str, Any] | None = _field(
        "versions, device kinds and count, host, working directory (``cwd``), git "
        "(:mod:`titan.telemetry.env`)"
    )
    tokenizer: dict[str, Any] | None = _field(
        "``vocab_size`` and ``source`` (a path or trained); None for a diffusion run"
    )
    data: dict[str, Any] | None = _field(
        "``source``, ``tokens``, ``sequences`` and ``documents`` of the corpus, and ``dropped``: "
        "records that are not documents by reason (``empty``, ``non_text``: the text field "
        "missing or not a string, ``nul_bytes``, ``bad_json``: a .jsonl line that is not a JSON "
        "object, nested past the parser's stack, or whose text holds a lone surrogate; "
        ":data:`titan.data.text.DROP_REASONS`), "
        "summed over the parts of a mixture; "
        "for a mixture also ``parts``: each one's ``source``, ``weight``, ``tokens``, "
        "``documents`` and ``dropped`` (:mod:`titan.data.mixture`); "
        "with ``--eval-every``, ``eval``: the "
        "held-out ``documents``, their ``tokens`` and the ``batches`` each evaluation covers, "
        "and of a mixture with ``--eval-split`` ``parts``: each one's ``source``, ``weight``, "
        "held-out ``documents`` and ``tokens``, and the ``sequences`` evaluated, its weight's "
        "share (:class:`titan.data.heldout.EvalBatches`); with ``--eval-split`` the corpus's "
        "counts are of the training side (also without "
        "``--eval-every``, which then holds the documents out without evaluating them); "
        "of a diffusion run ``source``, "
        "``images``, ``classes``, ``shape`` (H, W, C) and ``digest`` (:mod:`titan.data.images`)"
    )
    start_step: int | None = _field(
        "the step this attempt starts after (0 for a fresh run)", "steps"
    )
    total_steps: int | None = _field("the step the run stops at (``--steps``)", "steps")
    resumed_from_step: int | None = _field(
        "the checkpoint step a resumed attempt restored; None for a fresh run and for a resume "
        "of a dir with no committed checkpoint (it starts from step 0 and says so on stderr)",
        "steps",
    )
    power: dict[str, Any] | None = _field(
        "``source``, ``available``, ``reason`` of the power reading; ``method`` (``counter`` |"
        " ``sampled``), ``power_reading`` (``instant`` | ``average`` | None), ``devices`` (the"
        " devices read: JAX id, library index, UUID) and ``fallbacks`` (why the counter or the"
        " power reading is not used) (:mod:`titan.telemetry.power`)"
    )
    memory_check: dict[str, Any] | None = _field(
        "the memory check before compiling (:mod:`titan.layouts.memory_check`): "
        "``estimate_bytes`` (the planner's peak per device, :mod:`titan.planning.memory`), "
        "``usable_bytes`` (the device's ``bytes_limit``; None when unknown), ``source`` of the "
        "usable figure, ``checked`` (whether the estimate was compared)"
    )
    setup_start: float | None = _field(
        "when :func:`titan.trainer.train.train` began setting the attempt up (reading the "
        "corpus, the tokenizer, building, compiling, restoring), before this line was written; "
        "ETTR counts the attempt from here (:mod:`titan.analysis.ettr`)",
        "unix seconds",
        omit_if_none=True,
    )
    processes: int | None = _field(
        "how many processes run the attempt (``jax.process_count()``; process 0 writes the "
        "record, each keeps ``processes/<id>.json``)"
    )
    process: dict[str, Any] | None = _field(
        "who writes the record: ``host``, ``pid``, ``pgid`` (process group), ``started`` (unix "
        "s, from /proc) and ``process`` (index) of process 0, which the console checks and "
        "signals (:mod:`titan.analysis.liveness`)"
    )


@dataclass(frozen=True, kw_only=True)
class Compile(Event):
    """One XLA compilation: the step's, before the first step (one per stage for an MPMD run),
    the finite check's, and any function compiled a second time during the run (with its
    ``reason``)."""

    type: ClassVar[str] = "compile"

    what: str | None = _field(
        "what was compiled: ``train_step`` (SPMD), ``stage`` (MPMD) or ``finite_check`` (the "
        "check of the weights before a save)"
    )
    seconds: float | None = _field("wall time of the compilation", "seconds")
    stage: int | None = _field("the pipeline stage compiled, MPMD only", omit_if_none=True)
    reason: str | None = _field(
        "why a function was compiled again during the run (JAX's explanation of its tracing-cache "
        "miss: which input changed); absent on the first compilation",
        omit_if_none=True,
    )
    cache_dir: str | None = _field(
        "the persistent compilation cache this compilation read and wrote "
        "(``$TITAN_CACHE/xla``; ``--no-compilation-cache``: absent)",
        omit_if_none=True,
    )
    cache_hits: int | None = _field(
        "programs loaded from the persistent compilation cache instead of compiled",
        omit_if_none=True,
    )
    passed_over: bool | None = _field(
        "a ``--remat auto`` candidate whose program was over the usable memory: compiled "
        "before ``run_start``, then left for the next candidate (its program is not the run's)",
        omit_if_none=True,
    )
    memory: dict[str, int] | None = _field(
        "XLA's memory analysis of the compiled program(s), per device (``compiled."
        "memory_analysis()``): ``argument_bytes``, ``output_bytes``, ``alias_bytes`` (outputs "
        "sharing a donated argument's buffer), ``temp_bytes``, ``generated_code_bytes``; for an "
        "MPMD stage, each figure's largest value over its programs (they run one at a time); "
        "absent when the backend gives none",
        "bytes",
        omit_if_none=True,
    )

    @property
    def run_program_bytes(self) -> int | None:
        """:attr:`program_bytes` of a program the run ran (None for a candidate passed over)."""
        return None if self.passed_over else self.program_bytes

    @property
    def program_bytes(self) -> int | None:
        """argument + output - alias + temp + generated code bytes of :attr:`memory` (the
        buffers XLA assigns the program, per device), or None without a complete analysis."""
        keys = ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes")
        memory = self.memory if isinstance(self.memory, Mapping) else {}
        values = [memory.get(k) for k in (*keys, "alias_bytes")]
        sizes = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if len(sizes) < len(values):
            return None
        return sum(sizes[:-1]) - sizes[-1]


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """One optimizer step, written when its metrics are read (one step late, so the host never
    waits for the device before dispatching the next step)."""

    type: ClassVar[str] = "step"

    step: int = _field("the step done (1-based)", "steps", required=True)
    loss: float | None = _field(
        "mean token cross-entropy (None when not finite: see ``nonfinite``)", "nats"
    )
    grad_norm: float | None = _field(
        "global L2 norm of the gradients before clipping (None when not finite)"
    )
    moe_lb_loss: float | None = _field(
        "MaxText's MoE load-balancing loss, a term of ``loss`` (``--maxtext-set "
        "load_balance_loss_weight=W``, already scaled by W; SPMD only)",
        omit_if_none=True,
    )
    nonfinite: dict[str, str] | None = _field(
        "the step's metrics that were not finite, by field: ``nan``, ``inf`` or ``-inf`` (JSON "
        "has no such numbers, so the field itself is null); the update was not applied "
        "(``skipped``)",
        omit_if_none=True,
    )
    skipped: bool | None = _field(
        "true when the step's update was not applied because its loss or gradient norm was not "
        "finite (checked on the device): parameters and optimizer state are the previous "
        "step's, the batch is consumed (``--nonfinite``)",
        omit_if_none=True,
    )
    lr: float | None = _field(
        "learning rate that the step's update applied (or would have, for a skipped step): the "
        "schedule after the updates applied so far"
    )
    tokens: int | None = _field(
        "tokens of this step (batch size x sequence length; a DiT's: batch size x patches per "
        "image)",
        "tokens",
    )
    tokens_seen: int | None = _field("tokens trained on up to this step", "tokens")
    step_time_s: float | None = _field(
        "wall time between this step's completion and the previous one's (a checkpoint saved "
        "between them is inside it)",
        "seconds",
    )
    tokens_per_s: float | None = _field("tokens / step_time_s", "tokens per second")
    images_per_s: float | None = _field(
        "images / step_time_s of a diffusion run (None for a language model)", "images per second"
    )
    data_position: int | None = _field("sequences consumed after this step", "sequences")
    batch_digest: str | None = _field("crc32 of the batch's sequence ids, hex")
    model_flops_per_token: FlopsPerToken | None = _field(
        "model FLOPs per token (:mod:`titan.telemetry.mfu`)", "FLOPs per token"
    )
    mfu: Mfu | None = _field("MFU and HFU against the peak; None when the peak is unknown")
    mfu_reason: str | None = _field("why ``mfu`` is None", omit_if_none=True)
    energy_j: float | None = _field(
        "energy of all the run's devices during the step; None without a power source",
        "joules",
    )
    joules_per_token: float | None = _field("energy_j / tokens", "joules per token")
    power_switch: dict[str, Any] | None = _field(
        "on the one step after the energy method changed during the run (a frozen counter):"
        " the new ``method`` and the ``reason``",
        omit_if_none=True,
    )
    dispatch_s: float | None = _field(
        "controller time to dispatch every action and update, MPMD only",
        "seconds",
        omit_if_none=True,
    )
    data_wait_s: float | None = _field(
        "time the step waited for its batch (not written by the current trainer; ETTR counts it "
        "as badput when present)",
        "seconds",
        omit_if_none=True,
    )
    peak_memory_bytes: int | None = _field(
        "the highest ``peak_bytes_in_use`` of ``jax.Device.memory_stats()`` over the run's "
        "devices in this process (the allocator's peak since the process started); absent "
        "where the backend reports none (CPU)",
        "bytes",
        omit_if_none=True,
    )


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Event):
    """A checkpoint committed (:class:`titan.checkpoint.checkpointer.Checkpointer`); written once it
    has (for an asynchronous save, after the steps that ran while it was written)."""

    type: ClassVar[str] = "checkpoint"

    step: int = _field("the step saved", "steps", required=True)
    seconds: float | None = _field(
        "time the training loop waited for the save (blocking: the previous save settling and "
        "the copy to host memory; the whole save when synchronous, and for the run's last, "
        "with the pruning of older checkpoints after it)",
        "seconds",
    )
    commit_s: float | None = _field(
        "time from the start of the save until it committed (the pruning after it left out)",
        "seconds",
        omit_if_none=True,
    )
    asynchronous: bool | None = _field(
        "written in the background (``--checkpoint-async``)", omit_if_none=True
    )
    path: str | None = _field("the checkpoint's folder")


@dataclass(frozen=True, kw_only=True)
class Eval(Event):
    """The loss on held-out data after a step (``--eval-every``; :mod:`titan.trainer.evaluation`):
    the model's mean next-token loss over the same ``--eval-batches`` batches of the held-out
    documents (``--eval-data`` or ``--eval-split``) every time, forward passes only."""

    type: ClassVar[str] = "eval"

    step: int = _field("the step after which the model was evaluated", "steps", required=True)
    loss: float = _field(
        "mean cross-entropy over the held-out tokens evaluated (every batch holds as many)",
        "nats",
        required=True,
    )
    perplexity: float | None = _field("exp(loss)")
    tokens: int | None = _field("held-out tokens evaluated (batches x batch size x seq len)")
    batches: int | None = _field("batches evaluated", "batches")
    seconds: float | None = _field(
        "time the training loop spent evaluating (the first evaluation compiles the forward "
        "pass); badput of its own in ETTR",
        "seconds",
    )


@dataclass(frozen=True, kw_only=True)
class LossSpike(Event):
    """A finite loss far above the recent ones (:class:`titan.trainer.guard.LossSpikeDetector`):
    ``loss > mean + sigma x std`` of the finite losses of the ``window`` steps before it
    (``--loss-spike-window``, ``--loss-spike-sigma``). Recorded only; the step was applied."""

    type: ClassVar[str] = "loss_spike"

    step: int = _field("the step whose loss spiked (1-based)", "steps", required=True)
    loss: float = _field("the step's loss", "nats", required=True)
    mean: float | None = _field("mean loss of the window", "nats")
    std: float | None = _field("population standard deviation of the window's losses", "nats")
    threshold: float | None = _field("mean + sigma x std: the loss a spike exceeds", "nats")
    window: int | None = _field("finite losses in the window", "steps")


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed(Event):
    """A save that did not commit (:class:`titan.checkpoint.checkpointer.Checkpointer`): it is not a
    checkpoint, a resume never picks it, and the run goes on."""

    type: ClassVar[str] = "checkpoint_failed"

    step: int = _field("the step whose save failed", "steps", required=True)
    error: str | None = _field("why (``Type: message``, one line)")
    seconds: float | None = _field("time the training loop waited for the save", "seconds")
    commit_s: float | None = _field("time from the start of the save until it failed", "seconds")


@dataclass(frozen=True, kw_only=True)
class CheckpointUnrestorable(Event):
    """A committed checkpoint that a resume could not restore (corrupt, or an incompatible
    layout); the resume used an older one. Written after ``run_start``. The checkpoint is moved
    to ``<run dir>/unrestorable_checkpoints/<step>``, its stage items
    (``stage_checkpoints/<step>``) into its ``stage_checkpoints``."""

    type: ClassVar[str] = "checkpoint_unrestorable"

    step: int = _field("the checkpoint skipped", "steps", required=True)
    error: str | None = _field("why it could not be restored (one line)")


@dataclass(frozen=True, kw_only=True)
class PinnedHost(Event):
    """Pinned host memory reserved for the copies of checkpoint saves, after the run's first
    step and before its first save (:mod:`titan.trainer.loop_hooks.pin_host_hook`; GPUs only,
    where orbax copies a save through it). Growing that memory holds the GPU's other work back,
    so it is done here once, in no step's time, and not during the first save."""

    type: ClassVar[str] = "pinned_host"

    bytes: int = _field(
        "the bytes to reserve: the shards a save copies on this process (all reserved, unless "
        "``error`` or ``stopped``)",
        "bytes",
        required=True,
    )
    seconds: float | None = _field(
        "time the reservation took, in no step's time; checkpoint badput in ETTR", "seconds"
    )
    error: str | None = _field(
        "why the reservation failed (one line); the first save then grows the memory itself",
        omit_if_none=True,
    )
    stopped: bool | None = _field(
        "a stop signal ended the reservation before all of ``bytes`` was reserved (the stop's "
        "save grows the rest)",
        omit_if_none=True,
    )


@dataclass(frozen=True, kw_only=True)
class Profile(Event):
    """One JAX profiler trace of ``--profile-steps A:B`` (:mod:`titan.telemetry.profile`)."""

    type: ClassVar[str] = "profile"

    steps: list[int] | None = _field("[first, last] step traced; None when none was", "steps")
    requested: list[int] | None = _field("[A, B] as asked for", "steps")
    complete: bool | None = _field("every requested step was traced")
    dir: str | None = _field("the trace folder, relative to the run dir")
    files: list[str] | None = _field("the trace files, relative to the run dir")
    seconds: float | None = _field(
        "wall time in ``start_trace`` and ``stop_trace`` (profiler overhead, inside the step "
        "times of steps A - 1 and B)",
        "seconds",
    )
    error: str | None = _field("why the profiler failed", omit_if_none=True)


@dataclass(frozen=True, kw_only=True)
class Stall(Event):
    """The training loop overran a phase's allowance (:mod:`titan.telemetry.watchdog`);
    written from the watchdog thread while the loop is stuck."""

    type: ClassVar[str] = "stall"

    phase: str = _field(
        "the phase that overran (:data:`titan.telemetry.watchdog.PHASES`)", required=True
    )
    elapsed_s: float | None = _field("time spent in the phase when detected", "seconds")
    threshold_s: float | None = _field("the phase's allowance", "seconds")
    step: int | None = _field(
        "the step worked on (1-based; the last completed one outside ``step``)", "steps"
    )
    stacks: list[dict[str, Any]] | None = _field(
        "every thread's Python stack: ``thread`` (name), ``ident``, ``stack`` (formatted frames, "
        "innermost last)"
    )
    process: int | None = _field(
        "the process whose watchdog saw the stall, in a run of several (absent: process 0); "
        "its stacks stay in that process's log",
        omit_if_none=True,
    )

    def where(self) -> str:
        """What overran, in words: ``step 4``, ``the checkpoint save of step 4``, or the phase
        and its step (``eval at step 4``)."""
        step = "?" if self.step is None else self.step
        if self.phase == "checkpoint_save":
            return f"the checkpoint save of step {step}"
        return f"step {step}" if self.phase == "step" else f"{self.phase} at step {step}"


@dataclass(frozen=True, kw_only=True)
class Pipeline(Event):
    """The shape of an MPMD pipeline, once after compilation
    (:meth:`titan.layouts.mpmd.PipelineTrainer.start_events`)."""

    type: ClassVar[str] = "pipeline"

    stages: int = _field("pipeline stages (``--pp``)", "stages", required=True)
    virtual_stages: int | None = _field("model chunks per stage (``--virtual-stages``)")
    devices_per_stage: int | None = _field("devices of each stage", "devices")
    layers_per_chunk: list[int] | None = _field("layers of each model chunk", "layers")
    chunk_stage: list[int] | None = _field("the stage each chunk runs on")
    schedule: str = _field("the schedule's name (``--schedule``)", required=True)
    microbatches: int = _field("microbatches per step", "microbatches", required=True)
    theoretical_bubble: float = _field(
        "idle share of the schedule (:func:`titan.schedules.theoretical_bubble`)",
        "fraction of step time",
        required=True,
    )
    actions: list[list[str]] = _field(
        "the schedule: per stage, its actions in order (e.g. ``F0.1``)", required=True
    )


@dataclass(frozen=True, kw_only=True)
class PipelineTiming(Event):
    """Measured spans of one MPMD step, every ``--timing-every`` steps (that step blocks after
    each action to time it)."""

    type: ClassVar[str] = "pipeline_timing"

    step: int = _field("the step timed (1-based)", "steps", required=True)
    actions: list[list[Any]] = _field(
        "one span per action: ``[stage, chunk, microbatch, kind, start_s, end_s]``, times in "
        "seconds from the step's start",
        required=True,
    )
    step_time_s: float = _field("wall time of the timed step", "seconds", required=True)


@dataclass(frozen=True, kw_only=True)
class RunEnd(Event):
    """The end of an attempt: completed, stopped by a signal (after a checkpoint) or failed.
    A crashed process writes none."""

    type: ClassVar[str] = "run_end"

    status: str = _field("``completed``, ``stopped`` or ``failed``", required=True)
    step: int | None = _field("the last step done; None when it failed before a step", "steps")
    signal: str | None = _field(
        "the signal that stopped the run, e.g. ``SIGTERM``", omit_if_none=True
    )
    error: str | None = _field("what failed (``Type: message``)", omit_if_none=True)
    reason: str | None = _field(
        "why a run failed: ``stall`` (the watchdog ended it), ``nonfinite`` (a non-finite loss or"
        " gradient norm under ``--nonfinite abort``, too many in a row under ``skip``, or "
        "non-finite weights at a save), ``lost_process`` (a process of the run stopped beating, "
        ":mod:`titan.trainer.peers`)",
        omit_if_none=True,
    )
    checkpoint_step: int | None = _field(
        "on a watchdog or non-finite abort: the newest committed checkpoint, the step a resume "
        "continues from (none yet: a resume starts from step 0)",
        "steps",
        omit_if_none=True,
    )
    saved: str | None = _field(
        "on a watchdog abort: whether the abort saved the state (``saved``, ``already saved``) "
        "or why it could not (``not reachable: ...``)",
        omit_if_none=True,
    )


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A line whose ``type`` this module does not know (a newer writer): its keys are in
    :attr:`extra`. Readers skip it."""

    name: str = _field("the line's ``type``", required=True)

    @property
    def type(self) -> str:  # type: ignore[override]
        return self.name

    def to_json(self) -> dict[str, Any]:
        line = {"schema": self.schema, "type": self.name, "time": self.time, "run_id": self.run_id}
        return {**line, **{k: v for k, v in self.extra.items() if k not in line}}


EVENT_TYPES: tuple[type[Event], ...] = (
    RunStart,
    Compile,
    Step,
    Checkpoint,
    Eval,
    LossSpike,
    CheckpointFailed,
    CheckpointUnrestorable,
    PinnedHost,
    Profile,
    Stall,
    Pipeline,
    PipelineTiming,
    RunEnd,
)
_BY_TYPE = {cls.type: cls for cls in EVENT_TYPES}


def parse_event(line: Mapping[str, Any]) -> Event:
    """The event of one line's JSON object, by its ``type`` (:class:`UnknownEvent` for a type
    not in :data:`EVENT_TYPES`).

    Raises:
        EventError: not an object with a string ``type`` and a numeric ``time``, or a required
            field of its type missing or of another type.
    """
    if not isinstance(line, Mapping) or not isinstance(line.get("type"), str):
        raise EventError(f"an event is a JSON object with a string 'type', got {line!r:.80}")
    cls = _BY_TYPE.get(line["type"])
    if cls is None:
        extra = {k: v for k, v in line.items() if k not in _HEADER}
        return UnknownEvent(name=line["type"], extra=extra, **_header(line))
    return cls.from_json(line)


def parse_events(lines: Iterable[Any]) -> tuple[list[Event], int]:
    """(the events of ``lines``, JSON values in file order, by :func:`parse_event`; how many of
    them are not events and were skipped)."""
    events, skipped = [], 0
    for line in lines:
        try:
            events.append(parse_event(line))
        except EventError:
            skipped += 1
    return events, skipped


# --- conversion -------------------------------------------------------------------------------


def _header(line: Mapping[str, Any]) -> dict[str, Any]:
    """``time``, ``run_id`` and ``schema`` of a line (schema 0 when absent).

    Raises:
        EventError: ``time`` is not a number.
    """
    time = _decoder(float)(line.get("time"))
    if time is None:
        got = line.get("time")
        raise EventError(f"{line.get('type')}: 'time' must be a finite number, got {got!r}")
    schema = _decoder(int)(line.get("schema"))
    return {
        "time": time,
        "run_id": _decoder(str)(line.get("run_id")),
        "schema": 0 if schema is None else schema,
    }


def _per_class(function: Callable[[type], _T]) -> Callable[[type], _T]:
    """``functools.cache`` of a function of a class, typed as such (the checker does not take a
    ``type[X]`` for ``Hashable``, the argument type of ``functools.cache``'s wrapper)."""
    return functools.cache(function)


@_per_class
def _payload_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of ``cls`` that are not in every line's header."""
    return tuple(f for f in dataclasses.fields(cls) if f.name not in (*_HEADER, "extra"))


@_per_class
def _payload_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in _payload_fields(cls))


@_per_class
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@_per_class
def _decoders(cls: type) -> tuple[tuple[str, Callable[[Any], Any], bool, Any], ...]:
    """(name, decoder, required, declared type) of each payload field of ``cls``."""
    hints = _hints(cls)
    return tuple(
        (f.name, _decoder(hints[f.name]), _required(f), f.type) for f in _payload_fields(cls)
    )


@_per_class
def _encoding(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, left out when None) of each payload field of ``cls``."""
    return tuple((f.name, bool(f.metadata.get("omit_if_none"))) for f in _payload_fields(cls))


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[__name__]))


def _encode(value: Any) -> Any:
    if value is None or type(value) in _SCALARS:
        return value
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if dataclasses.is_dataclass(value):  # a nested record
        return typing.cast("FlopsPerToken | Mfu", value).to_json()
    return value


def _encode_fields(obj: Any) -> dict[str, Any]:
    """The payload fields of a dataclass as JSON values, without the None ones marked
    ``omit_if_none``."""
    out = {}
    for name, omit_if_none in _encoding(type(obj)):
        value = getattr(obj, name)
        if value is None and omit_if_none:
            continue
        out[name] = _encode(value)
    return out


@functools.cache
def _decoder(hint: Any) -> Callable[[Any], Any]:
    """The function that turns a JSON value into ``hint`` (None when it is None or of another
    type: each decoder below gives None for None), built once per type (the readers
    decode every line of every record: the type is taken apart here, not per value).

    Raises:
        TypeError: ``hint`` is no type a JSON value converts to.
    """
    if hint is Any:
        return lambda value: value
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in args if a is not type(None)]
        return _decoder(inner)
    if hint is float:
        return _float
    if hint is int:
        return _int
    if hint in (str, bool):
        return lambda v: v if isinstance(v, hint) else None
    if origin is dict:
        return lambda v: dict(v) if isinstance(v, Mapping) else None
    if origin is list:
        return _list_decoder(args[0])
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)
    raise TypeError(f"no JSON conversion for {hint!r}")


def _float(value: Any) -> float | None:
    """A JSON number as a float; None for a bool, another type, NaN or an infinity (the writer
    never writes those: :meth:`~titan.telemetry.records.RunRecord.emit` turns them into null,
    so one read here comes from a damaged or foreign record, and would poison every sum)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


# The integers a record holds: JSON bounds none, but DuckDB's BIGINT (``titan summarize``) and
# the metric sinks' steps (TensorBoard's, wandb's) are signed 64-bit.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int(value: Any) -> int | None:
    """A JSON integer (or a float of an integer's value) in the signed 64-bit range; None for a
    bool, another type, or one out of range (a damaged or foreign record's: every reader then
    leaves it out alike)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX else None


def _list_decoder(item: Any) -> Callable[[Any], Any]:
    decode = _decoder(item)

    def decode_list(value: Any) -> list[Any] | None:
        if not isinstance(value, list | tuple):
            return None
        items = [decode(v) for v in value]
        return None if any(i is None for i in items) and item is not Any else items

    return decode_list


def _dataclass_decoder(cls: type) -> Callable[[Any], Any]:
    hints = _hints(cls)
    fields = [(f.name, _decoder(hints[f.name])) for f in dataclasses.fields(cls)]

    def decode_dataclass(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return None
        return cls(**{name: decode(value.get(name)) for name, decode in fields})

    return decode_dataclass


# --- documentation ----------------------------------------------------------------------------


def _md(text: str) -> str:
    """Docstring markup as Markdown: Sphinx roles and double backticks as code, pipes escaped
    (for table cells)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def _doc(cls: type) -> str:
    return _md(" ".join((cls.__doc__ or "").split()))


def _rows(fields: Iterable[dataclasses.Field]) -> list[str]:
    """A Markdown table of ``fields``: name, type, unit, meaning (and when it is required or
    left out)."""
    rows = ["| field | type | unit | meaning |", "|---|---|---|---|"]
    for f in fields:
        kind = str(f.type).replace("|", "\\|")
        meaning = _md(f.metadata.get("doc", ""))
        notes = ["required"] if _required(f) else []
        if f.metadata.get("omit_if_none"):
            notes.append("left out when None")
        if notes:
            meaning += f" ({'; '.join(notes)})"
        rows.append(f"| `{f.name}` | `{kind}` | {f.metadata.get('unit', '')} | {meaning} |")
    return rows


def markdown() -> str:
    """``docs/events.md``: every event type with its fields, types, units and meanings."""
    header = [f for f in dataclasses.fields(Event) if f.name != "extra"]
    lines = [
        "# Run events",
        "",
        "<!-- Generated by `python -m titan.telemetry.events --markdown > docs/events.md`"
        " from the dataclasses of `titan/telemetry/events.py`; do not edit. -->",
        "",
        "A run dir's `events.jsonl` holds one JSON object per line, flushed per event, appended "
        "by `titan.telemetry.records.RunRecord`. Readers parse each line with "
        "`titan.telemetry.events.parse_event`; a torn last line (a writer killed mid-line) "
        "and lines that are not events are skipped, unknown types are ignored, and keys a "
        "reader does not know are kept in `extra`.",
        "",
        f"Current schema version: {SCHEMA_VERSION} (lines without `schema` are version 0 and "
        "read the same way). Non-finite numbers (a diverged loss) are written as `null`; a `step` "
        "event names them in its `nonfinite` field. A reader takes a `NaN` or `Infinity`, or an "
        "integer outside the signed 64-bit range (which only a damaged or foreign record holds), "
        "as a missing value, and a line whose `time` is not a finite number, or whose required "
        "field is missing (a `step` event's `step`), as no event.",
        "",
        "## Every line",
        "",
        "`type` (a string) names the event's section below; every line also has:",
        "",
        *_rows(header),
        "",
    ]
    for cls in EVENT_TYPES:
        lines += [f"## `{cls.type}`", "", _doc(cls), "", *_rows(_payload_fields(cls)), ""]
    for nested in (FlopsPerToken, Mfu):
        lines += [
            f"## `{nested.__name__}` (nested)",
            "",
            _doc(nested),
            "",
            *_rows(dataclasses.fields(nested)),
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m titan.telemetry.events --markdown``: print ``docs/events.md``."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print("usage: python -m titan.telemetry.events --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
