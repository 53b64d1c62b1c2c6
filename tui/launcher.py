"""Start ``titan train`` as a child process in its own run dir, and signal any run of this host.

The child gets an argument list (never a shell string) with only the options that differ from
:class:`titan.config.TrainConfig`'s defaults (from the resumed run's saved options for a
resume), runs in its own process group (so a stop signal reaches it and nothing else) and
writes its output to ``stdout.log`` / ``stderr.log`` in the run dir, which is created here
before the child starts (a resume appends to them). ``launch.json``
(:data:`titan.analysis.liveness.LAUNCH_FILE`) records the child's identity at once, so
that any console tells a launch that failed before ``run_start`` from one still starting.

A new run whose child exits before writing a record (``events.jsonl``: it failed at start-up,
for example on a layout the devices cannot hold) leaves nothing in the runs root: once
:meth:`LaunchedRun.returncode` sees the exit, its run dir is removed and the error text kept
(:attr:`LaunchedRun.startup_error`), which the monitor shows in its stderr panel. A resume
never removes anything, and never rewrites the run's ``launch.json`` before its child has
written the new attempt's ``run_start`` (a refused resume leaves it as it was).

:func:`signal_run` signals a run's recorded process group, whoever launched it, after checking
that its pid is still the recorded process (same start time): a reused pid is never signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from titan import cli_command
from titan.analysis.liveness import FAILED, LAUNCH_FILE, STDERR_LOG, Liveness
from titan.checkpoint.resume import resume_options
from titan.config import Option, TrainConfig, check_run_id, option_fields
from titan.data.mixture import check_inputs
from titan.errors import TitanError
from titan.telemetry.heartbeat import ProcessId
from titan.telemetry.records import (
    EVENTS_FILE,
    default_runs_root,
    new_run_id,
    open_regular,
    runs_root_source,
    write_json_atomic,
)

STDOUT_LOG = "stdout.log"

# Options the console always passes explicitly, because it creates the run dir itself.
_PLACEMENT = ("runs_root", "run_id")


def train_argv(
    config: TrainConfig, runs_root: Path, run_id: str, base: TrainConfig | None = None
) -> list[str]:
    """The child's command line: ``python -P -m titan.cli train --runs-root R --run-id I``
    (:func:`titan.cli_command`) followed by ``--flag value`` for each option of ``config`` that
    differs from ``base`` (default: the defaults). With ``base`` (a resumed run's saved options)
    the placement is ``--resume <runs root>/<run id>`` instead."""
    argv = cli_command("train")
    if base is None:
        argv += ["--runs-root", str(runs_root), "--run-id", run_id]
    else:
        argv += ["--resume", str(runs_root / run_id)]
    for option, value in _changed_options(config, base or TrainConfig()):
        if option.kind == "bool":
            argv.append(option.flag if value else "--no-" + option.flag.removeprefix("--"))
        else:
            argv += [option.flag, option.text(value)]
    return argv


def _changed_options(config: TrainConfig, base: TrainConfig) -> list[tuple[Option, Any]]:
    """The options of ``config`` (but its placement) whose values differ from ``base``'s."""
    before = base.flat()
    return [
        (option, value)
        for option, value in zip(option_fields(), config.flat().values(), strict=True)
        if option.name not in _PLACEMENT and value != before[option.name]
    ]


def child_env() -> dict[str, str]:
    """The environment of a ``titan train`` child: this console's (its ``JAX_PLATFORMS``,
    ``XLA_FLAGS``, ``CUDA_VISIBLE_DEVICES``, ...), with unbuffered output."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@dataclass
class LaunchedRun:
    """A ``titan train`` child started by this console.

    Attributes:
        run_dir: ``<runs root>/<run id>``, holding ``events.jsonl`` and the two log files.
        argv: the command line it was started with.
        process: the child; it leads its own process group (``pgid == pid``).
        resumed: a ``titan train --resume`` child (its run dir is never removed).
        startup_error: ``stderr.log`` of a new run that exited before its record (its run dir
            removed), else None.
        started_s: unix seconds when the child was started.
    """

    run_dir: Path
    argv: list[str]
    process: subprocess.Popen[bytes]
    resumed: bool = False
    startup_error: str | None = None
    started_s: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.process.pid

    def returncode(self) -> int | None:
        """The exit code, or ``None`` while the child runs (never blocks). The first call that
        sees a new run's child gone without a record removes its run dir (the module
        docstring), keeping its ``stderr.log`` in :attr:`startup_error`."""
        code = self.process.poll()
        if code is not None and self.startup_error is None and not self.resumed:
            self._discard_failed_start()
        return code

    def resuming(self, started_at: float | None) -> bool:
        """Whether this is a resume still starting: its child runs and the record's latest
        ``run_start`` (``started_at``, unix s, None before any) is older than the child, so the
        new attempt has not started yet."""
        started = started_at is not None and started_at >= self.started_s
        return self.resumed and not started and self.process.poll() is None

    def failed_start(self) -> Liveness | None:
        """The state of a launch whose run dir was removed at start-up (``failed``, with the
        last line of its error), else None."""
        if self.startup_error is None:
            return None
        lines = [line.strip() for line in self.startup_error.splitlines() if line.strip()]
        reason = "exited before run_start" + (f": {lines[-1]}" if lines else "")
        return Liveness(FAILED, reason, no_control="the run has ended")

    def _discard_failed_start(self) -> None:
        """Remove the run dir of a child that exited before writing ``events.jsonl``."""
        if (self.run_dir / EVENTS_FILE).exists():
            return
        try:
            with open_regular(self.run_dir / STDERR_LOG) as f:
                self.startup_error = f.read().decode("utf-8", "replace")
        except OSError as err:
            self.startup_error = f"cannot read {STDERR_LOG}: {err.strerror or err}"
        shutil.rmtree(self.run_dir, ignore_errors=True)


def signal_run(process: ProcessId, signum: signal.Signals) -> str | None:
    """Send ``signum`` to ``process``'s recorded process group, once its pid is checked to be
    the recorded process still (its start time) and in that group. SIGTERM: the trainer
    finishes its step, saves a checkpoint, records ``run_end`` ``stopped`` and exits 4
    (:data:`titan.exit_codes.EXIT_STOPPED`); SIGKILL: no checkpoint, no ``run_end``.

    Returns:
        None when the signal was sent, else why not (one line): another host, the process is
        gone or its pid is another process now, it left the group.
    """
    if not process.local:
        return f"the run is on host {process.host}, not this one"
    gone = process.gone()
    if gone is not None:
        return gone
    try:
        if os.getpgid(process.pid) != process.pgid:
            return f"pid {process.pid} is no longer in process group {process.pgid}"
        os.killpg(process.pgid, signum)
    except ProcessLookupError:
        return f"{process.name()} is gone"
    except PermissionError:
        return f"not allowed to signal process group {process.pgid} (another user's)"
    return None


def start_run(config: TrainConfig, resume: Path | None = None) -> LaunchedRun:
    """Create the run dir of ``config`` and start ``titan train`` in it.

    The runs root is ``config.run.runs_root`` (or ``$TITAN_RUNS`` / ``./runs``), made absolute; the
    run id is ``config.run.run_id`` or a fresh :func:`~titan.telemetry.records.new_run_id`.
    With ``resume`` (a run dir) the child is ``titan train --resume <resume>`` with the options
    of ``config`` that differ from the run's saved ones, appending to its logs.

    Raises:
        TitanError: ``--data`` or ``--tokenizer`` that ``titan train`` would refuse (checked
            first, so that no run dir is left), a run dir that already exists or cannot be
            created (names ``--runs-root`` or ``$TITAN_RUNS``), or a ``resume`` dir, or an
            option changed on it, that ``titan train --resume`` would refuse.
        OSError: when the child or its log files cannot be created.
    """
    check_inputs(config.data.corpus, config.data.tokenizer)
    if resume is not None:
        run_dir, base = Path(resume).resolve(), resume_options(Path(resume), {})
        # what ``titan train --resume`` would refuse (an option that cannot change) is refused
        # here, in the form, before a child starts
        resume_options(run_dir, {o.name: v for o, v in _changed_options(config, base)})
        argv = train_argv(config, run_dir.parent, run_dir.name, base)
    else:
        runs_root = default_runs_root(config.run.runs_root).resolve()
        run_id = config.run.run_id or new_run_id(config.model.shape.name)
        check_run_id(run_id)
        run_dir = runs_root / run_id
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            raise TitanError(f"--run-id {run_id!r} already exists in {runs_root}") from None
        except OSError as error:
            source = runs_root_source(config.run.runs_root)
            raise TitanError(f"{source}: cannot create {run_dir}: {error.strerror}") from None
        argv = train_argv(config, runs_root, run_id)
    mode = "ab" if resume is not None else "wb"
    with open(run_dir / STDOUT_LOG, mode) as out, open(run_dir / STDERR_LOG, mode) as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=child_env(),
            start_new_session=True,
        )
    if resume is None:  # a resume's child names itself in its run_start
        identity = ProcessId(socket.gethostname(), process.pid, process.pid, _started(process.pid))
        write_json_atomic(run_dir / LAUNCH_FILE, {**identity.as_dict(), "argv": argv})
    return LaunchedRun(run_dir, argv, process, resumed=resume is not None)


def _started(pid: int) -> float:
    """The start time of a child just started (now, if it is already gone)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return time.time()
