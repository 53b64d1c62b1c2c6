"""Training entry: ``titan train``.

The recipe (:func:`train`): resolve options, open the corpus, claim the run dir, prepare the
tokenizer, build the layout and trainer (all validation happens here, before anything is
written), write the run files, restore or initialise the state, compile, loop, checkpoint, record.

Events written to ``events.jsonl``: the types of :mod:`titan.observability.events`, documented
in ``docs/events.md`` (``run_start``, ``compile``, ``step``, ``checkpoint``, ``profile``,
``stall``, ``run_end``; ``pipeline`` and ``pipeline_timing`` from an MPMD trainer).

The writer claims the run dir first (:mod:`titan.trainer.claim`): a second live run of it is
refused. SIGTERM, SIGINT and SIGHUP finish the current step, checkpoint, write ``run_end``
``stopped`` and exit with :data:`EXIT_STOPPED` (4; 0 with ``--exit-zero-on-stop``); with
several processes a signal to any of them stops all after the same step
(:class:`titan.parallel.distributed.StopAgreement`). Process 0 alone writes the record; every
process keeps ``processes/<id>.json`` (:mod:`titan.trainer.processes`).
With ``--watchdog-abort 1`` a stall writes ``run_end`` ``failed`` and exits with
:data:`EXIT_STALL` (3), leaving the last committed checkpoint to resume from.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from titan.config import TrainConfig, model_config
from titan.config_files import config_to_data
from titan.data.text import Corpus, PackedBatches, batch_digest, open_corpus, token_stream
from titan.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from titan.errors import TitanError
from titan.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_STALL, EXIT_STOPPED
from titan.observability.env import capture_environment
from titan.observability.events import Checkpoint, RunEnd, RunStart, Step
from titan.observability.flops import FlopsMeter, device_peak
from titan.observability.liveness import ProcessId
from titan.observability.power import PowerSampler, StepEnergy, open_reader
from titan.observability.profile import StepProfiler
from titan.observability.records import (
    CONFIG_FILE,
    RunRecord,
    default_runs_root,
    write_json_atomic,
)
from titan.observability.watchdog import Stall, Watchdog
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
from titan.trainer.adapters import build_trainer
from titan.trainer.checkpoint import Checkpointer
from titan.trainer.claim import RunClaim, refuse_recorded
from titan.trainer.processes import (
    Heartbeat,
    agreed_run_id,
    batch_rows,
    first_then_others,
    is_writer,
    one_tokenizer,
    open_record,
)
from titan.trainer.progress import TrainProgress
from titan.trainer.resume import TOKENIZER_FILE, resume_options
from titan.trainer_state import StepMetrics, Trainer, TrainState


@dataclass
class StopFlag:
    """Set by SIGTERM, SIGINT or SIGHUP (the terminal or SSH session went away); the loop stops
    after the step in flight."""

    requested: bool = False
    signal_name: str = ""
    _previous: dict = dataclasses.field(default_factory=dict)
    _terminal_fds: list = dataclasses.field(default_factory=list)

    def install(self) -> None:
        # Known now: once the terminal hangs up, isatty() on it fails too.
        self._terminal_fds = [fd for fd in (1, 2) if os.isatty(fd)]
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            _detach_from_terminal(self._terminal_fds)


def _detach_from_terminal(fds: list[int]) -> None:
    """After a hangup the terminal is gone and writing to it fails (EIO): the standard streams
    in ``fds`` that pointed at it now go to /dev/null, so the run can still checkpoint and end."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def _check_steps_left(cfg: TrainConfig, latest: int | None) -> None:
    """Refuse a resume that has nothing to train (``--steps`` is the run's total)."""
    steps = cfg.optimizer.steps
    if latest is not None and steps <= latest:
        raise TitanError(
            f"--steps {steps} leaves nothing to train: the run's last checkpoint is at step "
            f"{latest} (--steps is the run's total; give more to continue)"
        )


def _tokenizer(cfg: TrainConfig, corpus: Corpus, resume_dir: Path | None) -> Tokenizer:
    if resume_dir is not None:
        return load_tokenizer(resume_dir / TOKENIZER_FILE)
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    return train_tokenizer(corpus, cfg.data.vocab_size)


def _run_dir(cfg: TrainConfig, resuming: bool) -> Path:
    root = default_runs_root(cfg.run.runs_root)
    if root.exists() and not root.is_dir():
        raise TitanError(f"--runs-root {root} is not a directory")
    run_dir = root / (cfg.run.run_id or agreed_run_id(cfg.model.shape.name))
    if not resuming:
        refuse_recorded(run_dir)  # early, on every process; the writer's claim checks again
    return run_dir


