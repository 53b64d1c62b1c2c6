"""N local processes of one run, each with its share of the devices (``titan launch``).

Each child is ``python -P -m titan.cli train ... --coordinator 127.0.0.1:PORT --num-processes N
--process-id I`` on a free port; JAX's distributed runtime joins them
(:mod:`titan.parallel.distributed`). Devices are split by the environment each child starts
with:

- CPU: ``JAX_NUM_CPU_DEVICES`` (``jax_num_cpu_devices``) devices per process, and
  ``--xla_force_host_platform_device_count`` taken out of ``XLA_FLAGS`` (it would override it).
- GPU: ``CUDA_VISIBLE_DEVICES``, consecutive GPUs per process.

Each child is told that all the devices it is given are its own: ``JAX_LOCAL_DEVICE_IDS``
(read by ``jax.distributed.initialize`` as its ``local_device_ids``) lists them, so JAX's cluster
detection fills nothing in. And a child does not inherit the variables of a managed launch the
launcher may run inside (:data:`MANAGED_LAUNCH_PREFIXES`: an ``srun`` step's ``SLURM_*``, Open
MPI's ``OMPI_*``, PMI's): they describe the launcher's task, not the child's; under them JAX
would narrow a child's devices to ``[SLURM_LOCALID]`` (one GPU of its share, or one it cannot
see).

SIGTERM, SIGINT and SIGHUP are forwarded to every child (each one's run then stops after the
same step as the others), from before the first child starts (:class:`Forwarder`); children
still running :data:`STOP_GRACE_S` after the first, or at a second one, get SIGKILL (a child
blocked in a native call, such as JAX's distributed start-up waiting for peers, cannot act on
the signal). Children never outlive the launcher: each starts
with ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux (the kernel kills it when the launcher dies,
even by SIGKILL), and the launcher kills any child still running when it returns or raises.
``--processes`` is at most :data:`PROCESSES_PER_CPU` per CPU this process may run on
(``os.sched_getaffinity``). Each line a child prints comes out prefixed ``[I]``, on the
launcher's stdout or stderr as the child printed it; the launcher's own lines go to stderr. When
a child fails (exits non-zero, other than a stop's :data:`titan.exit_codes.EXIT_STOPPED`) while
others run, a line names it and its code (ahead of what the others print as they stop), and they
are sent SIGTERM at once and SIGKILL after :data:`KILL_AFTER_S` (a process waiting in a
collective for a dead peer would otherwise wait for JAX's heartbeat timeout). The exit code is
the worst child's (:func:`titan.exit_codes.worst_exit_code`: a failure over a stop over
completion; a child killed by signal S counts as 128 + S), of the children that ended by
themselves: one the launcher stopped because another failed does not hide that failure's code. A
child that dies of a signal by itself is said in one line, with the reason its native abort text
gave; that text (a C++ exception's, a fatal log's stack trace) stays off the terminal
(:mod:`titan.launch.aborts`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from titan import cli_command
from titan.cpus import usable_cpus
from titan.errors import TitanError
from titan.exit_codes import EXIT_OK, EXIT_STOPPED, worst_exit_code
from titan.launch.aborts import AbortText

PLATFORMS = ("auto", "cpu", "gpu")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KILL_AFTER_S = (
    45.0  # past titan.telemetry.heartbeat.HEARTBEAT_TIMEOUT_S: survivors first record the lost one
)
# A stop checkpoints first: the grace covers writing a large model's checkpoint to local disk.
STOP_GRACE_S = 300.0
# Each child is one JAX process (an interpreter, XLA's thread pool, a gloo or NCCL peer); past a
# few per CPU they only time-slice, and a starved one misses the coordination service's heartbeats.
PROCESSES_PER_CPU = 4
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# The train flags each child gets from the launcher (:func:`child_command`).
LAUNCHER_FLAGS = ("--coordinator", "--num-processes", "--process-id")
_FORCE_DEVICES = re.compile(r"--xla_force_host_platform_device_count=\S*")
# The variables of a managed launch (SLURM, Open MPI, PMI/PMIx) that say which task of which
# job a process is; JAX's cluster detection (jax/_src/clusters/) reads SLURM's and Open MPI's.
MANAGED_LAUNCH_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def visible_gpus(env: dict[str, str]) -> list[str]:
    """GPU ids a child may be given: ``CUDA_VISIBLE_DEVICES`` if set, else /dev/nvidia<N>."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    found = [p.name[len("nvidia") :] for p in Path("/dev").glob("nvidia[0-9]*")]
    return sorted(found, key=int)


