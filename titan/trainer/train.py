"""Training entry: ``titan train``.

The recipe (:func:`train`): resolve options, open the corpus and tokenizer, build the layout and
trainer (all validation happens here, before anything is written), create the run dir, restore
or initialise the state, compile, loop, checkpoint, record.

Events written to ``events.jsonl`` (see :mod:`titan.observability.records`):

- ``run_start``: ``config``, ``model``, ``param_count``, ``layout``, ``ops`` (provider per op),
  ``env`` (:mod:`titan.observability.env`), ``start_step``, ``total_steps``,
  ``resumed_from_step`` (None for a fresh run), ``tokenizer`` (vocab size, source), ``data``
  (tokens, sequences), ``power`` (``source``, ``available``, ``reason``;
  :mod:`titan.observability.power`), ``processes`` (how many processes run it).
- ``compile``: ``what``, ``seconds`` (trace + XLA compile of the train step).
- ``step``: ``step`` (1-based), ``loss`` (mean token cross-entropy, nats), ``grad_norm`` (global
  L2 norm before clipping), ``lr``, ``tokens`` (this step), ``tokens_seen`` (cumulative),
  ``step_time_s`` (wall time between consecutive step completions), ``tokens_per_s``,
  ``data_position`` (sequences consumed after this step), ``batch_digest`` (crc32 of the batch's
  sequence ids), ``model_flops_per_token`` and ``mfu`` (or None with ``mfu_reason``;
  :mod:`titan.observability.flops`), ``energy_j`` and ``joules_per_token`` (None without a
  power source).
- ``checkpoint``: ``step``, ``seconds``, ``path``.
- ``profile``: ``steps``, ``dir``, ``seconds`` and more, for ``--profile-steps``
  (:mod:`titan.observability.profile`).
- ``stall``: ``phase``, ``elapsed_s``, ``threshold_s``, ``step``, ``stacks`` (every thread's
  Python stack), when the loop overruns a phase's allowance (:mod:`titan.observability.watchdog`).
- ``run_end``: ``status`` (completed | stopped | failed), ``step``, ``error`` when failed,
  ``reason`` ``stall`` when the watchdog ended the run.

SIGTERM, SIGINT and SIGHUP finish the current step, checkpoint, write ``run_end`` ``stopped``
and exit 0; with several processes a signal to any of them stops all after the same step
(:class:`titan.parallel.distributed.StopAgreement`). Process 0 alone writes the record; every
process keeps ``processes/<id>.json`` (:mod:`titan.trainer.processes`).
With ``--watchdog-abort 1`` a stall writes ``run_end`` ``failed`` and exits with
:data:`EXIT_STALL` (3), leaving the last committed checkpoint to resume from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from titan.config import (
    RESUMABLE_OPTIONS,
    ModelConfig,
    TrainConfig,
    config_from_dict,
    flag_of,
    model_config,
    parse_profile_steps,
    validate_train_config,
)
from titan.data.text import Corpus, PackedBatches, batch_digest, open_corpus, token_stream
from titan.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from titan.errors import TitanError
from titan.observability.env import capture_environment
from titan.observability.flops import FlopsMeter, device_peak
from titan.observability.power import PowerSampler, StepEnergy, open_reader
from titan.observability.profile import StepProfiler
from titan.observability.records import (
    CONFIG_FILE,
    EVENTS_FILE,
    RunRecord,
    default_runs_root,
    write_json_atomic,
)
from titan.observability.watchdog import Stall, Watchdog
from titan.ops import Ops
from titan.ops.registry import parse_overrides
from titan.parallel.distributed import (
    LaunchSettings,
    StopAgreement,
    barrier,
    initialize,
    process_count,
)
from titan.trainer.adapters import build_trainer
from titan.trainer.checkpoint import Checkpointer
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
from titan.trainer.state import StepMetrics, Trainer, TrainState

TOKENIZER_FILE = "tokenizer.model"
# 2 is a bad option (titan.cli); 3 lets a supervisor tell a stall (restart) from a failure.
EXIT_OK, EXIT_FAILED, EXIT_STALL = 0, 1, 3


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


def resume_options(run_dir: Path, explicit: dict[str, Any]) -> TrainConfig:
    """The saved options of ``run_dir`` with the allowed explicit overrides applied.

    Raises:
        TitanError: ``run_dir`` holds no run, or an option that cannot change was changed.
    """
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise TitanError(f"--resume {run_dir}: no {CONFIG_FILE} there (not a run dir)")
    if not (run_dir / TOKENIZER_FILE).is_file():
        raise TitanError(
            f"--resume {run_dir}: no {TOKENIZER_FILE} there (a copy of a run record without "
            "its tokenizer and checkpoints cannot be resumed)"
        )
    try:
        saved = config_from_dict(json.loads(config_path.read_text())["train"])
    except (ValueError, KeyError, TypeError) as err:
        raise TitanError(f"--resume {run_dir}: {CONFIG_FILE} is unreadable ({err})") from None
    placed = sorted({"runs_root", "run_id"} & explicit.keys())
    if placed:
        raise TitanError(f"{flag_of(placed[0])} cannot be given with --resume (the run dir is)")
    for name, value in explicit.items():
        if value != getattr(saved, name) and name not in RESUMABLE_OPTIONS:
            raise TitanError(
                f"{flag_of(name)} cannot change on --resume (the run used "
                f"{getattr(saved, name)!r}); changeable: "
                + ", ".join(sorted(flag_of(n) for n in RESUMABLE_OPTIONS))
            )
    placement = {"runs_root": str(run_dir.parent), "run_id": run_dir.name}
    cfg = dataclasses.replace(saved, **{**explicit, **placement})
    if "profile_steps" not in explicit:  # the saved range, cut to a lowered --steps
        cfg = dataclasses.replace(cfg, profile_steps=_clip_range(saved.profile_steps, cfg.steps))
    return cfg


def _clip_range(text: str, steps: int) -> str:
    """A valid saved ``--profile-steps`` range cut to ``steps`` ('' when it starts beyond)."""
    first, _, last = text.partition(":")
    if not text or int(first) > steps:
        return ""
    return f"{first}:{min(int(last), steps)}"


def _check_steps_left(cfg: TrainConfig, latest: int | None) -> None:
    """Refuse a resume that has nothing to train (``--steps`` is the run's total)."""
    if latest is not None and cfg.steps <= latest:
        raise TitanError(
            f"--steps {cfg.steps} leaves nothing to train: the run's last checkpoint is at step "
            f"{latest} (--steps is the run's total; give more to continue)"
        )


def _tokenizer(cfg: TrainConfig, corpus: Corpus, resume_dir: Path | None) -> Tokenizer:
    if resume_dir is not None:
        return load_tokenizer(resume_dir / TOKENIZER_FILE)
    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer)
    return train_tokenizer(corpus, cfg.vocab_size)


