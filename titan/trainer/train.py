"""Training entry: ``titan train``.

The recipe (:func:`train`): resolve options, open the corpus, claim the run dir, prepare the
tokenizer (or read the images: :mod:`titan.trainer.task`), build the model family and the
layout's trainer, read the batches, trace the step, restore or initialise the state (all
validation happens up to here, before anything is written into the run dir), write the run
files, record ``run_start``, compile, loop (after the first step: reserve the pinned host
memory that saves copy into, :mod:`titan.trainer.loop_hooks.pin_host_hook`), checkpoint, record.
:func:`train` alone holds the whole config: each step takes the sections, or the values, it
reads.

Events written to ``events.jsonl``: the types of :mod:`titan.telemetry.events`, documented
in ``docs/events.md`` (``run_start``, ``compile``, ``step``, ``checkpoint``,
``checkpoint_failed``, ``checkpoint_unrestorable``, ``pinned_host``, ``loss_spike``,
``profile``, ``stall``, ``run_end``; ``eval`` with ``--eval-every``
(:mod:`titan.trainer.evaluation`); ``pipeline`` and ``pipeline_timing`` from an MPMD trainer).

Checkpoints (:mod:`titan.checkpoint.checkpointer`) are asynchronous unless
``--no-checkpoint-async``: the loop records each save's outcome once it settles and waits for
the last one before ``run_end``. Before the state is made or restored,
:func:`titan.layouts.memory_check.check_memory` compares the planner's memory estimate with the
devices' usable memory.

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
import functools
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from titan.checkpoint.checkpointer import (
    CHECKPOINT_DIR,
    Checkpointer,
    SaveSchedule,
    Unrestorable,
    check_save_clock,
    initial_state,
)
from titan.checkpoint.finite_check import FINITE_CHECK_FUNCTION, FiniteCheck
from titan.checkpoint.pinned_host import reservation_pays
from titan.checkpoint.resume import (
    OLDER_IMAGE_RULES,
    check_record,
    check_resumed_images,
    enter_launch_dir,
    recorded_checkpoint,
    resume_options,
)
from titan.config import (
    CheckpointOptions,
    ComputeOptions,
    DataOptions,
    DebuggingOptions,
    ObservabilityOptions,
    OptimizerOptions,
    ParallelOptions,
    TrainConfig,
    TrainerOptions,
)
from titan.config_files import config_to_data
from titan.data.heldout import Corpora, open_corpora
from titan.data.images import ImageBatches
from titan.data.mixture import Batches
from titan.errors import TitanError, error_line
from titan.exit_codes import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, EXIT_STOPPED
from titan.inert import inert
from titan.layouts.builders import (
    build_run_trainer,
    check_layout_fits,
    remat_choice,
    with_remat,
)
from titan.layouts.contract import Trainer, TrainState
from titan.layouts.memory_check import (
    MemoryCheck,
    ProgramOverMemory,
    RematChoice,
    Traced,
    check_memory,
    program_over_memory,
)
from titan.ops import Ops
from titan.optimizer import schedule_text, warmup_note
from titan.parallel.distributed import (
    LaunchSettings,
    barrier,
    initialize,
    largest_over_processes,
    process_count,
    process_index,
)
from titan.parallel.fit import BatchSplitError
from titan.shapes import ModelConfig
from titan.stopping import StopFlag, stopped_at_start
from titan.telemetry.env import capture_environment
from titan.telemetry.events import CheckpointUnrestorable, Compile, RunEnd, RunStart
from titan.telemetry.heartbeat import ProcessId, heartbeat_allowance_s
from titan.telemetry.mfu import FlopsMeter, device_peak
from titan.telemetry.power import PowerSampler, open_reader
from titan.telemetry.profile import StepProfiler
from titan.telemetry.records import (
    CONFIG_FILE,
    EVENTS_FILE,
    DiskFull,
    RunRecord,
    disk_full,
    runs_root_source,
    write_json_atomic,
)
from titan.telemetry.sinks import check_library, live_sink
from titan.trainer.claim import RunClaim, run_dir_of
from titan.trainer.compilation import CompileWatch, compilation_settings
from titan.trainer.evaluation import never_evaluated
from titan.trainer.guard import (
    LossSpikeDetector,
    NonFiniteAbort,
    NonFiniteGuard,
)
from titan.trainer.hooks import Hooks
from titan.trainer.image_task import ImageTask
from titan.trainer.loop import Throughput, TrainLoop
from titan.trainer.loop_hooks.checkpoint_hook import CheckpointHook, SettledSavesHook
from titan.trainer.loop_hooks.compile_hook import CompileHook
from titan.trainer.loop_hooks.eval_hook import EvalHook
from titan.trainer.loop_hooks.health_hook import HealthHook
from titan.trainer.loop_hooks.heartbeat_hook import HeartbeatHook
from titan.trainer.loop_hooks.pin_host_hook import PinHostHook
from titan.trainer.loop_hooks.power_hook import PowerHook
from titan.trainer.loop_hooks.profiler_hook import ProfilerHook
from titan.trainer.loop_hooks.progress_hook import ProgressHook
from titan.trainer.loop_hooks.sink_hook import SinkHook
from titan.trainer.loop_hooks.stall_hook import StallHook
from titan.trainer.peers import PeerWatch, end_for_lost
from titan.trainer.processes import (
    Heartbeat,
    MutedRecord,
    checked_on_every_process,
    clear_heartbeats,
    is_writer,
    same_options,
)
from titan.trainer.progress import TrainProgress
from titan.trainer.saver import FinalSaveFailed, Saver, digest_check
from titan.trainer.task import RunData, Task
from titan.trainer.text_data import TextTask

# The options that choose a layout's sizes: a resume that gives none of them runs the saved ones.
LAYOUT_OPTIONS = frozenset({"layout", "dp", "fsdp", "tp", "pp", "batch_size", "microbatches"})


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
    resume_dir = enter_launch_dir(Path(resume)) if resume else None
    cfg = resume_options(resume_dir, explicit) if resume_dir else TrainConfig.of(**explicit)
    launch = launch or LaunchSettings()
    if launch.num_processes is not None:  # else known once joined: the save schedule checks it
        check_save_clock(cfg.checkpoint.checkpoint_every_s, launch.num_processes)
    initialize(launch)
    same_options({**cfg.record(), "num_processes": launch.num_processes})
    if resume_dir is not None:
        layout_given = bool(LAYOUT_OPTIONS & explicit.keys())
        check_resumed_layout(cfg.parallel, cfg.data.batch_size, resume_dir, layout_given)
    return train(cfg, resume_dir, stop)


def check_resumed_layout(
    parallel: ParallelOptions, batch_size: int, resume_dir: Path, layout_given: bool
) -> None:
    """Refuse a resume whose layout does not fit the devices here, in the words of a resume:
    a saved layout (``layout_given`` False: none of :data:`LAYOUT_OPTIONS` given) is named as
    the run's, not as asked; and since ``--batch-size`` cannot change on ``--resume``, a batch
    that does not split is to be met with the layout's sizes.

    Raises:
        TitanError: names ``--resume``, the layout's error, and the options to give.
    """
    try:
        check_layout_fits(parallel, batch_size)
    except TitanError as err:
        if not layout_given:
            raise TitanError(
                f"--resume {resume_dir}: the run's saved layout does not fit here ({err}); give "
                "--dp, --fsdp, --tp (or --layout, --pp) for these devices: the checkpoint is "
                "re-cut onto them"
            ) from None
        if isinstance(err, BatchSplitError):
            raise TitanError(
                f"--resume {resume_dir}: {err}, but --batch-size {batch_size} is the "
                "run's and cannot change on --resume: give --dp, --fsdp and --microbatches "
                "whose product divides it"
            ) from None
        raise


def train(cfg: TrainConfig, resume_dir: Path | None = None, stop: StopFlag | None = None) -> int:
    """Train per ``cfg``; continue the run in ``resume_dir`` when given. Returns the exit code.

    The one function that holds the whole config: each step takes the sections, or the values,
    it reads. JAX's persistent compilation cache (``--compilation-cache``) and the watch on
    repeated compilations hold for the run (:mod:`titan.trainer.compilation`).

    Nothing in the run dir changes before the state is restored and the step traced: a start-up
    that fails or is stopped by a signal leaves a resumed run's record byte-identical, and
    removes the dir of a fresh run (:class:`titan.trainer.claim.RunClaim`).

    Args:
        stop: the stop flag (:mod:`titan.stopping`), installed here if not given.

    Raises:
        TitanError: bad input found before the run starts (before ``run_start``), or another
            live process holds the run dir (:mod:`titan.trainer.claim`).
    """
    setup_start = time.time()
    stop = _installed(stop or StopFlag(), cfg.debugging.debug_signal_in)
    progress = TrainProgress(cfg.optimizer.steps, cfg.observability.log_every)
    resuming = resume_dir is not None
    try:
        with stop.during("scan"):
            corpora = checked_on_every_process(
                lambda: _scanned(
                    cfg.data, cfg.model.task, cfg.parallel, cfg.observability, resume_dir
                )
            )
        run_dir = run_dir_of(cfg.run, cfg.model.shape.name, resuming)
        with (
            # claimed before anything slow: a second run of this dir is refused at once
            RunClaim(
                run_dir,
                fresh=not resuming,
                enabled=is_writer(),
                root_source=runs_root_source(cfg.run.runs_root),
            ) as claim,
            compilation_settings(cfg.compute.compilation_cache) as cache,
            CompileWatch(frozenset({FINITE_CHECK_FUNCTION})) as compiles,
        ):
            # of the run dir as the resume placed it (a link's target: resume_options)
            resumed = _resumed_checkpointer(
                cfg.checkpoint, cfg.optimizer.steps, run_dir if resuming else None
            )
            task: Task = (
                TextTask(cfg.data, cfg.observability, cfg.run.seed, corpora, resume_dir)
                if corpora is not None
                else ImageTask(cfg.diffusion, cfg.data.batch_size, cfg.run.seed)
            )
            shape = task.model_shape(cfg.model.shape, progress, stop)
            if resume_dir is not None and shape.family == "dit":
                check_resumed_images(resume_dir, shape)
            with stop.during("build"):
                ops = Ops(jax.default_backend(), cfg.compute.ops)
                usable = cfg.debugging.debug_usable_memory
                remat = remat_choice(shape, cfg.trainer, usable)
                compiler = _Compiler(cache, compiles, progress)
                reprice = functools.partial(remat_choice, shape, cfg.trainer, usable)
                built = _Built.of(shape, ops, cfg.trainer, remat, compiler, reprice=reprice)
                _say(built.remat.line())
                _say(warmup_note(cfg.optimizer))
                _say(never_evaluated(cfg.observability.eval_every, cfg.optimizer.steps))
                cfg = cfg.replace(remat=built.remat.remat)  # what the records say: what ran
            data = task.run_data(built.trainer, progress, stop)
            run = _Run(run_dir, built, ops, data, cfg.data.batch_size, progress, stop)
            # a fresh run's checkpoints are made after its checks: they create their directory
            run.watch(resumed or _checkpointer(cfg.checkpoint, run_dir), cfg.observability)
            try:
                run.trace(cfg.compute, cfg.parallel, cfg.data, cfg.debugging.debug_usable_memory)
                run.restore(resuming, cfg.run.seed, cfg.checkpoint.init_from)
                stop.start()  # from here a signal stops the run after a step, with a checkpoint
                run.begin(config_to_data(cfg), cfg.observability)
                run.make_loop(cfg.optimizer.steps, cfg.checkpoint, cfg.debugging)
                pin_host = reservation_pays(cfg.checkpoint, run.start_step, cfg.optimizer.steps)
                run.add_loop_hooks(cfg.observability, cfg.optimizer, compiles, pin_host)
                run.record_start(cfg.record(), cfg.optimizer.steps, resuming, setup_start)
            except BaseException:
                run.close()
                raise  # before run_start nothing is recorded; the claim removes a fresh dir
            claim.recorded = True
            if resuming and run.start_step:  # said once the run is recorded: a refusal is one line
                schedule = _schedule_text(cfg.optimizer)
                print(f"titan: resuming from step {run.start_step}: {schedule}", file=sys.stderr)
            return run.run(compiler, cfg.run.exit_zero_on_stop)
    except BaseException:
        if not stop.requested or stop.running:
            raise
        # A signal during start-up; a native library may have turned it into its own error.
        progress.close()
        return stopped_at_start(stop, cfg.run.exit_zero_on_stop, resuming)
    finally:
        stop.uninstall()


@dataclasses.dataclass(frozen=True)
class _Compiler:
    """Compiles a trainer's step (:func:`_compile`) while the progress display says so."""

    cache: Path | None
    compiles: CompileWatch
    progress: TrainProgress

    def __call__(self, trainer: Trainer) -> list[Compile]:
        with self.progress.status("compiling the train step"):
            return _compile(trainer, self.cache, self.compiles)