def resolve_platform(platform: str, env: dict[str, str]) -> str:
    """``cpu`` or ``gpu``: ``auto`` is gpu when GPUs are visible and JAX_PLATFORMS allows it."""
    if platform != "auto":
        return platform
    allowed = env.get("JAX_PLATFORMS", "")
    if allowed and not {"cuda", "gpu"} & set(allowed.split(",")):
        return "cpu"
    return "gpu" if visible_gpus(env) else "cpu"


def child_envs(
    processes: int, devices_per_process: int | None, platform: str, env: dict[str, str]
) -> list[dict[str, str]]:
    """The environment of each child.

    Raises:
        TitanError: fewer GPUs than ``processes`` x ``devices_per_process``.
    """
    if processes < 1:
        raise TitanError(f"--processes {processes}: must be at least 1")
    if processes > max_processes():
        raise TitanError(
            f"--processes {processes}: this host holds at most {max_processes()} "
            f"({PROCESSES_PER_CPU} per CPU, {usable_cpus()} CPUs)"
        )
    if devices_per_process is not None and devices_per_process < 1:
        raise TitanError(f"--devices-per-process {devices_per_process}: must be at least 1")
    base = {k: v for k, v in env.items() if not k.startswith(MANAGED_LAUNCH_PREFIXES)}
    base["PYTHONUNBUFFERED"] = "1"
    if platform == "cpu":
        flags = _FORCE_DEVICES.sub("", env.get("XLA_FLAGS", "")).strip()
        per = devices_per_process or 1
        return [
            {
                **base,
                "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": flags,
                "JAX_NUM_CPU_DEVICES": str(per),
                "JAX_LOCAL_DEVICE_IDS": _ids(per),
            }
            for _ in range(processes)
        ]
    gpus = visible_gpus(env)
    per_gpu = devices_per_process or len(gpus) // processes
    if per_gpu < 1 or per_gpu * processes > len(gpus):
        raise TitanError(
            f"--processes {processes} x --devices-per-process {per_gpu or 1} needs "
            f"{processes * max(per_gpu, 1)} GPUs, {len(gpus)} visible"
        )
    return [
        {
            **base,
            "CUDA_VISIBLE_DEVICES": ",".join(gpus[i * per_gpu : (i + 1) * per_gpu]),
            "JAX_LOCAL_DEVICE_IDS": _ids(per_gpu),
        }
        for i in range(processes)
    ]


def _ids(count: int) -> str:
    """``0,1,...,count-1``: every device a child is given (its ordinals among them)."""
    return ",".join(str(i) for i in range(count))


def max_processes() -> int:
    """The most ``--processes`` this host holds: :data:`PROCESSES_PER_CPU` x :func:`usable_cpus`."""
    return PROCESSES_PER_CPU * usable_cpus()


def _die_with(parent_pid: int, prctl: Callable[..., int]) -> None:
    """In a child before exec (Linux): SIGKILL when the launcher dies; exit if it already has
    (it died between the fork and here)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """One child, its stdout and stderr piped apart; on Linux it dies with this process
    (:func:`_die_with`)."""
    die_with = None
    if sys.platform == "linux":  # libc looked up before the fork: the child only calls it
        die_with = functools.partial(_die_with, os.getpid(), ctypes.CDLL(None).prctl)
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with,
    )


def child_command(train_args: list[str], port: int, processes: int, index: int) -> list[str]:
    return cli_command(
        *train_args,
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        str(processes),
        "--process-id",
        str(index),
    )


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell reports it (128 + S for a child killed by signal S)."""
    return 128 - returncode if returncode < 0 else returncode


# gloo's rendezvous lines ("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of
# connected peer ranks is : 1"), shown only with --all-logs: its C++ stream is not the Python
# one, so a line of it can arrive cut at any point, the rest on a line of its own.
GLOO_MARKS = ("[Gloo] ", "Expected number of connected peer ranks is")


