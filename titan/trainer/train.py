"""Training entry: ``titan train``.

The recipe (:func:`train`): resolve options, open the corpus, claim the run dir, prepare the
tokenizer, build the layout and trainer, restore or initialise the state, trace the step (all
validation happens up to here, before anything is written into the run dir), write the run
files, record ``run_start``, compile, loop, checkpoint, record.

Events written to ``events.jsonl``: the types of :mod:`titan.telemetry.events`, documented
in ``docs/events.md`` (``run_start``, ``compile``, ``step``, ``checkpoint``,
``checkpoint_failed``, ``checkpoint_unrestorable``, ``loss_spike``, ``profile``, ``stall``,
``run_end``; ``eval`` with ``--eval-every`` (:mod:`titan.trainer.evaluation`); ``pipeline``
and ``pipeline_timing`` from an MPMD trainer).

Checkpoints (:mod:`titan.trainer.checkpoint`) are asynchronous unless ``--no-checkpoint-async``:
the loop records each save's outcome once it settles and waits for the last one before
``run_end``. Before the state is made or restored, :func:`titan.trainer.memory_check.
check_memory` compares the planner's memory estimate with the devices' usable memory.

The writer claims the run dir first (:mod:`titan.trainer.claim`): a second live run of it is
refused. During start-up a stop signal ends the process with one line and
:data:`EXIT_STOPPED`, before anything is recorded (:mod:`titan.stopping`); once the run has
started SIGTERM, SIGINT and SIGHUP finish the current step, checkpoint, write ``run_end``
``stopped`` and exit with :data:`EXIT_STOPPED` (4; 0 with ``--exit-zero-on-stop``); with
several processes a signal to any of them stops all after the same step
(:class:`titan.parallel.distributed.StopAgreement`). Process 0 alone writes the record; every
process keeps ``processes/<id>.json`` (:mod:`titan.trainer.processes`).
With ``--watchdog-abort 1`` a stall saves the state when it is reachable
(:meth:`_Run.save_on_stall`), writes ``run_end`` ``failed`` and exits with :data:`EXIT_STALL`
(3). A step whose loss or gradient norm is not finite changes nothing on the device; the loop
records it and applies ``--nonfinite`` (:mod:`titan.trainer.guard`): a non-finite abort writes
``run_end`` ``failed`` (reason ``nonfinite``), no checkpoint, and exits with
:data:`EXIT_NONFINITE` (5). No save writes non-finite weights. A failure after ``run_start``
writes ``run_end`` ``failed`` and exits 1; a full disk is one line naming the path
(:func:`titan.telemetry.records.disk_full`), with ``run_end`` written when there is room.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from titan.analysis.liveness import ProcessId, heartbeat_allowance_s
from titan.config import TrainConfig, model_config, trained_vocab_size
from titan.config_files import config_to_data
from titan.data.heldout import split_sources, training_corpus
from titan.data.images import ImageBatches
from titan.data.mixture import (
    Batches,
    Source,
    data_record,
    make_batches,
    open_sources,
)
from titan.data.text import Documents, batch_digest
from titan.data.tokenize import TokenStream, token_stream
from titan.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from titan.errors import TitanError
from titan.exit_codes import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, EXIT_STALL, EXIT_STOPPED
from titan.inert import inert
from titan.ops import Ops
from titan.parallel.distributed import (
    LaunchSettings,
    StopAgreement,
    barrier,
    initialize,
    process_count,
    process_index,
)
from titan.shapes import ModelConfig
from titan.stopping import StopFlag, stopped_at_start
from titan.telemetry.device_memory import peak_bytes
from titan.telemetry.env import capture_environment
from titan.telemetry.events import (
    Checkpoint,
    CheckpointFailed,
    CheckpointUnrestorable,
    Compile,
    RunEnd,
    RunStart,
    Step,
)
from titan.telemetry.mfu import FlopsMeter, device_peak
from titan.telemetry.power import PowerSampler, StepEnergy, open_reader
from titan.telemetry.profile import StepProfiler
from titan.telemetry.records import (
    CONFIG_FILE,
    EVENTS_FILE,
    DiskFull,
    RunRecord,
    default_runs_root,
    disk_full,
    write_json_atomic,
)
from titan.telemetry.sinks import LiveTensorBoard, check_library, live_sink
from titan.telemetry.watchdog import Stall, Watchdog
from titan.trainer.adapters import build_trainer, check_layout_fits
from titan.trainer.checkpoint import (
    CHECKPOINT_DIR,
    Checkpointer,
    SaveResult,
    SaveSchedule,
    Unrestorable,
    initial_state,
)
from titan.trainer.claim import RunClaim, refuse_recorded
from titan.trainer.compilation import CompileWatch, compilation_settings
from titan.trainer.evaluation import Evaluation, open_evaluation
from titan.trainer.guard import (
    FINITE_CHECK_FUNCTION,
    FiniteCheck,
    LossSpikeDetector,
    NonFiniteAbort,
    NonFiniteGuard,
    nonfinite_fields,
    poison_batch,
)
from titan.trainer.images import image_batches
from titan.trainer.memory_check import check_memory
from titan.trainer.peers import PeerWatch, end_for_lost
from titan.trainer.processes import (
    Heartbeat,
    MutedRecord,
    agreed_run_id,
    batch_rows,
    first_then_others,
    is_writer,
    one_tokenizer,
)
from titan.trainer.progress import TrainProgress
from titan.trainer.resume import TOKENIZER_FILE, resume_options
from titan.trainer.step_clock import StepClock
from titan.trainer_state import StepMetrics, Trainer, TrainState

T = TypeVar("T")


def _check_steps_left(cfg: TrainConfig, latest: int | None) -> None:
    """Refuse a resume that has nothing to train (``--steps`` is the run's total)."""
    steps = cfg.optimizer.steps
    if latest is not None and steps <= latest:
        raise TitanError(
            f"--steps {steps} leaves nothing to train: the run's last checkpoint is at step "
            f"{latest} (--steps is the run's total; give more to continue)"
        )


def _resumed_checkpointer(cfg: TrainConfig, run_dir: Path) -> Checkpointer:
    """The checkpoints of a run being resumed, refused in one line when they cannot be read.

    Raises:
        TitanError: ``checkpoints`` is not a directory, or orbax cannot list it.
    """
    directory = run_dir / CHECKPOINT_DIR
    if directory.exists() and not directory.is_dir():
        raise TitanError(f"--resume {run_dir}: {directory} is not a directory")
    try:
        return _checkpointer(cfg, run_dir)
    except (OSError, ValueError) as err:
        raise TitanError(
            f"--resume {run_dir}: cannot read {directory} ({_first_line(err)})"
        ) from None


def _schedule_text(cfg: TrainConfig) -> str:
    """``to step 30; learning rate: cosine to 3.00e-04 at step 20, then constant``."""
    opt = cfg.optimizer
    horizon = opt.decay_steps or opt.steps
    after = ", then constant" if opt.steps > horizon else ""
    return (
        f"to step {opt.steps}; learning rate: cosine to {opt.lr * opt.min_lr_ratio:.2e} at step "
        f"{horizon}{after} (--decay-steps sets where the decay ends)"
    )


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _tokenizer(
    cfg: TrainConfig, corpus: Documents, resume_dir: Path | None, progress: Callable[[int], None]
) -> Tokenizer:
    if resume_dir is not None:
        return load_tokenizer(resume_dir / TOKENIZER_FILE)
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    return train_tokenizer(corpus, trained_vocab_size(cfg), progress)


def _run_dir(cfg: TrainConfig, resuming: bool) -> Path:
    root = default_runs_root(cfg.run.runs_root)
    if root.exists() and not root.is_dir():
        raise TitanError(f"--runs-root {root} is not a directory")
    run_dir = root / (cfg.run.run_id or agreed_run_id(cfg.model.shape.name))
    if not resuming:
        refuse_recorded(run_dir)  # early, on every process; the writer's claim checks again
    return run_dir


def _write_run_files(
    run_dir: Path, cfg: TrainConfig, model: ModelConfig, files: dict[str, bytes]
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {"train": config_to_data(cfg), "model": model.record()}
    write_json_atomic(run_dir / CONFIG_FILE, payload)
    for name, content in files.items():
        (run_dir / name).write_bytes(content)


def train_from_cli(
    explicit: dict[str, Any],
    resume: str | None,
    launch: LaunchSettings | None = None,
    stop: StopFlag | None = None,
) -> int:
    """``titan train``: options from the command line (only those given), optional resume dir,
    how this process joins a run of several (:mod:`titan.parallel.distributed`), and the stop
    flag installed when the command started (:mod:`titan.stopping`).

    Returns:
        Exit code (:mod:`titan.exit_codes`): 0 completed, 4 stopped (0 with
        ``--exit-zero-on-stop``), 1 failed, 3 a watchdog abort, 5 a non-finite abort. Raises
        TitanError for bad input.
    """
    resume_dir = Path(resume) if resume else None
    cfg = resume_options(resume_dir, explicit) if resume_dir else TrainConfig.of(**explicit)
    initialize(launch or LaunchSettings())
    return train(cfg, resume_dir, stop)


def train(cfg: TrainConfig, resume_dir: Path | None = None, stop: StopFlag | None = None) -> int:
    """Train per ``cfg``; continue the run in ``resume_dir`` when given. Returns the exit code.

    JAX's persistent compilation cache (``--compilation-cache``) and the watch on repeated
    compilations hold for the run (:mod:`titan.trainer.compilation`).

    Nothing in the run dir changes before the state is restored and the step traced: a start-up
    that fails or is stopped by a signal leaves a resumed run's record byte-identical, and
    removes the dir of a fresh run (:class:`titan.trainer.claim.RunClaim`).

    Args:
        stop: the stop flag (:mod:`titan.stopping`), installed here if not given.

    Raises:
        TitanError: bad input found before the run starts (before ``run_start``), or another
            live process holds the run dir (:mod:`titan.trainer.claim`).
    """
    stop = stop or StopFlag()
    stop.debug_signal_in = cfg.debugging.debug_signal_in
    stop.install()
    progress = TrainProgress(cfg.optimizer.steps, cfg.observability.log_every)
    try:
        with stop.during("scan"):
            sources = held_out = None  # a diffusion run reads images (titan.trainer.images)
            if cfg.model.task == "lm":
                sources = open_sources(cfg.data.corpus, cfg.data.text_field)
                sources, held_out = split_sources(
                    cfg.data.corpus, sources, cfg.data.eval_data, cfg.data.eval_split
                )
            check_library(cfg.observability.metrics)
            idle = check_layout_fits(cfg)  # before the tokenizer, which may take minutes
            if idle and is_writer():
                print(f"titan: {idle}", flush=True)  # beside the progress lines
        run_dir = _run_dir(cfg, resuming=resume_dir is not None)
        # Claimed before anything slow (the tokenizer): a second run of this dir is refused at
        # once.
        with RunClaim(run_dir, fresh=resume_dir is None, enabled=is_writer()) as claim:
            return _train_claimed(
                cfg, resume_dir, run_dir, claim, progress, (sources, held_out), stop
            )
    except BaseException:
        if not stop.requested or stop.running:
            raise
        # A signal during start-up; a native library may have turned it into its own error.
        progress.close()
        return stopped_at_start(stop, cfg.run.exit_zero_on_stop, resume_dir is not None)
    finally:
        stop.uninstall()


def _train_claimed(
    cfg: TrainConfig,
    resume_dir: Path | None,
    run_dir: Path,
    claim: RunClaim,
    progress: TrainProgress,
    corpora: tuple[list[Source] | None, Documents | None],
    stop: StopFlag,
) -> int:
    """:func:`train` once this process holds the run dir (or is not its writer); ``corpora``:
    the ``--data`` parts to train on and the held-out data (:func:`titan.data.heldout.
    split_sources`), None for a diffusion run."""
    with (
        compilation_settings(cfg.compute.compilation_cache) as cache,
        CompileWatch(frozenset({FINITE_CHECK_FUNCTION})) as compiles,
    ):
        args = (cfg, resume_dir, run_dir, claim, progress, corpora, stop)
        return _train_compiling(*args, cache, compiles)


def _train_compiling(
    cfg: TrainConfig,
    resume_dir: Path | None,
    run_dir: Path,
    claim: RunClaim,
    progress: TrainProgress,
    corpora: tuple[list[Source] | None, Documents | None],
    stop: StopFlag,
    cache: Path | None,
    compiles: CompileWatch,
) -> int:
    """:func:`_train_claimed` in its compilation settings (``cache``: the cache folder, or
    None; ``compiles``: the watch on repeated compilations)."""
    import jax

    checkpointer = None  # made after the checks of a fresh run: it creates its directory
    if resume_dir is not None:
        checkpointer = _resumed_checkpointer(cfg, run_dir)
        _check_steps_left(cfg, checkpointer.latest_step())
    if cfg.model.task == "diffusion":
        data = _image_data(cfg, stop)
    else:
        sources, held_out = corpora
        assert sources is not None  # train scanned the --data of an lm run
        data = _text_data(cfg, (sources, held_out), resume_dir, progress, stop)
    model_cfg, ops, trainer, batches = data.model, data.ops, data.trainer, data.batches
    batches.rows = batch_rows(trainer, cfg.data.batch_size)

    run_devices = jax.devices()[: trainer.describe().devices]
    power_reader, power_info = open_reader(devices=run_devices)
    run = _Run(
        cfg,
        run_dir,
        trainer,
        batches,
        checkpointer or _checkpointer(cfg, run_dir),
        stop,
        progress,
        _flops_meter(trainer),
        PowerSampler(power_reader),
        [d for d in run_devices if d.process_index == jax.process_index()],
        data.tokens_per_row,
        data.images,
        data.evaluation,
        compiles,
    )
    run.start_monitors()
    started = False
    try:
        with stop.during("trace"):  # checked before the state takes any memory
            trainer.trace()
            memory = check_memory(
                cfg,
                model_cfg,
                trainer.describe().devices,
                str(trainer.compute_dtype),
                ops.served,
                run.local_devices,
            )
        with stop.during("restore"):
            state, start_step = run.restore_or_init(resume_dir is not None)
        run.watchdog.enter("compile", start_step)
        stop.start()  # from here a signal stops the run after a step, with a checkpoint
        run.begin(model_cfg, data.files)
        run.record.emit(
            RunStart(
                **_run_start_fields(cfg, model_cfg, trainer, ops, data.record),
                start_step=start_step,
                total_steps=cfg.optimizer.steps,
                # checkpoints are never of step 0: a resume without one starts fresh
                resumed_from_step=start_step if resume_dir and start_step else None,
                power=power_info,
                memory_check=memory.record(),
            )
        )
        started = claim.recorded = True
        if resume_dir and start_step:  # said once the run is recorded: a refusal stays one line
            print(f"titan: resuming from step {start_step}: {_schedule_text(cfg)}", file=sys.stderr)
        for skipped in run.unrestorable:
            run.record.emit(CheckpointUnrestorable(step=skipped.step, error=skipped.error))
        run.checkpointer.set_aside([skipped.step for skipped in run.unrestorable])
        with progress.status("compiling the train step"):
            compiled = [*_compile(trainer, cache, compiles), *run.finite_check.compile(state)]
        for event in [*compiled, *trainer.start_events()]:
            run.record.emit(event)
        with run.profiler:  # closes a trace left open by a stop signal or an error
            step, status = run.loop(state, start_step)
        run.record.emit(RunEnd(status=status, step=step, signal=run.stop.signal_name or None))
        run.beating.close(status, step)
    except NonFiniteAbort as err:
        run.end_nonfinite(err)
        return EXIT_NONFINITE
    except Exception as err:  # noqa: BLE001 - every failure must reach the run record
        if not started:
            raise  # before run_start nothing is recorded; the claim removes a fresh run's dir
        return run.fail(err)
    finally:
        run.stop_monitors()
        run.close()
        progress.close()
    # No process leaves before the writer has closed the record: a stop's non-zero code must not
    # let srun --kill-on-bad-exit end process 0 before its run_end.
    barrier("titan:run-end")
    progress.finish(status, step, run_dir)
    return _exit_code(cfg, status)


def _compile(trainer: Trainer, cache: Path | None, compiles: CompileWatch) -> list[Compile]:
    """The trainer's compile events, the first with the cache folder and the programs loaded
    from it meanwhile."""
    hits = compiles.cache_hits
    events = trainer.compile()
    if events and cache is not None:
        loaded = compiles.cache_hits - hits
        events[0] = dataclasses.replace(events[0], cache_dir=str(cache), cache_hits=loaded)
    return events


@dataclass(frozen=True)
class _RunData:
    """What a task's data gives the run: the model shape and its trainer, the batches, the run
    files beside ``config.json``, the ``tokenizer``/``data`` sections of ``run_start``, tokens
    per batch row and whether rows are images (``step`` events' ``images_per_s``)."""

    model: ModelConfig
    ops: Ops
    trainer: Trainer
    batches: Batches | ImageBatches
    files: dict[str, bytes]
    record: dict[str, Any]
    tokens_per_row: int
    images: bool = False
    evaluation: Evaluation | None = None  # --eval-every


def _build(cfg: TrainConfig, model_cfg: ModelConfig, stop: StopFlag) -> tuple[Ops, Trainer]:
    import jax

    with stop.during("build"):
        ops = Ops(jax.default_backend(), cfg.compute.ops)
        return ops, build_trainer(cfg, model_cfg, ops)


def _text_data(
    cfg: TrainConfig,
    corpora: tuple[list[Source], Documents | None],
    resume_dir: Path | None,
    progress: TrainProgress,
    stop: StopFlag,
) -> _RunData:
    """The tokenizer (trained, loaded or the resumed run's), the model, the token streams of the
    ``--data`` parts, and the evaluation of the held-out corpus
    (:func:`titan.data.heldout.split_sources`)."""
    sources, held_out = corpora
    with progress.status("preparing the tokenizer"), stop.during("tokenizer") as tick:
        corpus = training_corpus(cfg.data.corpus, sources)
        tokenizer = one_tokenizer(lambda: _tokenizer(cfg, corpus, resume_dir, tick))
    ops, trainer = _build(cfg, model_config(cfg, tokenizer.vocab_size), stop)
    model_cfg = trainer.adapter.config  # the shape the family built (MaxText's own)
    with stop.during("tokenize") as tick:
        streams = first_then_others(
            "titan:tokens",
            lambda: progress.tokenize(
                lambda report: _streams(cfg, sources, tokenizer, report, tick)
            ),
        )
    batches = make_batches(
        sources, streams, cfg.data.seq_len, cfg.data.batch_size, cfg.run.seed, tokenizer.bos_id
    )
    with stop.during("tokenize") as tick:
        evaluation = open_evaluation(cfg, held_out, tokenizer, trainer, tick)
    data = data_record(cfg.data.corpus, sources, streams, batches)
    if evaluation:
        data["eval"] = evaluation.describe()
    record = {
        "tokenizer": {
            "vocab_size": tokenizer.vocab_size,
            "source": cfg.data.tokenizer or "trained",
        },
        "data": data,
    }
    files = {TOKENIZER_FILE: tokenizer.model_proto}
    return _RunData(
        model_cfg, ops, trainer, batches, files, record, cfg.data.seq_len, False, evaluation
    )


def _image_data(cfg: TrainConfig, stop: StopFlag) -> _RunData:
    """The images of a diffusion run, its DiT and batches (:mod:`titan.trainer.images`)."""
    with stop.during("scan"):
        model_cfg, batches = image_batches(cfg)
    ops, trainer = _build(cfg, model_cfg, stop)
    record = {"tokenizer": None, "data": batches.data.record()}
    return _RunData(model_cfg, ops, trainer, batches, {}, record, model_cfg.patches, True)


def _checkpointer(cfg: TrainConfig, run_dir: Path) -> Checkpointer:
    options = cfg.checkpoint
    return Checkpointer(
        run_dir, options.checkpoint_keep, options.checkpoint_keep_every, options.checkpoint_async
    )


def _streams(
    cfg: TrainConfig,
    sources: list[Source],
    tokenizer: Tokenizer,
    report: Callable[[Any], None],
    tick: Callable[..., None],
) -> list[TokenStream]:
    """Each source's token stream (tokenized with ``--data-workers`` workers, or cached)."""
    workers = cfg.data.data_workers or os.cpu_count() or 1
    return [
        token_stream(source.corpus, tokenizer, _both(report, tick), workers) for source in sources
    ]


def _both(first: Callable[[T], None], second: Callable[..., None]) -> Callable[[T], None]:
    """A progress callback that reports to ``first`` and then ``second``."""

    def report(done: T) -> None:
        first(done)
        second(done)

    return report


def _open_record(run_dir: Path) -> RunRecord:
    """The run's record, opened for appending.

    Raises:
        TitanError: ``events.jsonl`` cannot be opened (a directory there, no permission).
    """
    try:
        return RunRecord(run_dir, run_dir.name)
    except OSError as err:
        path = run_dir / EVENTS_FILE
        raise TitanError(f"cannot write the run record {path}: {err.strerror or err}") from None


def _exit_code(cfg: TrainConfig, status: str) -> int:
    """:data:`EXIT_STOPPED` for a stopped run (0 with ``--exit-zero-on-stop``), else 0."""
    if status == "stopped" and not cfg.run.exit_zero_on_stop:
        return EXIT_STOPPED
    return EXIT_OK


def _flops_meter(trainer: Trainer) -> FlopsMeter:
    """MFU against the peak of the devices the layout uses (not every visible device)."""
    import jax

    kinds = [d.device_kind for d in jax.devices()]
    peak = device_peak(kinds, trainer.describe().devices, str(trainer.compute_dtype))
    return FlopsMeter(*trainer.adapter.token_flops(), peak)


def _run_start_fields(
    cfg: TrainConfig, model_cfg: ModelConfig, trainer: Trainer, ops: Ops, data: dict[str, Any]
) -> dict[str, Any]:
    return {
        "config": cfg.record(),
        "model": model_cfg.record(),
        "model_source": trainer.adapter.describe(),
        "param_count": trainer.adapter.param_count(),
        "layout": trainer.describe().to_json(),
        "compute_dtype": str(trainer.compute_dtype),
        "ops": ops.served,
        "env": capture_environment(),
        **data,
        "processes": process_count(),
        "process": ProcessId.current(process_index()).as_dict(),
    }


_Dispatched = tuple[int, StepMetrics, np.ndarray, int, dict, Future[float]]  # _Run._report's


@dataclass
class _Run:
    """The pieces of a run the loop works with. Until :meth:`begin` its record is a
    :class:`MutedRecord` (a stall during restore or trace is said, not recorded) and nothing is
    written in the run dir."""

    cfg: TrainConfig
    run_dir: Path
    trainer: Trainer
    batches: Batches | ImageBatches
    checkpointer: Checkpointer
    stop: StopFlag
    progress: TrainProgress
    flops: FlopsMeter
    power: PowerSampler
    local_devices: list  # the run's devices in this process (memory readings)
    tokens_per_row: int  # tokens of a batch row: --seq-len, or a DiT's patches per image
    images: bool = False  # rows are images: step events carry images_per_s
    evaluation: Evaluation | None = None  # --eval-every
    compiles: CompileWatch | None = None  # functions compiled again: compile events
    record: RunRecord = dataclasses.field(init=False)
    heartbeat: Heartbeat | None = dataclasses.field(init=False, default=None)
    metrics: LiveTensorBoard | None = dataclasses.field(init=False, default=None)
    finite_check: FiniteCheck = dataclasses.field(init=False, default_factory=FiniteCheck)

    def __post_init__(self) -> None:
        self.record = MutedRecord(self.run_dir, self.run_dir.name)
        self.agreement = StopAgreement(lambda: self.stop.requested)
        checkpoint = self.cfg.checkpoint
        self.saves = SaveSchedule(
            checkpoint.checkpoint_every, checkpoint.checkpoint_every_s, process_count()
        )
        self.unrestorable: list[Unrestorable] = []
        obs = self.cfg.observability
        self.watchdog = Watchdog(obs.watchdog_floor, obs.watchdog_factor, self.on_stall)
        opt = self.cfg.optimizer
        self.guard = NonFiniteGuard(opt.nonfinite, opt.nonfinite_patience)
        self.spikes = LossSpikeDetector(obs.loss_spike_window, obs.loss_spike_sigma)
        # Held while a step donates the state or a save reads it: the watchdog thread saves
        # only when it can take it at once (the loop is stuck elsewhere).
        self._dispatch = threading.Lock()
        # (state, its data position, its step's finite flag on the device; None before the
        # first step): the newest state.
        self._newest: tuple[TrainState, int, Any] | None = None
        # The last step dispatched, its metrics not read yet: _report's arguments.
        self._pending: _Dispatched | None = None
        self._saved_step: int | None = None
        self.peers: PeerWatch | None = None  # started by begin(), with the heartbeat
        # The last step with a step event: what run_end's step says (the step in flight when
        # the watchdog aborts was never recorded).
        self.recorded_step: int | None = None

    @property
    def beating(self) -> Heartbeat:
        """The heartbeat, which :meth:`begin` starts (before ``run_start``)."""
        assert self.heartbeat is not None, "the heartbeat starts in begin()"
        return self.heartbeat

    def begin(self, model_cfg: ModelConfig, files: dict[str, bytes]) -> None:
        """Open the record and write the run files (``config.json``, the tokenizer of a text
        run, the heartbeats): the first writes into the run dir, once the state is restored and
        the step traced.

        Raises:
            TitanError: ``events.jsonl`` cannot be opened for appending.
        """
        if is_writer():
            record = _open_record(self.run_dir)
            _write_run_files(self.run_dir, self.cfg, model_cfg, files)
            self.record = record
            self.metrics = live_sink(self.cfg.observability.metrics, self.run_dir)
        barrier("titan:run-files")  # then the others write their heartbeats there
        self.heartbeat = Heartbeat(self.run_dir)
        self.heartbeat.start()
        self.profiler = StepProfiler(self.cfg.observability.profile_steps, self.record)
        after_s = heartbeat_allowance_s(self.cfg.observability.watchdog_floor)
        self.peers = PeerWatch(self.run_dir, self.heartbeat, self.record, after_s, self.on_lost)
        self.peers.start()

    def fail(self, err: Exception) -> int:
        """Say and record a failure after ``run_start`` (``run_end`` ``failed``, as far as the
        disk allows); returns :data:`EXIT_FAILED`. A full disk is one line naming the path."""
        if self.peers is not None:
            self.peers.settle()  # a peer killed mid-collective: record it, not the symptom
        full = disk_full(err)
        if full is None:
            traceback.print_exc()
        else:
            print(f"titan train: error: {full}", file=sys.stderr, flush=True)
        error = full or f"{type(err).__name__}: {err}"
        with contextlib.suppress(OSError):
            self.record.emit(RunEnd(status="failed", step=None, error=error))
        with contextlib.suppress(OSError):
            self.beating.close("failed", None)
        return EXIT_FAILED

    def close(self) -> None:
        """Close the checkpointer and the record (after a full disk too)."""
        try:
            self.checkpointer.close()
        except Exception as err:  # noqa: BLE001 - a failed last save was said already
            if disk_full(err) is None:
                raise
        finally:
            self.record.close()

    def start_monitors(self) -> None:
        """Start the stall watchdog and the power sampler (background threads; the watch of the
        other processes and the heartbeat start in :meth:`begin`)."""
        self.watchdog.start()
        self.power.start()

    def stop_monitors(self) -> None:
        self.watchdog.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self.power.stop()
        if self.peers is not None:
            self.peers.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def on_lost(self, lost: list) -> None:
        """A process of the run stopped beating: end this one (:mod:`titan.trainer.peers`)."""
        end_for_lost(self.record.run_dir, self.record, self.beating, lost, EXIT_FAILED)

    def on_stall(self, stall: Stall) -> None:
        """Record a stall (on the watchdog thread, while the main thread is stuck); with
        ``--watchdog-abort 1`` save the state when it is reachable (:meth:`save_on_stall`), then
        end the process with :data:`EXIT_STALL` without unwinding the stuck thread. Another
        process's stall reaches the record through its heartbeat (:mod:`titan.trainer.peers`)."""
        self.record.emit(stall)
        if self.heartbeat is not None:
            self.heartbeat.stalled(stall)
        print(
            f"titan: stall: {stall.phase} of step {stall.step} has taken {stall.elapsed_s:.1f} s "
            f"(allowance {stall.threshold_s:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        if not self.cfg.observability.watchdog_abort:
            return
        saved = self.save_on_stall()
        with contextlib.suppress(Exception):  # a save in flight commits before the exit
            self.record_saves(self.checkpointer.wait())
        self.record.emit(
            RunEnd(
                status="failed",
                step=self.recorded_step,
                reason="stall",
                error=f"stalled in {stall.phase} for {stall.elapsed_s:.1f} s",
                checkpoint_step=self.checkpointer.latest_step(),
                saved=saved,
            )
        )
        self.record.close()
        os._exit(EXIT_STALL)

    def save_on_stall(self) -> str:
        """Save the newest state from the watchdog thread when that is safe, and say what
        happened (``RunEnd.saved``). Safe means: one process (a save is collective), the loop
        is not inside a step dispatch (which donates the state) or a save (the lock is free at
        once), the state and its step's metrics are computed (``is_ready``, so a hung device
        cannot hang the save), its step is known finite, and its weights are finite. The step's
        unread metrics are recorded first (its ``step`` event, step time up to now), and the
        data position saved is the one taken with the state after its step, not the loader's
        live one."""
        import jax

        if process_count() > 1:
            return "not reachable: a save needs every process, and only this one is stopping"
        if self._newest is None:
            return "nothing to save: the loop has not started"
        if not self._dispatch.acquire(blocking=False):
            return "not reachable: the loop is stuck inside a step dispatch or a save"
        try:
            state, position, finite = self._newest
            if state.step == self._saved_step:
                return "already saved" if state.step else "nothing to save: no step done"
            pending, self._pending = self._pending, None
            arrays = jax.tree.leaves((state, finite, pending and pending[1]))
            if not all(leaf.is_ready() for leaf in arrays):
                return f"not reachable: the device has not finished step {state.step}"
            if not bool(finite):
                return f"not saved: step {state.step} was not finite"
            if pending is not None:
                self._report(*pending)  # the step's event comes before its checkpoint's
            self.save(state, position)
            self.record_saves(self.checkpointer.wait())  # committed before the process ends
            return "saved"
        except NonFiniteAbort as err:
            return f"not saved: {err}"
        except Exception as err:  # noqa: BLE001 - the abort must go on to its run_end and exit
            return f"not saved: {type(err).__name__}: {err}"
        finally:
            self._dispatch.release()

    def end_nonfinite(self, err: NonFiniteAbort) -> None:
        """Record a non-finite abort: one line on stderr and ``run_end`` ``failed`` (reason
        ``nonfinite``) naming the newest committed checkpoint, which holds finite weights (a save
        still in flight is waited for first)."""
        with contextlib.suppress(DiskFull):
            self.record_saves(self.checkpointer.wait())
        latest = self.checkpointer.latest_step()
        kept = "none (a resume starts from step 0)" if latest is None else f"step {latest}"
        print(f"titan: non-finite: {err}; the last checkpoint is {kept}", file=sys.stderr)
        self.record.emit(
            RunEnd(
                status="failed",
                step=err.step,
                reason="nonfinite",
                error=f"{type(err).__name__}: {err}",
                checkpoint_step=latest,
            )
        )
        self.beating.close("failed", err.step)

    def restore_or_init(self, resuming: bool) -> tuple[TrainState, int]:
        """(state, step): the latest checkpoint's when resuming and one exists, else fresh.

        Raises:
            TitanError: the latest checkpoint cannot be read or restored onto this layout, or
                the corpus changed since it was written.
        """
        self.watchdog.enter("checkpoint_restore", 0)
        restored = self.checkpointer.restore_latest(self.trainer) if resuming else None
        if restored is None:
            if resuming:
                print(
                    "titan: --resume: the run has no committed checkpoint; starting from step 0",
                    file=sys.stderr,
                    flush=True,
                )
            return initial_state(self.trainer, self.cfg.run.seed, self.cfg.checkpoint.init_from), 0
        state, meta, self.unrestorable = restored
        for skipped in self.unrestorable:
            print(
                f"titan: checkpoint {skipped.step} cannot be restored ({inert(skipped.error)}); "
                "resuming from the one before it",
                file=sys.stderr,
                flush=True,
            )
        latest = state.step
        try:
            saved_sequences, position = meta["num_sequences"], meta["data_position"]
        except (KeyError, TypeError) as err:  # a hand-edited meta
            raise TitanError(
                f"--resume: checkpoint {latest} ({self.checkpointer.path(latest)}) cannot be "
                f"read: {type(err).__name__}: {_first_line(err)}"
            ) from None
        if saved_sequences != self.batches.num_sequences:
            raise TitanError(
                f"--resume: the corpus changed since the checkpoint ({saved_sequences} "
                f"sequences then, {self.batches.num_sequences} now)"
            )
        self.batches.position = position
        return state, latest

    def save(self, state: TrainState, position: int) -> None:
        """Save ``state`` with the data position after its step (``position``), unless its
        weights are not finite.

        Raises:
            NonFiniteAbort: a parameter or optimizer moment is not finite (nothing is written).
        """
        step = state.step
        self.watchdog.enter("checkpoint_save", step)
        finite, recompiled = self.finite_check(state)
        for event in recompiled:
            self.record.emit(event)
        if not finite:
            raise NonFiniteAbort(step, f"step {step}: non-finite weights (nothing saved)")
        meta = {
            "data_position": position,
            "num_sequences": self.batches.num_sequences,
            "layout": self.trainer.describe().to_json(),
        }
        self.record_saves(self.checkpointer.save(state, meta))
        self.saves.restart()
        self._saved_step = step

    def record_saves(self, results: list[SaveResult]) -> None:
        """A ``checkpoint`` event per committed save, a ``checkpoint_failed`` event and a line
        on stderr per failed one.

        Raises:
            DiskFull: a save found the disk full (after its ``checkpoint_failed`` event): the
                run ends, with one line (:meth:`fail`).
        """
        for r in results:
            if r.error is None:
                path = str(self.checkpointer.path(r.step))
                asynchronous = self.checkpointer.asynchronous or None
                self.record.emit(
                    Checkpoint(
                        step=r.step,
                        seconds=r.blocking_s,
                        commit_s=r.commit_s,
                        asynchronous=asynchronous,
                        path=path,
                    )
                )
                continue
            self.record.emit(
                CheckpointFailed(
                    step=r.step, error=r.error, seconds=r.blocking_s, commit_s=r.commit_s
                )
            )
            if r.disk_full:
                raise DiskFull(r.error)
            print(
                f"titan: checkpoint {r.step} failed and is not committed: {inert(r.error)}",
                file=sys.stderr,
                flush=True,
            )

    def loop(self, state: TrainState, step: int) -> tuple[int, str]:
        """Train until ``--steps`` or a stop signal. Metrics are read one step late so the
        host never waits on the device before dispatching the next step.

        Returns:
            (last step done, ``completed`` or ``stopped``).
        """
        self._saved_step = self.recorded_step = step  # restored or initialised: no save needed
        self._newest = (state, self.batches.position, None)
        self.clock = StepClock()
        self.energy = StepEnergy(self.power)
        self.saves.restart()
        try:
            step = self._steps(state, step)
        finally:  # no clock thread left waiting on the device when the loop fails
            self.clock.close()
        if step != self._saved_step:
            self._save_newest()
        self.watchdog.enter("checkpoint_save", step)
        self.record_saves(self.checkpointer.wait())  # the last save commits before run_end
        self.watchdog.enter("idle", step)
        return step, "stopped" if self.agreement.agreed else "completed"

    def _steps(self, state: TrainState, step: int) -> int:
        """The steps of :meth:`loop` from ``step``, each reported one step late. Returns the
        last step done."""
        while step < self.cfg.optimizer.steps and not self.agreement.stop_before(step):
            self.profiler.step_starts(step + 1)
            self.watchdog.enter("data_wait", step + 1)
            batch, ids = self.batches.next_batch()
            self.watchdog.enter("step", step + 1)
            if step + 1 == self.cfg.debugging.debug_stall_at_step:
                self._debug_stall()
            if step + 1 == self.cfg.debugging.debug_nonfinite_at_step:
                batch = poison_batch(batch)
            if self._pending and self.trainer.next_step_blocks():
                # a blocking step must not count in the previous one
                self._report(*self._pending)
                self._pending = None
            with self._dispatch:  # the newest state and its unread metrics change together
                state, metrics = self.trainer.step(state, batch)
                step += 1
                position = self.batches.position
                self._newest = (state, position, metrics["finite"])
                fields = self.trainer.step_fields()
                end = self.clock.dispatched(metrics)
                previous = self._pending
                self._pending = (step, metrics, ids, position, fields, end)
            self.agreement.contribute(step)
            if previous:
                self._report(*previous)
            self.profiler.step_done(step, state)
            self.record_saves(self.checkpointer.results())
            for event in self.compiles.drain() if self.compiles else []:
                self.record.emit(event)
            if self.saves.due(step):
                if self._pending:  # a non-finite abort raises here, before the save
                    self._report(*self._pending)
                    self._pending = None
                self._save_newest()
            if self.evaluation and self.evaluation.due(step):
                self._evaluate(state, step)
        if self._pending and self._newest:  # the last step ends when its new state is ready
            self._report(*self._pending, also=self._newest[0])
        return step

    def _evaluate(self, state: TrainState, step: int) -> None:
        """Record the ``eval`` event of ``state`` after ``step`` (its ``step`` event first); the
        next step's time starts after it, so evaluation is in no step's time."""
        if self._pending:
            self._report(*self._pending)
            self._pending = None
        self.watchdog.enter("eval", step)
        assert self.evaluation is not None  # the loop evaluates with --eval-every only
        self.progress.eval(self.record.emit(self.evaluation.run(state, step)))
        self.clock.restart()

    def _save_newest(self) -> None:
        """Save the newest state from the loop (holding the dispatch lock, so that the
        watchdog thread does not save it at the same time)."""
        with self._dispatch:
            assert self._newest is not None  # saved after a step
            state, position, _ = self._newest
            self.save(state, position)

    def _debug_stall(self) -> None:
        """``--debug-stall-at-step``: hang here (a testing aid for the watchdog) until a stop
        signal arrives or the watchdog aborts the process."""
        while not self.stop.requested:
            time.sleep(0.1)

    def _report(
        self,
        step: int,
        metrics: StepMetrics,
        ids: np.ndarray,
        position: int,
        fields: dict,
        end: Future[float],
        also: Any = None,
    ) -> None:
        import jax

        values = {key: float(value) for key, value in jax.device_get(metrics).items()}
        finite = bool(values.pop("finite"))
        nonfinite = nonfinite_fields(values)
        step_time_s = self.clock.step_time_s(end, also)
        self.watchdog.step_done(step_time_s)
        self.beating.beat(step)
        self.recorded_step = step
        tokens = self.cfg.data.batch_size * self.tokens_per_row
        images_per_s = self.cfg.data.batch_size / step_time_s if self.images else None
        event = self.record.emit(
            Step.from_fields(
                step=step,
                **values,
                tokens=tokens,
                tokens_seen=step * tokens,
                step_time_s=step_time_s,
                tokens_per_s=tokens / step_time_s,
                images_per_s=images_per_s,
                data_position=position,
                batch_digest=batch_digest(ids),
                **self.flops.step_fields(tokens / step_time_s),
                **self.energy.step_fields(tokens),
                nonfinite=nonfinite or None,
                skipped=None if finite else True,
                peak_memory_bytes=peak_bytes(self.local_devices),
                **fields,
            )
        )
        self.progress.step(event)
        for layout_event in self.trainer.drain_events():
            self.record.emit(layout_event)
        spike = self.spikes.observe(step, values["loss"])
        if spike is not None:
            self.record.emit(spike)
        self.guard.check(step, finite, nonfinite)