@dataclasses.dataclass(frozen=True)
class _Built:
    """The run's trainer and the ``--remat`` choice it was built with.

    Attributes:
        compiled: its compile events when it was compiled as it was built (to hold an
            ``auto`` choice against the compiled program), else None.
        traced: whether its step was traced as it was built (an estimated ``auto`` choice).
    """

    trainer: Trainer
    remat: RematChoice
    compiled: list[Compile] | None = None
    traced: bool = False

    @classmethod
    def of(
        cls,
        shape: ModelConfig,
        ops: Ops,
        options: TrainerOptions,
        remat: RematChoice,
        compiler: _Compiler,
        passed: tuple[Compile, ...] = (),
        reprice: Callable[..., RematChoice] | None = None,
    ) -> _Built:
        """The trainer of ``shape`` with ``remat``. An estimated ``auto`` choice is traced here
        and, with ``reprice`` (``served=`` the providers that served), chosen again by the
        estimate of those providers (:func:`titan.layouts.memory_check.run_precision`): a
        different policy is built instead (once). A choice with candidates is then compiled
        here; while its program is over the usable memory on any process it passes to the next
        candidate (:meth:`titan.layouts.memory_check.RematChoice.compiled`). The compile events
        of the candidates passed over (``passed``, so far) come first in :attr:`compiled`,
        marked :attr:`~titan.telemetry.events.Compile.passed_over`: their time is the run's too.

        Raises:
            TitanError: as :func:`titan.layouts.builders.build_run_trainer`.
        """
        trainer = build_run_trainer(shape, ops, with_remat(options, remat.remat))
        if remat.estimate_bytes is None:  # given, or the only candidate: nothing to price
            return cls(trainer, remat)
        trainer.trace()
        if reprice is not None and not remat.passed_over:
            priced = reprice(served=dict(ops.served))
            if priced.remat != remat.remat:
                del trainer  # before the other policy's
                return cls.of(shape, ops, options, priced, compiler, passed)
            remat = priced
        if not (remat.fallbacks or remat.passed_over):
            return cls(trainer, remat, traced=True)
        try:
            events = compiler(trainer)
        except ProgramOverMemory as err:
            refused = remat.refused(err.required_bytes)
            if refused is None and remat.passed_over:  # auto tried them all: say so
                tried = [name for name, _ in remat.passed_over] + [remat.remat]
                raise ProgramOverMemory(err.said, err.required_bytes, tried) from None
            if refused is None:
                raise
            del trainer  # before the next candidate's buffers
            return cls.of(shape, ops, options, refused, compiler, passed)
        held = remat.compiled(_largest_program(events))
        if held.remat == remat.remat:
            return cls(trainer, held, [*passed, *events], traced=True)
        del trainer  # before the next candidate's buffers
        passed += tuple(dataclasses.replace(e, passed_over=True) for e in events)
        return cls.of(shape, ops, options, held, compiler, passed)