def is_gloo(line: str) -> bool:
    """Whether ``line`` is (a piece of) gloo's rendezvous line (:data:`GLOO_MARKS`)."""
    return any(mark in line for mark in GLOO_MARKS)


HIDDEN_TAIL_LINES = 50  # of a process whose output is hidden, shown when it fails


def _relay(
    index: int,
    stream: TextIO,
    out: TextIO,
    lock: threading.Lock,
    abort: AbortText | None,
    tail: deque | None,
    all_logs: bool,
) -> None:
    """Copy the lines of one of a child's streams to ``out`` (the launcher's stream of the same
    kind) as ``[index] line`` (gloo's only with ``all_logs``); into ``tail`` instead, with
    ``out``, (gloo's left out too) when its output is hidden (``tail`` is None when it is
    shown). A native abort's text (on stderr: ``abort`` is None for stdout) is kept off the
    terminal: it is said in one line once the child is dead."""
    for line in stream:
        if (abort is not None and abort.take(line)) or (not all_logs and is_gloo(line)):
            continue
        if tail is not None:
            tail.append((out, line))
        else:
            with lock:
                out.write(f"[{index}] {line}")
                out.flush()


def launch_local(
    train_args: list[str],
    processes: int,
    devices_per_process: int | None = None,
    platform: str = "auto",
    out: TextIO | None = None,
    all_logs: bool = False,
) -> int:
    """Run ``titan <train_args>`` as ``processes`` local processes of one run; returns the
    worst child's exit code. The output shown is process 0's (every process's with
    ``all_logs``); a hidden process's last :data:`HIDDEN_TAIL_LINES` lines are shown when it
    fails.

    Raises:
        TitanError: ``train_args`` is not a ``train`` command, gives a flag of
            :data:`LAUNCHER_FLAGS`, or the devices do not split.
    """
    if not train_args or train_args[0] != "train":
        raise TitanError("titan launch runs 'train': give it as -- train OPTIONS")
    _check_train_options(train_args[1:])
    envs = child_envs(
        processes,
        devices_per_process,
        resolve_platform(platform, dict(os.environ)),
        dict(os.environ),
    )
    port = free_port()
    out = out or sys.stdout
    forwarder = Forwarder()
    try:
        with forwarder.installed():  # a stop while they start reaches each one started
            for i, env in enumerate(envs):
                forwarder.add(_start(child_command(train_args, port, processes, i), env))
            return supervise(forwarder.children, out, all_logs, forwarder)
    finally:
        for child in forwarder.children:
            if child.poll() is None:
                child.kill()


