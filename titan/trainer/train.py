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
(:meth:`titan.trainer.loop.TrainLoop.save_on_stall`), writes ``run_end`` ``failed`` and exits
with :data:`EXIT_STALL` (3). A step whose loss or gradient norm is not finite changes nothing on
the device; the loop records it and applies ``--nonfinite`` (:mod:`titan.trainer.guard`): a
non-finite abort writes ``run_end`` ``failed`` (reason ``nonfinite``), no checkpoint, and exits
with :data:`EXIT_NONFINITE` (5). No save writes non-finite weights. A failure after
``run_start`` writes ``run_end`` ``failed`` and exits 1; a full disk is one line naming the path
(:func:`titan.telemetry.records.disk_full`), with ``run_end`` written when there is room.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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
from titan.data.text import Documents
from titan.data.tokenize import TokenStream, token_stream
from titan.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from titan.errors import TitanError
from titan.exit_codes import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, EXIT_STOPPED
from titan.inert import inert
from titan.ops import Ops
from titan.parallel.distributed import (
    LaunchSettings,
    barrier,
    initialize,
    process_count,
    process_index,
)
from titan.shapes import ModelConfig
from titan.stopping import StopFlag, stopped_at_start
from titan.telemetry.env import capture_environment
from titan.telemetry.events import (
    CheckpointUnrestorable,
    Compile,
    RunEnd,
    RunStart,
)
from titan.telemetry.mfu import FlopsMeter, device_peak
from titan.telemetry.power import PowerSampler, open_reader
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
from titan.telemetry.sinks import check_library, live_sink
from titan.trainer.adapters import build_trainer, check_layout_fits, remat_choice
from titan.trainer.checkpoint import (
    CHECKPOINT_DIR,
    Checkpointer,
    SaveSchedule,
    Unrestorable,
    initial_state,
)
from titan.trainer.checkpoint_hook import CheckpointHook, SettledSavesHook
from titan.trainer.claim import RunClaim, refuse_recorded
from titan.trainer.compilation import CompileWatch, compilation_settings
from titan.trainer.compile_hook import CompileHook
from titan.trainer.eval_hook import EvalHook
from titan.trainer.evaluation import Evaluation, open_evaluation
from titan.trainer.guard import (
    FINITE_CHECK_FUNCTION,
    NonFiniteAbort,
)
from titan.trainer.health_hook import HealthHook
from titan.trainer.heartbeat_hook import HeartbeatHook
from titan.trainer.hooks import Hooks
from titan.trainer.images import image_batches
from titan.trainer.loop import Throughput, TrainLoop
from titan.trainer.memory_check import check_memory
from titan.trainer.peers import PeerWatch, end_for_lost
from titan.trainer.power_hook import PowerHook
from titan.trainer.processes import (
    Heartbeat,
    MutedRecord,
    agreed_run_id,
    batch_rows,
    first_then_others,
    is_writer,
    one_tokenizer,
)
from titan.trainer.profiler_hook import ProfilerHook
from titan.trainer.progress import TrainProgress
from titan.trainer.progress_hook import ProgressHook
from titan.trainer.resume import TOKENIZER_FILE, resume_options
from titan.trainer.saver import Saver
from titan.trainer.sink_hook import SinkHook
from titan.trainer.stall_hook import StallHook
from titan.trainer_state import Trainer, TrainState

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
    cfg = cfg.replace(remat=data.remat)  # what the records say: the policy that ran
    batches.rows = batch_rows(trainer, cfg.data.batch_size)

    run_devices = jax.devices()[: trainer.describe().devices]
    power_reader, power_info = open_reader(devices=run_devices)
    local_devices = [d for d in run_devices if d.process_index == jax.process_index()]
    checkpointer = checkpointer or _checkpointer(cfg, run_dir)
    power = PowerSampler(power_reader)
    flops = _flops_meter(trainer)
    # Until the run files are written a stall is said, not recorded (MutedRecord).
    record: RunRecord = MutedRecord(run_dir, run_dir.name)
    stall = StallHook(cfg.observability, record, checkpointer)
    hooks = Hooks()
    hooks.add(stall)
    hooks.add(PowerHook(power))
    hooks.start()
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
                local_devices,
            )
        with stop.during("restore"):
            hooks.on_phase("checkpoint_restore", 0)
            state, start_step, unrestorable = _restore_or_init(
                cfg, checkpointer, trainer, batches, resume_dir is not None
            )
        hooks.on_phase("compile", start_step)
        stop.start()  # from here a signal stops the run after a step, with a checkpoint
        record, liveness = _begin(cfg, run_dir, model_cfg, data.files, record, hooks)
        saver = Saver(checkpointer, _save_schedule(cfg), record, trainer, batches, hooks.on_phase)
        throughput = Throughput(
            cfg.data.batch_size,
            data.tokens_per_row,
            data.images,
            flops,
            power,
            local_devices,
        )
        loop = TrainLoop(
            trainer,
            batches,
            cfg.optimizer.steps,
            hooks,
            saver,
            record,
            throughput,
            stop,
            cfg.debugging,
        )
        stall.attach(record, liveness.heartbeat, loop)
        _add_loop_hooks(hooks, cfg, record, saver, progress, compiles, data.evaluation)
        record.emit(
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
        for skipped in unrestorable:
            record.emit(CheckpointUnrestorable(step=skipped.step, error=skipped.error))
        checkpointer.set_aside([skipped.step for skipped in unrestorable])
        with progress.status("compiling the train step"):
            compiled = [*_compile(trainer, cache, compiles), *saver.finite_check.compile(state)]
        for event in [*compiled, *trainer.start_events()]:
            record.emit(event)
        step, status = loop.run(state, start_step)
        record.emit(RunEnd(status=status, step=step, signal=stop.signal_name or None))
        liveness.heartbeat.close(status, step)
    except NonFiniteAbort as err:
        _end_nonfinite(err, saver, record, liveness.heartbeat)
        return EXIT_NONFINITE
    except Exception as err:  # noqa: BLE001 - every failure must reach the run record
        if not started:
            raise  # before run_start nothing is recorded; the claim removes a fresh run's dir
        return _fail(err, record, liveness)
    finally:
        hooks.close()
        _close(checkpointer, record)
        progress.close()
    # No process leaves before the writer has closed the record: a stop's non-zero code must not
    # let srun --kill-on-bad-exit end process 0 before its run_end.
    barrier("titan:run-end")
    progress.finish(status, step, run_dir)
    return _exit_code(cfg, status)


def _add_loop_hooks(
    hooks: Hooks,
    cfg: TrainConfig,
    record: RunRecord,
    saver: Saver,
    progress: TrainProgress,
    compiles: CompileWatch,
    evaluation: Evaluation | None,
) -> None:
    """Register the monitors of the loop's steps, in the order they act after a step."""
    hooks.add(ProfilerHook(StepProfiler(cfg.observability.profile_steps, record)))
    hooks.add(SettledSavesHook(saver))
    hooks.add(CompileHook(compiles, record))
    hooks.add(CheckpointHook(saver))
    if evaluation is not None:
        hooks.add(EvalHook(evaluation, record, progress), every=evaluation.every)
    hooks.add(ProgressHook(progress))
    hooks.add(HealthHook(cfg, record))


def _begin(
    cfg: TrainConfig,
    run_dir: Path,
    model_cfg: ModelConfig,
    files: dict[str, bytes],
    record: RunRecord,
    hooks: Hooks,
) -> tuple[RunRecord, HeartbeatHook]:
    """Open the record and write the run files (``config.json``, the tokenizer of a text run,
    the heartbeats): the first writes into the run dir, once the state is restored and the step
    traced. Starts the live metric sink, the heartbeat and the watch of the other processes.

    Returns:
        (the run's record: ``record``, the muted one, on processes other than the writer; the
        liveness hook).

    Raises:
        TitanError: ``events.jsonl`` cannot be opened for appending.
    """
    if is_writer():
        record = _open_record(run_dir)
        _write_run_files(run_dir, cfg, model_cfg, files)
        sink = live_sink(cfg.observability.metrics, run_dir)
        if sink is not None:
            hooks.add(SinkHook(sink))
    barrier("titan:run-files")  # then the others write their heartbeats there
    heartbeat = Heartbeat(run_dir)
    after_s = heartbeat_allowance_s(cfg.observability.watchdog_floor)

    def on_lost(lost: list) -> None:
        """A process of the run stopped beating: end this one (:mod:`titan.trainer.peers`)."""
        end_for_lost(record.run_dir, record, heartbeat, lost, EXIT_FAILED)

    liveness = HeartbeatHook(heartbeat, PeerWatch(run_dir, heartbeat, record, after_s, on_lost))
    hooks.add(liveness)
    hooks.start()
    return record, liveness


def _save_schedule(cfg: TrainConfig) -> SaveSchedule:
    checkpoint = cfg.checkpoint
    return SaveSchedule(checkpoint.checkpoint_every, checkpoint.checkpoint_every_s, process_count())


def _restore_or_init(
    cfg: TrainConfig,
    checkpointer: Checkpointer,
    trainer: Trainer,
    batches: Batches | ImageBatches,
    resuming: bool,
) -> tuple[TrainState, int, list[Unrestorable]]:
    """(state, step, checkpoints skipped): the latest checkpoint's when resuming and one
    exists (the batches moved to its data position), else fresh.

    Raises:
        TitanError: the latest checkpoint cannot be read or restored onto this layout, or
            the corpus changed since it was written.
    """
    restored = checkpointer.restore_latest(trainer) if resuming else None
    if restored is None:
        if resuming:
            print(
                "titan: --resume: the run has no committed checkpoint; starting from step 0",
                file=sys.stderr,
                flush=True,
            )
        return initial_state(trainer, cfg.run.seed, cfg.checkpoint.init_from), 0, []
    state, meta, unrestorable = restored
    for skipped in unrestorable:
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
            f"--resume: checkpoint {latest} ({checkpointer.path(latest)}) cannot be "
            f"read: {type(err).__name__}: {_first_line(err)}"
        ) from None
    if saved_sequences != batches.num_sequences:
        raise TitanError(
            f"--resume: the corpus changed since the checkpoint ({saved_sequences} "
            f"sequences then, {batches.num_sequences} now)"
        )
    batches.position = position
    return state, latest, unrestorable