def _largest_program(events: list[Compile]) -> int | None:
    """The largest compiled program's bytes per device (:attr:`Compile.program_bytes`) of
    ``events`` over every process, or None when no process knows it."""
    known = [e.program_bytes for e in events if e.program_bytes is not None]
    largest = largest_over_processes(max(known, default=-1))
    return largest if largest >= 0 else None


class _Run:
    """A run once its trainer and data are built, from the trace to ``run_end``: its monitors
    (:mod:`titan.trainer.hooks`), record, checkpoints, loop and state, made by :func:`train`
    in this order: :meth:`watch`, :meth:`trace`, :meth:`restore`, :meth:`begin`,
    :meth:`make_loop`, :meth:`add_loop_hooks`, :meth:`record_start`, :meth:`run` (which closes
    them); :meth:`close` closes them after a failure before ``run_start``.

    Args:
        run_dir: the run's dir.
        trainer: the run's trainer, built.
        ops: the operators (the providers that served in the trace go in ``run_start``).
        data: the task's data (:mod:`titan.trainer.task`).
        batch_size: ``--batch-size`` (what a ``step`` event counts).
        progress: the progress display.
        stop: the stop flag.
    """

    def __init__(
        self,
        run_dir: Path,
        built: _Built,
        ops: Ops,
        data: RunData,
        batch_size: int,
        progress: TrainProgress,
        stop: StopFlag,
    ) -> None:
        trainer = built.trainer
        self.run_dir, self.trainer, self.ops, self.data = run_dir, trainer, ops, data
        self.compiled = built.compiled
        self.traced = built.traced
        self.progress, self.stop = progress, stop
        self.finite_check = FiniteCheck()  # the restore's digests, then the saves' checks
        run_devices = jax.devices()[: trainer.describe().devices]
        power_reader, self.power_info = open_reader(devices=run_devices)
        local_devices = [d for d in run_devices if d.process_index == jax.process_index()]
        power = PowerSampler(power_reader)
        self.throughput = Throughput(
            batch_size,
            data.tokens_per_row,
            data.images,
            _flops_meter(trainer),
            power,
            local_devices,
        )
        self.hooks = Hooks()
        # Until the run files are written a stall is said, not recorded (MutedRecord).
        self.record: RunRecord = MutedRecord(run_dir, run_dir.name)
        # made by the methods, in order
        self.checkpointer: Checkpointer
        self.stall: StallHook
        self.memory: MemoryCheck
        self.state: TrainState
        self.start_step: int
        self.unrestorable: list[Unrestorable]
        self.liveness: HeartbeatHook
        self.saver: Saver
        self.loop: TrainLoop

    def watch(self, checkpointer: Checkpointer, observability: ObservabilityOptions) -> None:
        """Start the stall watchdog (``--watchdog-*``) and the power sampler; ``checkpointer``
        holds the run's checkpoints."""
        self.checkpointer = checkpointer
        self.stall = StallHook(observability, self.record, checkpointer)
        self.hooks.add(self.stall)
        self.hooks.add(PowerHook(self.throughput.power))
        self.hooks.start()

    def trace(
        self,
        compute: ComputeOptions,
        parallel: ParallelOptions,
        data: DataOptions,
        usable_override: float,
    ) -> None:
        """Trace the step (the operators' providers are chosen here) and check the planner's
        memory estimate (:func:`titan.layouts.memory_check.check_memory`) before the state
        takes any memory.

        Raises:
            TitanError: the estimate is above the devices' usable memory.
        """
        trainer = self.trainer
        with self.stop.during("trace"):
            if not self.traced:  # else traced (and compiled) as it was built
                trainer.trace()
            traced = Traced(trainer.describe().devices, str(trainer.compute_dtype), self.ops.served)
            for op, name in self.ops.unused_overrides().items():
                _say(f"{op}={name} (--ops, TITAN_OPS) has no effect: the model calls no {op}")
            devices = self.throughput.local_devices
            model = trainer.adapter.config
            self.memory = check_memory(
                model, compute, parallel, data, traced, devices, usable_override
            )

    def restore(self, resuming: bool, seed: int, init_from: str) -> None:
        """The state: the latest checkpoint's when ``resuming`` and one exists, else fresh
        from ``seed`` (with ``--init-from``'s weights when given)
        (:func:`_restore_or_init`)."""
        with self.stop.during("restore", fresh=not resuming):
            self.hooks.on_phase("checkpoint_restore", 0)
            self.state, self.start_step, self.unrestorable = _restore_or_init(
                self.checkpointer,
                self.trainer,
                self.data.batches,
                resuming,
                seed,
                init_from,
                digest_check(self.finite_check, self.trainer),
            )
        self.hooks.on_phase("compile", self.start_step)

    def begin(self, train: dict[str, Any], observability: ObservabilityOptions) -> None:
        """Open the record and write the run files (``config.json``: the options ``train``
        and the model; the task's files, the heartbeats): the first writes into the run dir,
        once the state is restored and the step traced. Starts the live metric sink
        (``--metrics``), the heartbeat and the watch of the other processes (``--watchdog-floor``
        bounds their silence).

        Raises:
            TitanError: ``events.jsonl`` cannot be opened for appending.
        """
        run_dir = self.run_dir
        if is_writer():
            self.record = _open_record(run_dir)
            model = self.trainer.adapter.config.record()
            _write_run_files(run_dir, {"train": train, "model": model}, self.data.files)
            clear_heartbeats(run_dir)  # an earlier attempt's
            sink = live_sink(observability.metrics, run_dir)
            if sink is not None:
                self.hooks.add(SinkHook(sink))
        barrier("titan:run-files")  # then the others write their heartbeats there
        heartbeat = Heartbeat(run_dir)
        after_s = heartbeat_allowance_s(observability.watchdog_floor)
        record = self.record

        def on_lost(lost: list) -> None:
            """A process of the run stopped beating: end this one (:mod:`titan.trainer.peers`)."""
            end_for_lost(record.run_dir, record, heartbeat, lost, EXIT_FAILED)

        peers = PeerWatch(run_dir, heartbeat, record, after_s, on_lost)
        self.liveness = HeartbeatHook(heartbeat, peers)
        self.hooks.add(self.liveness)
        self.hooks.start()

    def make_loop(
        self, steps: int, checkpoint: CheckpointOptions, debugging: DebuggingOptions
    ) -> None:
        """The loop to ``steps`` (``--steps``), saving on ``checkpoint``'s schedule, with the
        testing aids of ``debugging``."""
        schedule = SaveSchedule(
            checkpoint.checkpoint_every, checkpoint.checkpoint_every_s, process_count()
        )
        trainer, batches, record = self.trainer, self.data.batches, self.record
        self.saver = Saver(
            self.checkpointer,
            schedule,
            record,
            trainer,
            batches,
            self.hooks.on_phase,
            self.finite_check,
        )
        self.loop = TrainLoop(
            trainer,
            batches,
            steps,
            self.hooks,
            self.saver,
            record,
            self.throughput,
            self.stop,
            debugging,
        )
        self.stall.attach(record, self.liveness.heartbeat, self.loop)

    def add_loop_hooks(
        self,
        observability: ObservabilityOptions,
        optimizer: OptimizerOptions,
        compiles: CompileWatch,
        pin_host: bool,
    ) -> None:
        """Register the monitors of the loop's steps, in the order they act after a step: the
        profiler (``--profile-steps``), the reservation of pinned host memory for the saves
        (``pin_host``: :func:`titan.checkpoint.pinned_host.reservation_pays`), settled saves,
        repeated compilations, checkpoints, evaluation (``--eval-every``), progress, loss
        spikes (``--loss-spike-*``) and ``--nonfinite``."""
        hooks, record, saver, progress = self.hooks, self.record, self.saver, self.progress
        obs = observability
        hooks.add(ProfilerHook(StepProfiler(obs.profile_steps, record)))
        if pin_host:  # after a trace of step 1 closes, before a save of step 1
            hooks.add(PinHostHook(self.trainer.abstract_items(), record, progress, self.stop))
        hooks.add(SettledSavesHook(saver))
        hooks.add(CompileHook(compiles, record))
        hooks.add(CheckpointHook(saver))
        evaluation = self.data.evaluation
        if evaluation is not None:
            hooks.add(EvalHook(evaluation, record, progress), every=evaluation.every)
        hooks.add(ProgressHook(progress))
        spikes = LossSpikeDetector(obs.loss_spike_window, obs.loss_spike_sigma)
        guard = NonFiniteGuard(optimizer.nonfinite, optimizer.nonfinite_patience)
        hooks.add(HealthHook(spikes, guard, record))

    def record_start(
        self, config: dict[str, Any], steps: int, resuming: bool, setup_start: float
    ) -> None:
        """Record ``run_start``: the options (``config``, flat), the model, layout, operators,
        environment, data, the steps to go (to ``steps``), the memory check, and when the
        attempt's set-up began (``setup_start``, unix seconds)."""
        trainer, start_step = self.trainer, self.start_step
        self.record.emit(
            RunStart(
                config=config,
                model=trainer.adapter.config.record(),
                model_source=trainer.adapter.describe(),
                param_count=trainer.adapter.param_count(),
                layout=trainer.describe().to_json(),
                compute_dtype=str(trainer.compute_dtype),
                ops=self.ops.served,
                env=capture_environment(),
                **self.data.record,
                processes=process_count(),
                process=ProcessId.current(process_index()).as_dict(),
                start_step=start_step,
                total_steps=steps,
                # checkpoints are never of step 0: a resume without one starts fresh
                resumed_from_step=start_step if resuming and start_step else None,
                power=self.power_info,
                memory_check=self.memory.record(),
                setup_start=setup_start,
            )
        )

    def run(self, compiler: _Compiler, exit_zero_on_stop: bool) -> int:
        """Compile the step, run the loop and record ``run_end``; close the run's parts.
        Returns the exit code: 0 completed, :data:`EXIT_STOPPED` stopped (0 with
        ``exit_zero_on_stop``), :data:`EXIT_NONFINITE` a non-finite abort, :data:`EXIT_FAILED`
        a failure (recorded as ``run_end`` ``failed``)."""
        record, checkpointer, loop = self.record, self.checkpointer, self.loop
        try:
            for skipped in self.unrestorable:
                record.emit(CheckpointUnrestorable(step=skipped.step, error=skipped.error))
            checkpointer.set_aside([skipped.step for skipped in self.unrestorable])
            compiled = self.compiled if self.compiled is not None else compiler(self.trainer)
            compiled = [*compiled, *self.saver.finite_check.compile(self.state)]
            loop.count_program_temporaries(compiled)
            for event in [*compiled, *self.trainer.start_events()]:
                record.emit(event)
            step, status = loop.run(self.state, self.start_step)
            record.emit(RunEnd(status=status, step=step, signal=self.stop.signal_name or None))
            self.liveness.heartbeat.close(status, step)
        except NonFiniteAbort as err:
            _end_nonfinite(err, self.saver, record, self.liveness.heartbeat)
            return EXIT_NONFINITE
        except Exception as err:  # noqa: BLE001 - every failure must reach the run record
            failure = failure_to_name(err, self.saver)
            return _fail(failure, record, self.liveness, loop.recorded_step)
        finally:
            self.close()
        # No process leaves before the writer has closed the record: a stop's non-zero code
        # must not let srun --kill-on-bad-exit end process 0 before its run_end.
        barrier("titan:run-end")
        self.progress.finish(status, step, self.run_dir)
        if status == "stopped" and not exit_zero_on_stop:
            return EXIT_STOPPED
        return EXIT_OK

    def close(self) -> None:
        """Stop the monitors, close the checkpointer and the record (after a full disk too)
        and the progress display."""
        self.hooks.close()
        try:
            self.checkpointer.close()
        except Exception as err:  # noqa: BLE001 - a failed last save was said already
            if disk_full(err) is None:
                raise
        finally:
            self.record.close()
            self.progress.close()