def _run_dir(cfg: TrainConfig, resuming: bool) -> Path:
    root = default_runs_root(cfg.runs_root)
    if root.exists() and not root.is_dir():
        raise TitanError(f"--runs-root {root} is not a directory")
    run_dir = root / (cfg.run_id or agreed_run_id(cfg.preset))
    if not resuming and (run_dir / EVENTS_FILE).exists():
        raise TitanError(
            f"--run-id {run_dir.name}: {run_dir} already holds a run (use --resume {run_dir})"
        )
    return run_dir


def _write_run_files(run_dir: Path, cfg: TrainConfig, model: ModelConfig, tok: Tokenizer) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {"train": dataclasses.asdict(cfg), "model": dataclasses.asdict(model)}
    write_json_atomic(run_dir / CONFIG_FILE, payload)
    (run_dir / TOKENIZER_FILE).write_bytes(tok.model_proto)


def train_from_cli(
    explicit: dict[str, Any], resume: str | None, launch: LaunchSettings | None = None
) -> int:
    """``titan train``: options from the command line (only those given), optional resume dir,
    and how this process joins a run of several (:mod:`titan.parallel.distributed`).

    Returns:
        Exit code: 0 completed or stopped, 1 failed. Raises TitanError for bad input.
    """
    resume_dir = Path(resume) if resume else None
    cfg = resume_options(resume_dir, explicit) if resume_dir else TrainConfig(**explicit)
    validate_train_config(cfg)
    if initialize(launch or LaunchSettings()) > 1 and cfg.layout != "spmd":
        raise TitanError(f"--layout {cfg.layout} cannot run across processes yet (spmd can)")
    return train(cfg, resume_dir)