def _fail(err: Exception, record: RunRecord, liveness: HeartbeatHook) -> int:
    """Say and record a failure after ``run_start`` (``run_end`` ``failed``, as far as the disk
    allows); returns :data:`EXIT_FAILED`. A full disk is one line naming the path."""
    liveness.peers.settle()  # a peer killed mid-collective: record it, not the symptom
    full = disk_full(err)
    if full is None:
        traceback.print_exc()
    else:
        print(f"titan train: error: {full}", file=sys.stderr, flush=True)
    error = full or f"{type(err).__name__}: {err}"
    with contextlib.suppress(OSError):
        record.emit(RunEnd(status="failed", step=None, error=error))
    with contextlib.suppress(OSError):
        liveness.heartbeat.close("failed", None)
    return EXIT_FAILED


def _end_nonfinite(
    err: NonFiniteAbort, saver: Saver, record: RunRecord, heartbeat: Heartbeat
) -> None:
    """Record a non-finite abort: one line on stderr and ``run_end`` ``failed`` (reason
    ``nonfinite``) naming the newest committed checkpoint, which holds finite weights (a save
    still in flight is waited for first)."""
    with contextlib.suppress(DiskFull):
        saver.wait()
    latest = saver.checkpointer.latest_step()
    kept = "none (a resume starts from step 0)" if latest is None else f"step {latest}"
    print(f"titan: non-finite: {err}; the last checkpoint is {kept}", file=sys.stderr)
    record.emit(
        RunEnd(
            status="failed",
            step=err.step,
            reason="nonfinite",
            error=f"{type(err).__name__}: {err}",
            checkpoint_step=latest,
        )
    )
    heartbeat.close("failed", err.step)