def _scanned(
    data: DataOptions,
    task: str,
    parallel: ParallelOptions,
    observability: ObservabilityOptions,
    resume_dir: Path | None,
) -> Corpora | None:
    """A process's checks of its inputs before the run starts: the record of a resumed run
    (one it could not continue is refused first), the corpora of a text run (None for images),
    the metrics library, and the layout against the devices (before the tokenizer).

    Raises:
        TitanError: as :func:`check_record`, :func:`_corpora`, :func:`check_library` or
            :func:`check_layout_fits`.
    """
    if resume_dir is not None:
        check_record(resume_dir)
    corpora = _corpora(data) if task == "lm" else None
    check_library(observability.metrics)
    _say(check_layout_fits(parallel, data.batch_size))
    return corpora


def _corpora(data: DataOptions) -> Corpora:
    """The corpora of ``--data`` (scanned, not read), split by ``--eval-data`` or
    ``--eval-split``: :func:`titan.data.heldout.open_corpora`."""
    return open_corpora(data.corpus, data.text_field, data.eval_data, data.eval_split)


def _installed(stop: StopFlag, debug_signal_in: str) -> StopFlag:
    """``stop``, installed, with ``--debug-signal-in``'s phase."""
    stop.debug_signal_in = debug_signal_in
    stop.install()
    return stop