def _write_run_files(run_dir: Path, cfg: TrainConfig, model: ModelConfig, tok: Tokenizer) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {"train": config_to_data(cfg), "model": dataclasses.asdict(model)}
    write_json_atomic(run_dir / CONFIG_FILE, payload)
    (run_dir / TOKENIZER_FILE).write_bytes(tok.model_proto)


def train_from_cli(
    explicit: dict[str, Any], resume: str | None, launch: LaunchSettings | None = None
) -> int:
    """``titan train``: options from the command line (only those given), optional resume dir,
    and how this process joins a run of several (:mod:`titan.parallel.distributed`).

    Returns:
        Exit code (:mod:`titan.exit_codes`): 0 completed, 4 stopped (0 with
        ``--exit-zero-on-stop``), 1 failed, 3 a watchdog abort. Raises TitanError for bad input.
    """
    resume_dir = Path(resume) if resume else None
    cfg = resume_options(resume_dir, explicit) if resume_dir else TrainConfig.of(**explicit)
    if initialize(launch or LaunchSettings()) > 1 and cfg.parallel.layout != "spmd":
        raise TitanError(
            f"--layout {cfg.parallel.layout} cannot run across processes yet (spmd can)"
        )
    return train(cfg, resume_dir)


def train(cfg: TrainConfig, resume_dir: Path | None = None) -> int:
    """Train per ``cfg``; continue the run in ``resume_dir`` when given. Returns the exit code.

    Raises:
        TitanError: bad input found before the run starts (before ``run_start``; a forced op
            provider that cannot serve the model is found while tracing, after the run dir is
            written), or another live process holds the run dir (:mod:`titan.trainer.claim`). A
            run dir this call created is removed again: nothing is left behind.
    """
    progress = TrainProgress(cfg.optimizer.steps, cfg.observability.log_every)
    corpus = open_corpus(cfg.data.corpus)
    run_dir = _run_dir(cfg, resuming=resume_dir is not None)
    # Claimed before anything slow (the tokenizer): a second run of this dir is refused at once.
    with RunClaim(run_dir, fresh=resume_dir is None, enabled=is_writer()) as claim:
        return _train_claimed(cfg, resume_dir, run_dir, claim, progress, corpus)


def _train_claimed(
    cfg: TrainConfig,
    resume_dir: Path | None,
    run_dir: Path,
    claim: RunClaim,
    progress: TrainProgress,
    corpus: Corpus,
) -> int:
    """:func:`train` once this process holds the run dir (or is not its writer)."""
    import jax

    checkpointer = None  # made after the checks of a fresh run: it creates its directory
    if resume_dir is not None:
        checkpointer = Checkpointer(run_dir)
        _check_steps_left(cfg, checkpointer.latest_step())
    with progress.status("preparing the tokenizer"):
        tokenizer = one_tokenizer(lambda: _tokenizer(cfg, corpus, resume_dir))
    model_cfg = model_config(cfg, tokenizer.vocab_size)
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    trainer = build_trainer(cfg, model_cfg, ops)
    tokens = first_then_others(
        "titan:tokens", lambda: progress.tokenize(lambda r: token_stream(corpus, tokenizer, r))
    )
    batches = PackedBatches(
        tokens, cfg.data.seq_len, cfg.data.batch_size, cfg.run.seed, tokenizer.bos_id
    )
    batches.rows = batch_rows(trainer, cfg.data.batch_size)

    power_reader, power_info = open_reader(devices=jax.devices()[: trainer.describe()["devices"]])

    if is_writer():
        _write_run_files(run_dir, cfg, model_cfg, tokenizer)
    barrier("titan:run-files")  # then the others write their heartbeats there
    run = _Run(
        cfg,
        trainer,
        batches,
        checkpointer or Checkpointer(run_dir),
        open_record(run_dir, run_dir.name),
        StopFlag(),
        progress,
        _flops_meter(trainer),
        PowerSampler(power_reader),
        Heartbeat(run_dir),
    )
    run.stop.install()
    run.start_monitors()
    started = False
    try:
        state, start_step = run.restore_or_init(resume_dir is not None)
        run.watchdog.enter("compile", start_step)
        trainer.trace()
        run.record.emit(
            RunStart(
                **_run_start_fields(cfg, model_cfg, trainer, ops, tokenizer, batches),
                start_step=start_step,
                total_steps=cfg.optimizer.steps,
                resumed_from_step=start_step if resume_dir else None,
                power=power_info,
            )
        )
        started = claim.recorded = True
        for event in [*trainer.compile(), *trainer.start_events()]:
            run.record.emit(event)
        with run.profiler:  # closes a trace left open by a stop signal or an error
            step, status = run.loop(state, start_step)
        run.record.emit(RunEnd(status=status, step=step, signal=run.stop.signal_name or None))
        run.heartbeat.close(status, step)
    except Exception as err:  # noqa: BLE001 - every failure must reach the run record
        if isinstance(err, TitanError) and not started:
            raise  # bad input found before the run started: one line; the claim removes the dir
        traceback.print_exc()
        run.record.emit(RunEnd(status="failed", step=None, error=f"{type(err).__name__}: {err}"))
        run.heartbeat.close("failed", None)
        return EXIT_FAILED
    finally:
        run.stop_monitors()
        run.stop.uninstall()
        run.checkpointer.close()
        run.record.close()
        progress.close()
    # No process leaves before the writer has closed the record: a stop's non-zero code must not
    # let srun --kill-on-bad-exit end process 0 before its run_end.
    barrier("titan:run-end")
    progress.finish(status, step, run_dir)
    return _exit_code(cfg, status)