class Forwarder:
    """The launcher's handler of :data:`FORWARDED_SIGNALS`: each one is sent to every child
    still running, and to each child added after it; the first sets :attr:`kill_at` to
    :data:`STOP_GRACE_S` from then, a second to now.

    Attributes:
        children: the children, in process order.
        kill_at: [monotonic seconds when the children still running get SIGKILL], or [] before
            any signal.
    """

    def __init__(self, children: list[subprocess.Popen] | None = None) -> None:
        self.children = children if children is not None else []
        self.kill_at: list[float] = []
        self._signum: int | None = None

    def __call__(self, signum: int, frame: object) -> None:
        self.kill_at[:] = [time.monotonic() + (STOP_GRACE_S if not self.kill_at else 0.0)]
        self._signum = signum
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum)

    def add(self, child: subprocess.Popen) -> None:
        """Count ``child`` among the children (sent the stop signal already received, if any)."""
        self.children.append(child)
        if self._signum is not None:
            child.send_signal(self._signum)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """This handler for :data:`FORWARDED_SIGNALS` in the body; the previous ones after."""
        previous = {sig: signal.signal(sig, self) for sig in FORWARDED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _check_train_options(options: list[str]) -> None:
    """Refuse the train options that the launch decides: a flag of :data:`LAUNCHER_FLAGS`, or
    ``--distributed off`` (its processes are one run over JAX's distributed runtime). argparse
    takes a unique prefix of a flag as the flag, and a value after ``=`` or as the next word.

    Raises:
        TitanError: naming the flag.
    """
    for i, arg in enumerate(options):
        name, _, value = arg.partition("=")
        if not name.startswith("--") or len(name) <= 2:
            continue
        given = [flag for flag in LAUNCHER_FLAGS if flag.startswith(name)]
        if given:
            raise TitanError(
                f"{given[0]} is set by titan launch for each process; leave it out of the "
                "train options"
            )
        value = value or (options[i + 1] if i + 1 < len(options) else "")
        if "--distributed".startswith(name) and value == "off":
            raise TitanError(
                "--distributed off: titan launch runs its processes as one run over JAX's "
                "distributed runtime; leave it out, or run titan train alone"
            )


def supervise(
    children: list[subprocess.Popen],
    out: TextIO,
    all_logs: bool = False,
    forwarder: Forwarder | None = None,
    err: TextIO | None = None,
) -> int:
    """Relay the children's lines (process 0's, or every process's with ``all_logs``): their
    stdout to ``out``, their stderr to ``err`` (default: this process's stderr), which also gets
    the launcher's own lines (a failed process, a death); forward stop signals (through
    ``forwarder``, or one of its own over ``children``), wait; the worst child's exit code."""
    err = err or sys.stderr
    forwarder = forwarder or Forwarder(children)
    lock = threading.Lock()
    aborts = [AbortText() for _ in children]
    tails: list[deque[tuple[TextIO, str]] | None] = [
        None if all_logs or i == 0 else deque(maxlen=HIDDEN_TAIL_LINES)
        for i in range(len(children))
    ]
    relays = [
        threading.Thread(
            target=_relay, args=(i, pipe, to, lock, abort, tails[i], all_logs), daemon=True
        )
        for i, c in enumerate(children)
        for pipe, to, abort in (
            (c.stdout, out, aborts[i] if c.stderr is None else None),  # None: stderr merged in
            (c.stderr, err, aborts[i]),
        )
        if pipe is not None
    ]
    for relay in relays:
        relay.start()

    def say(line: str) -> None:
        with lock:
            err.write(line)
            err.flush()

    with forwarder.installed():
        stopped = _wait(children, forwarder.kill_at, say)
    for relay in relays:
        relay.join(timeout=5)
    for i, (child, tail) in enumerate(zip(children, tails, strict=True)):
        if tail and exit_code(child.returncode) not in (EXIT_OK, EXIT_STOPPED):
            for stream, text in tail:
                stream.write(f"[{i}] {text}")
        death = aborts[i].death_line(i, child.pid, child.returncode)
        if death and i not in stopped:
            err.write(death)
    out.flush()
    err.flush()
    ended = [c for i, c in enumerate(children) if i not in stopped]
    return worst_exit_code(exit_code(c.returncode) for c in ended)


def _wait(
    children: list[subprocess.Popen], kill_at: list[float], say: Callable[[str], None]
) -> set[int]:
    """Wait for every child; after one fails, ``say`` which (before the lines the others print
    as they stop), SIGTERM the rest, and SIGKILL them after :data:`KILL_AFTER_S`; SIGKILL any
    still running at ``kill_at[0]`` (a forwarded stop's deadline) too. Returns the indices of
    the children it signalled after a failure."""
    stopped: set[int] = set()
    failure_seen = False
    while [c.poll() for c in children].count(None):  # every child polled: each one's code is seen
        failed = [
            i for i, c in enumerate(children) if c.returncode not in (None, EXIT_OK, EXIT_STOPPED)
        ]
        if failed and not failure_seen:
            failure_seen = True
            code = exit_code(children[failed[0]].returncode)
            if not kill_at:  # after a forwarded stop, a child's end is no news
                say(f"titan launch: process {failed[0]} exited {code}; stopping the others\n")
            deadline = time.monotonic() + KILL_AFTER_S
            kill_at[:] = [min(kill_at + [deadline])]
            for i, child in enumerate(children):
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
                    stopped.add(i)
        if kill_at and time.monotonic() > kill_at[0]:
            for child in children:
                if child.poll() is None:
                    child.kill()
        time.sleep(0.1)
    return stopped