def _say(note: str | None) -> None:
    """Say ``note`` (the writer only), beside the progress lines."""
    if note and is_writer():
        print(f"titan: {note}", flush=True)


def _warn(note: str) -> None:
    """Say ``note`` on stderr: what a resume found amiss and went past."""
    print(f"titan: {note}", file=sys.stderr, flush=True)


def _resumed_checkpointer(
    options: CheckpointOptions, steps: int, run_dir: Path | None
) -> Checkpointer | None:
    """The checkpoints of the run being resumed in ``run_dir`` (None for a fresh run), refused
    in one line when they cannot be read or leave nothing to train (``--steps``: ``steps``,
    the run's total).

    Raises:
        TitanError: ``checkpoints`` is not a directory, orbax cannot list it, its last
            checkpoint is at ``steps`` or later, or the record names a checkpoint and it holds
            none (or is gone): refused before anything is made or written.
    """
    if run_dir is None:
        return None
    directory = run_dir / CHECKPOINT_DIR
    recorded = recorded_checkpoint(run_dir)
    if not directory.exists() and recorded is not None:
        raise TitanError(_missing_recorded(recorded, directory, "nothing: it does not exist"))
    if directory.exists() and not directory.is_dir():
        raise TitanError(f"--resume {run_dir}: {directory} is not a directory")
    try:
        checkpointer = _checkpointer(options, run_dir)
    except (OSError, ValueError) as err:
        raise TitanError(
            f"--resume {run_dir}: cannot read {directory} ({error_line(err)})"
        ) from None
    latest = checkpointer.latest_step()
    if latest is None and recorded is not None:
        checkpointer.close()
        raise TitanError(_missing_recorded(recorded, directory, _no_checkpoint(checkpointer)))
    if latest is not None and steps <= latest:
        raise TitanError(
            f"--steps {steps} leaves nothing to train: the run's last checkpoint is at step "
            f"{latest} (--steps is the run's total; give more to continue)"
        )
    return checkpointer