def _exit_code(cfg: TrainConfig, status: str) -> int:
    """:data:`EXIT_STOPPED` for a stopped run (0 with ``--exit-zero-on-stop``), else 0."""
    if status == "stopped" and not cfg.run.exit_zero_on_stop:
        return EXIT_STOPPED
    return EXIT_OK


def _flops_meter(trainer: Trainer) -> FlopsMeter:
    """MFU against the peak of the devices the layout uses (not every visible device)."""
    import jax

    kinds = [d.device_kind for d in jax.devices()]
    peak = device_peak(kinds, trainer.describe()["devices"], str(trainer.compute_dtype))
    return FlopsMeter(*trainer.adapter.token_flops(), peak)


def _run_start_fields(
    cfg: TrainConfig,
    model_cfg: ModelConfig,
    trainer: Trainer,
    ops: Ops,
    tokenizer: Tokenizer,
    batches: PackedBatches,
) -> dict[str, Any]:
    return {
        "config": cfg.record(),
        "model": dataclasses.asdict(model_cfg),
        "param_count": trainer.adapter.param_count(),
        "layout": trainer.describe(),
        "compute_dtype": str(trainer.compute_dtype),
        "ops": ops.served,
        "env": capture_environment(),
        "tokenizer": {
            "vocab_size": tokenizer.vocab_size,
            "source": cfg.data.tokenizer or "trained",
        },
        "data": {
            "source": cfg.data.corpus,
            "tokens": int(len(batches.tokens)),
            "sequences": batches.num_sequences,
        },
        "processes": process_count(),
        "process": ProcessId.current(process_index()).as_dict(),
    }


