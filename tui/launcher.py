"""Start ``titan train`` as a child process in its own run dir, and stop it.

The child gets an argument list (never a shell string) with only the options that differ from
:class:`titan.config.TrainConfig`'s defaults, runs in its own process group (so a stop signal
reaches it and nothing else) and writes its output to ``stdout.log`` / ``stderr.log`` in the run
dir, which is created here before the child starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from titan.config import TrainConfig, check_run_id, option_fields
from titan.data.text import check_inputs
from titan.errors import TitanError
from titan.observability.records import default_runs_root, new_run_id

STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"

# Options the console always passes explicitly, because it creates the run dir itself.
_PLACEMENT = ("runs_root", "run_id")


def train_argv(config: TrainConfig, runs_root: Path, run_id: str) -> list[str]:
    """The child's command line: ``python -m titan.cli train --runs-root R --run-id I`` followed
    by ``--flag value`` for each option of ``config`` that differs from its default."""
    argv = [sys.executable, "-m", "titan.cli", "train"]
    argv += ["--runs-root", str(runs_root), "--run-id", run_id]
    defaults = TrainConfig().flat()
    for option, value in zip(option_fields(), config.flat().values(), strict=True):
        if option.name in _PLACEMENT or value == defaults[option.name]:
            continue
        if option.kind == "bool":
            argv.append(option.flag if value else "--no-" + option.flag.removeprefix("--"))
        else:
            argv += [option.flag, option.text(value)]
    return argv


@dataclass
class LaunchedRun:
    """A ``titan train`` child started by this console.

    Attributes:
        run_dir: ``<runs root>/<run id>``, holding ``events.jsonl`` and the two log files.
        argv: the command line it was started with.
        process: the child; it leads its own process group (``pgid == pid``).
    """

    run_dir: Path
    argv: list[str]
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def returncode(self) -> int | None:
        """The exit code, or ``None`` while the child runs (never blocks)."""
        return self.process.poll()

    def stop(self) -> bool:
        """Send SIGTERM to the child's process group: the trainer finishes its step, saves a
        checkpoint, records ``run_end`` with status ``stopped`` and exits 4
        (:data:`titan.exit_codes.EXIT_STOPPED`; 0 with ``--exit-zero-on-stop``).

        Returns:
            False when the process group is already gone (nothing was signalled).
        """
        return self.signal(signal.SIGTERM)

    def signal(self, signum: signal.Signals) -> bool:
        """Send ``signum`` to the child's process group (SIGKILL: no checkpoint, no
        ``run_end``). Returns False when the group is already gone."""
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            return False
        return True


def start_run(config: TrainConfig) -> LaunchedRun:
    """Create the run dir of ``config`` and start ``titan train`` in it.

    The runs root is ``config.run.runs_root`` (or ``$TITAN_RUNS`` / ``./runs``), made absolute; the
    run id is ``config.run.run_id`` or a fresh :func:`~titan.observability.records.new_run_id`.

    Raises:
        TitanError: ``--data`` or ``--tokenizer`` that ``titan train`` would refuse (checked
            first, so that no run dir is left), or a run dir that already exists.
        OSError: when the run dir or the child cannot be created.
    """
    check_inputs(config.data.corpus, config.data.tokenizer)
    runs_root = default_runs_root(config.run.runs_root).resolve()
    run_id = config.run.run_id or new_run_id(config.model.shape.name)
    check_run_id(run_id)
    run_dir = runs_root / run_id
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError:
        raise TitanError(f"--run-id {run_id!r} already exists in {runs_root}") from None
    argv = train_argv(config, runs_root, run_id)
    with open(run_dir / STDOUT_LOG, "wb") as out, open(run_dir / STDERR_LOG, "wb") as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    return LaunchedRun(run_dir, argv, process)