def _checkpointer(options: CheckpointOptions, run_dir: Path) -> Checkpointer:
    """The run's checkpoints: ``--checkpoint-keep``, ``--checkpoint-keep-every``,
    ``--checkpoint-async``."""
    return Checkpointer(
        run_dir, options.checkpoint_keep, options.checkpoint_keep_every, options.checkpoint_async
    )


def _schedule_text(opt: OptimizerOptions) -> str:
    """``to step 30; learning rate: cosine to 3.00e-04 after step 20, then constant (...)``."""
    return f"to step {opt.steps}; {schedule_text(opt)} (--decay-steps sets where the decay ends)"


def _write_run_files(run_dir: Path, config: dict[str, Any], files: dict[str, bytes]) -> None:
    """``config.json`` (``config``) and the task's ``files`` in ``run_dir``, made if missing."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / CONFIG_FILE, config)
    for name, content in files.items():
        (run_dir / name).write_bytes(content)


def _missing_recorded(recorded: int, directory: Path, holds: str) -> str:
    """The refusal of a resume whose record names checkpoint ``recorded`` while ``directory``
    holds ``holds`` (:func:`_no_checkpoint`) instead."""
    return (
        f"--resume: the run's record names checkpoint {recorded}, but {directory} holds "
        f"{holds}: refusing to start again from step 0 (to train from scratch, start a new run "
        "id)"
    )


def _no_checkpoint(checkpointer: Checkpointer) -> str:
    """What a checkpoints folder with no committed checkpoint holds: ``none``, or its step
    folders without ``meta`` (``no committed checkpoint: step folders 35, 38 hold no meta``)."""
    steps = [u.step for u in checkpointer.uncommitted()]
    if not steps:
        return "none"
    listed = ", ".join(map(str, steps))
    folders = f"step folder {listed} holds" if len(steps) == 1 else f"step folders {listed} hold"
    return f"no committed checkpoint: {folders} no meta (a copy or a delete was cut short)"


def _restore_or_init(
    checkpointer: Checkpointer,
    trainer: Trainer,
    batches: Batches | ImageBatches,
    resuming: bool,
    seed: int,
    init_from: str,
    verify: Callable[[int, TrainState, dict[str, Any]], None] | None = None,
) -> tuple[TrainState, int, list[Unrestorable]]:
    """(state, step, checkpoints skipped): the latest checkpoint's when resuming and one
    exists (the batches moved to its data position), else fresh from ``seed`` (``--seed``),
    with the weights of ``init_from`` (``--init-from``) when given.

    Raises:
        TitanError: the latest checkpoint cannot be read or restored onto this layout, the
            corpus changed since it was written, or the record names a checkpoint that is
            gone (a resume would silently start over).
    """
    restored = checkpointer.restore_latest(trainer, verify) if resuming else None
    if restored is None:
        if resuming and (recorded := recorded_checkpoint(checkpointer.directory.parent)):
            holds = _no_checkpoint(checkpointer)
            raise TitanError(_missing_recorded(recorded, checkpointer.directory, holds))
        if resuming:
            print(
                "titan: --resume: the run has no committed checkpoint; starting from step 0",
                file=sys.stderr,
                flush=True,
            )
        return initial_state(trainer, seed, init_from), 0, []
    state, meta, unrestorable = restored
    latest = state.step
    for skipped in unrestorable:
        _warn(
            f"checkpoint {skipped.step} cannot be restored ({inert(skipped.error)}); set aside, "
            f"resuming from checkpoint {latest}"
        )
    recorded = recorded_checkpoint(checkpointer.directory.parent)
    if recorded is not None and recorded > max([latest, *(u.step for u in unrestorable)]):
        _warn(
            f"the run's record names checkpoint {recorded}, newer than any in "
            f"{checkpointer.directory} (deleted, or set aside earlier); resuming from "
            f"checkpoint {latest}"
        )
    try:
        saved_sequences, position = meta["num_sequences"], meta["data_position"]
    except (KeyError, TypeError) as err:  # a hand-edited meta
        raise TitanError(
            f"--resume: checkpoint {latest} ({checkpointer.path(latest)}) cannot be "
            f"read: {error_line(err)}"
        ) from None
    saved_digest = meta.get("data_digest") or ""  # absent from older checkpoints
    if saved_sequences != batches.num_sequences:
        older = "" if "data_digest" in meta else OLDER_CORPUS_RULES
        data, unit = (
            ("--images", "images")
            if isinstance(batches, ImageBatches)
            else ("the corpus", "sequences")
        )
        raise TitanError(
            f"--resume: {data} changed since the checkpoint ({saved_sequences} "
            f"{unit} then, {batches.num_sequences} now){older}"
        )
    if saved_digest and batches.data_digest and saved_digest != batches.data_digest:
        other = (
            f"other images or labels: an edited file, or {OLDER_IMAGE_RULES}"
            if isinstance(batches, ImageBatches)
            else "other tokens: an edited or reordered file"
        )
        raise TitanError(
            "--resume: the corpus changed since the checkpoint (the same number of "
            f"sequences, {saved_sequences}, but {other})"
        )
    batches.position = position
    return state, latest, unrestorable


OLDER_CORPUS_RULES = (
    "; the checkpoint is an older titan's, which read corpora otherwise (files in hidden "
    "directories such as .git, no links to directories, .ndjson, .bz2 and .xz as plain text, "
    "a byte order mark kept, a tokenizer.json's truncation applied): finish the run with that "
    "version, or start a new one"
)
"""Why a checkpoint written before the corpus rules of this version may count other sequences
(a checkpoint of this version keeps ``data_digest``)."""


def failure_to_name(err: Exception, saver: Saver) -> Exception:
    """The failure to name for ``err``. A full disk met by the record or the heartbeat while a
    save is in flight is most often the save's doing: the save is settled first (which removes
    what it wrote, making room for ``run_end``) and recorded (``checkpoint`` or
    ``checkpoint_failed``); when it too found the disk full, it is named instead of ``err``. A
    save's own full disk (:class:`DiskFull`) is named as it is."""
    if isinstance(err, DiskFull) or disk_full(err) is None:
        return err
    try:
        saver.record_saves(saver.checkpointer.settle())
    except DiskFull as full:
        return full
    except Exception:  # noqa: BLE001 - the first error is still named
        return err
    return err