def train(cfg: TrainConfig, resume_dir: Path | None = None) -> int:
    """Train per ``cfg``; continue the run in ``resume_dir`` when given. Returns the exit code.

    Raises:
        TitanError: bad input found before the run starts (before ``run_start``; a forced op
            provider that cannot serve the model is found while tracing, after the run dir is
            written). A run dir this call created is removed again: nothing is left behind.
    """
    import jax

    progress = TrainProgress(cfg.steps, cfg.log_every)
    corpus = open_corpus(cfg.data)
    run_dir = _run_dir(cfg, resuming=resume_dir is not None)
    checkpointer = None  # made after the checks of a fresh run: it creates its directory
    if resume_dir is not None:
        checkpointer = Checkpointer(run_dir)
        _check_steps_left(cfg, checkpointer.latest_step())
    with progress.status("preparing the tokenizer"):
        tokenizer = one_tokenizer(lambda: _tokenizer(cfg, corpus, resume_dir))
    model_cfg = model_config(cfg, tokenizer.vocab_size)
    ops = Ops(jax.default_backend(), parse_overrides(cfg.ops, source="--ops"))
    trainer = build_trainer(cfg, model_cfg, ops)
    tokens = first_then_others(
        "titan:tokens", lambda: progress.tokenize(lambda r: token_stream(corpus, tokenizer, r))
    )
    batches = PackedBatches(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, tokenizer.bos_id)
    batches.rows = batch_rows(trainer, cfg.batch_size)

    power_reader, power_info = open_reader()

    created = is_writer() and not run_dir.exists()
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
    started = bad_input = False
    try:
        state, start_step = run.restore_or_init(resume_dir is not None)
        run.watchdog.enter("compile", start_step)
        trainer.trace()
        run.record.emit(
            "run_start",
            **_run_start_fields(cfg, model_cfg, trainer, ops, tokenizer, batches),
            start_step=start_step,
            total_steps=cfg.steps,
            resumed_from_step=start_step if resume_dir else None,
            power=power_info,
        )
        started = True
        for fields in trainer.compile():
            run.record.emit("compile", **fields)
        for event_type, fields in trainer.start_events():
            run.record.emit(event_type, **fields)
        with run.profiler:  # closes a trace left open by a stop signal or an error
            step, status = run.loop(state, start_step)
        run.record.emit("run_end", status=status, step=step, signal=run.stop.signal_name or None)
        run.heartbeat.close(status, step)
    except Exception as err:  # noqa: BLE001 - every failure must reach the run record
        if isinstance(err, TitanError) and not started:
            bad_input = True
            raise  # bad input found before the run started: a one-line error, nothing recorded
        traceback.print_exc()
        run.record.emit("run_end", status="failed", step=None, error=f"{type(err).__name__}: {err}")
        run.heartbeat.close("failed", None)
        return EXIT_FAILED
    finally:
        run.stop_monitors()
        run.stop.uninstall()
        run.checkpointer.close()
        run.record.close()
        progress.close()
        if bad_input and created:
            shutil.rmtree(run_dir, ignore_errors=True)
    progress.finish(status, step, run_dir)
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
        "config": dataclasses.asdict(cfg),
        "model": dataclasses.asdict(model_cfg),
        "param_count": trainer.adapter.param_count(),
        "layout": trainer.describe(),
        "compute_dtype": str(trainer.compute_dtype),
        "ops": ops.served,
        "env": capture_environment(),
        "tokenizer": {"vocab_size": tokenizer.vocab_size, "source": cfg.tokenizer or "trained"},
        "data": {
            "source": cfg.data,
            "tokens": int(len(batches.tokens)),
            "sequences": batches.num_sequences,
        },
        "processes": process_count(),
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
        self.watchdog = Watchdog(self.cfg.watchdog_floor, self.cfg.watchdog_factor, self.on_stall)
        steps = parse_profile_steps(self.cfg.profile_steps, self.cfg.steps)
        self.profiler = StepProfiler(steps, self.record)

    def start_monitors(self) -> None:
        """Start the stall watchdog and the power sampler (background threads)."""
        self.watchdog.start()
        self.power.start()

    def stop_monitors(self) -> None:
        self.watchdog.stop()
        self.power.stop()

    def on_stall(self, stall: Stall) -> None:
        """Record a stall (on the watchdog thread, while the main thread is stuck); with
        ``--watchdog-abort 1`` end the process with :data:`EXIT_STALL` without unwinding the
        stuck thread (the last checkpoint was committed before the loop went on)."""
        self.record.emit("stall", **stall.fields())
        print(
            f"titan: stall: {stall.phase} of step {stall.step} has taken {stall.elapsed_s:.1f} s "
            f"(allowance {stall.threshold_s:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        if not self.cfg.watchdog_abort:
            return
        self.record.emit(
            "run_end",
            status="failed",
            step=stall.step,
            reason="stall",
            error=f"stalled in {stall.phase} for {stall.elapsed_s:.1f} s",
        )
        self.record.close()
        os._exit(EXIT_STALL)

    def restore_or_init(self, resuming: bool) -> tuple[TrainState, int]:
        """(state, step): the latest checkpoint's when resuming and one exists, else fresh."""
        self.watchdog.enter("checkpoint_restore", 0)
        latest = self.checkpointer.latest_step() if resuming else None
        if latest is None:
            return self.trainer.init_state(self.cfg.seed), 0
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
        self.record.emit("checkpoint", step=step, seconds=seconds, path=path)

    def loop(self, state: TrainState, step: int) -> tuple[int, str]:
        """Train until ``cfg.steps`` or a stop signal. Metrics are read one step late so the
        host never waits on the device before dispatching the next step.

        Returns:
            (last step done, ``completed`` or ``stopped``).
        """
        pending = None
        saved_step = step
        self._last_done = time.perf_counter()
        self.energy = StepEnergy(self.power)
        while step < self.cfg.steps and not self.agreement.stop_before(step):
            self.profiler.step_starts(step + 1)
            self.watchdog.enter("data_wait", step + 1)
            batch, ids = self.batches.next_batch()
            self.watchdog.enter("step", step + 1)
            if step + 1 == self.cfg.debug_stall_at_step:
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
            if step % self.cfg.checkpoint_every == 0:
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
        tokens = self.cfg.batch_size * self.cfg.seq_len
        event = self.record.emit(
            "step",
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
        self.progress.step(event)
        for event_type, fields in self.trainer.drain_events():
            self.record.emit(event_type, **fields)