@dataclass
class _Run:
    """The pieces of a run the loop works with."""

    cfg: TrainConfig
    trainer: Trainer
    batches: PackedBatches
    checkpointer: Checkpointer
    record: RunRecord
    stop: StopFlag
    progress: TrainProgress
    flops: FlopsMeter
    power: PowerSampler
    heartbeat: Heartbeat

    def __post_init__(self) -> None:
        self.agreement = StopAgreement(lambda: self.stop.requested)
        obs = self.cfg.observability
        self.watchdog = Watchdog(obs.watchdog_floor, obs.watchdog_factor, self.on_stall)
        steps = obs.profile_steps
        self.profiler = StepProfiler(steps, self.record)
        # The last step with a step event: what run_end's step says (the step in flight when
        # the watchdog aborts was never recorded).
        self.recorded_step: int | None = None

    def start_monitors(self) -> None:
        """Start the stall watchdog, the power sampler and the heartbeat (background threads)."""
        self.watchdog.start()
        self.power.start()
        self.heartbeat.start()

    def stop_monitors(self) -> None:
        self.watchdog.stop()
        self.power.stop()
        self.heartbeat.stop()

    def on_stall(self, stall: Stall) -> None:
        """Record a stall (on the watchdog thread, while the main thread is stuck); with
        ``--watchdog-abort 1`` end the process with :data:`EXIT_STALL` without unwinding the
        stuck thread (the last checkpoint was committed before the loop went on)."""
        self.record.emit(stall)
        print(
            f"titan: stall: {stall.phase} of step {stall.step} has taken {stall.elapsed_s:.1f} s "
            f"(allowance {stall.threshold_s:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        if not self.cfg.observability.watchdog_abort:
            return
        self.record.emit(
            RunEnd(
                status="failed",
                step=self.recorded_step,
                reason="stall",
                error=f"stalled in {stall.phase} for {stall.elapsed_s:.1f} s",
            )
        )
        self.record.close()
        os._exit(EXIT_STALL)

    def restore_or_init(self, resuming: bool) -> tuple[TrainState, int]:
        """(state, step): the latest checkpoint's when resuming and one exists, else fresh."""
        self.watchdog.enter("checkpoint_restore", 0)
        latest = self.checkpointer.latest_step() if resuming else None
        if latest is None:
            return self.trainer.init_state(self.cfg.run.seed), 0
        state, meta = self.checkpointer.restore(latest, self.trainer)
        if meta["num_sequences"] != self.batches.num_sequences:
            raise TitanError(
                f"--resume: the corpus changed since the checkpoint ({meta['num_sequences']} "
                f"sequences then, {self.batches.num_sequences} now)"
            )
        self.batches.position = meta["data_position"]
        return state, latest

    def save(self, state: TrainState) -> None:
        step = state.step
        self.watchdog.enter("checkpoint_save", step)
        meta = {
            "data_position": self.batches.position,
            "num_sequences": self.batches.num_sequences,
            "layout": self.trainer.describe(),
        }
        seconds = self.checkpointer.save(state, meta)
        path = str(self.checkpointer.path(step))
        self.record.emit(Checkpoint(step=step, seconds=seconds, path=path))

    def loop(self, state: TrainState, step: int) -> tuple[int, str]:
        """Train until ``--steps`` or a stop signal. Metrics are read one step late so the
        host never waits on the device before dispatching the next step.

        Returns:
            (last step done, ``completed`` or ``stopped``).
        """
        pending = None
        saved_step = self.recorded_step = step
        self._last_done = time.perf_counter()
        self.energy = StepEnergy(self.power)
        while step < self.cfg.optimizer.steps and not self.agreement.stop_before(step):
            self.profiler.step_starts(step + 1)
            self.watchdog.enter("data_wait", step + 1)
            batch, ids = self.batches.next_batch()
            self.watchdog.enter("step", step + 1)
            if step + 1 == self.cfg.debugging.debug_stall_at_step:
                self._debug_stall()
            if pending and self.trainer.next_step_blocks():
                self._report(*pending)  # a blocking step must not count in the previous one
                pending = None
            state, metrics = self.trainer.step(state, batch)
            step += 1
            self.agreement.contribute(step)
            if pending:
                self._report(*pending)
            pending = (step, metrics, ids, self.batches.position, self.trainer.step_fields())
            self.profiler.step_done(step, state)
            if step % self.cfg.checkpoint.checkpoint_every == 0:
                self._report(*pending)
                pending = None
                self.save(state)
                saved_step = step
        if pending:
            self._report(*pending)
        if step != saved_step:
            self.save(state)
        self.watchdog.enter("idle", step)
        return step, "stopped" if self.agreement.agreed else "completed"

    def _debug_stall(self) -> None:
        """``--debug-stall-at-step``: hang here (a testing aid for the watchdog) until a stop
        signal arrives or the watchdog aborts the process."""
        while not self.stop.requested:
            time.sleep(0.1)

    def _report(
        self, step: int, metrics: StepMetrics, ids: np.ndarray, position: int, fields: dict
    ) -> None:
        import jax

        values = {key: float(value) for key, value in jax.device_get(metrics).items()}
        now = time.perf_counter()
        step_time_s, self._last_done = now - self._last_done, now
        self.watchdog.step_done(step_time_s)
        self.heartbeat.beat(step)
        self.recorded_step = step
        tokens = self.cfg.data.batch_size * self.cfg.data.seq_len
        event = self.record.emit(
            Step.from_fields(
                step=step,
                **values,
                tokens=tokens,
                tokens_seen=step * tokens,
                step_time_s=step_time_s,
                tokens_per_s=tokens / step_time_s,
                data_position=position,
                batch_digest=batch_digest(ids),
                **self.flops.step_fields(tokens / step_time_s),
                **self.energy.step_fields(tokens),
                **fields,
            )
        )
        self.progress.step(event)
        for layout_event in self.trainer.drain_events():
            self.record.emit(layout_event)