def _fail(err: Exception, record: RunRecord, liveness: HeartbeatHook, step: int | None) -> int:
    """Say and record a failure after ``run_start`` (``run_end`` ``failed`` at ``step``, the
    last step with a ``step`` event, None before the loop began; as far as the disk allows);
    returns :data:`EXIT_FAILED`. A full disk is one line naming the path, and so are a last
    save that was not committed (:class:`FinalSaveFailed`) and a program XLA refused as over
    the device memory (:class:`ProgramOverMemory`); anything else shows its traceback."""
    liveness.peers.settle()  # a peer killed mid-collective: record it, not the symptom
    full = disk_full(err)
    if isinstance(err, (FinalSaveFailed, ProgramOverMemory)):
        full = str(err)  # said in one line, as a full disk is
    if full is None:
        traceback.print_exc()
    else:
        print(f"titan train: error: {inert(full)}", file=sys.stderr, flush=True)
    error = full or f"{type(err).__name__}: {err}"
    with contextlib.suppress(OSError):
        record.emit(RunEnd(status="failed", step=step, error=error))
    with contextlib.suppress(OSError):
        liveness.heartbeat.close("failed", step)
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


def _compile(trainer: Trainer, cache: Path | None, compiles: CompileWatch) -> list[Compile]:
    """The trainer's compile events, the first with the cache folder and the programs loaded
    from it meanwhile.

    Raises:
        ProgramOverMemory: XLA refused the program as over the device memory.
    """
    hits = compiles.cache_hits
    try:
        events = trainer.compile()
    except Exception as err:
        over = program_over_memory(err)
        if over is None:
            raise
        raise over from None
    if events and cache is not None:
        loaded = compiles.cache_hits - hits
        events[0] = dataclasses.replace(events[0], cache_dir=str(cache), cache_hits=loaded)
    return events


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


def _flops_meter(trainer: Trainer) -> FlopsMeter:
    """MFU against the peak of the devices the layout uses (not every visible device)."""
    kinds = [d.device_kind for d in jax.devices()]
    peak = device_peak(kinds, trainer.describe().devices, str(trainer.compute_dtype))
    return FlopsMeter(*trainer.adapter.token_flops(), peak)