def _close(checkpointer: Checkpointer, record: RunRecord) -> None:
    """Close the checkpointer and the record (after a full disk too)."""
    try:
        checkpointer.close()
    except Exception as err:  # noqa: BLE001 - a failed last save was said already
        if disk_full(err) is None:
            raise
    finally:
        record.close()


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
    """What a task's data gives the run: the model shape and its trainer (with its remat
    policy), the batches, the run
    files beside ``config.json``, the ``tokenizer``/``data`` sections of ``run_start``, tokens
    per batch row and whether rows are images (``step`` events' ``images_per_s``)."""

    model: ModelConfig
    ops: Ops
    trainer: Trainer
    remat: str  # the --remat policy it trains with (auto resolved)
    batches: Batches | ImageBatches
    files: dict[str, bytes]
    record: dict[str, Any]
    tokens_per_row: int
    images: bool = False
    evaluation: Evaluation | None = None  # --eval-every


def _build(cfg: TrainConfig, model_cfg: ModelConfig, stop: StopFlag) -> tuple[Ops, Trainer, str]:
    """The operators, the trainer and the ``--remat`` policy it trains with (``auto``
    resolved: :func:`titan.trainer.memory_check.resolve_remat`, said in one line)."""
    import jax

    with stop.during("build"):
        remat = remat_choice(cfg, model_cfg)
        if (line := remat.line()) and is_writer():
            print(f"titan: {line}", flush=True)
        cfg = cfg.replace(remat=remat.remat)
        ops = Ops(jax.default_backend(), cfg.compute.ops)
        return ops, build_trainer(cfg, model_cfg, ops), remat.remat


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
    ops, trainer, remat = _build(cfg, model_config(cfg, tokenizer.vocab_size), stop)
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
        model_cfg, ops, trainer, remat, batches, files, record, cfg.data.seq_len, False, evaluation
    )


def _image_data(cfg: TrainConfig, stop: StopFlag) -> _RunData:
    """The images of a diffusion run, its DiT and batches (:mod:`titan.trainer.images`)."""
    with stop.during("scan"):
        model_cfg, batches = image_batches(cfg)
    ops, trainer, remat = _build(cfg, model_cfg, stop)
    record = {"tokenizer": None, "data": batches.data.record()}
    return _RunData(model_cfg, ops, trainer, remat, batches, {}, record, model_cfg.patches, True)


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
