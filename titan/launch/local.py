"""N local processes of one run, each with its share of the devices (``titan launch``).

Each child is ``python -m titan.cli train ... --coordinator 127.0.0.1:PORT --num-processes N
--process-id I`` on a free port; JAX's distributed runtime joins them
(:mod:`titan.parallel.distributed`). Devices are split by the environment each child starts
with:

- CPU: ``JAX_NUM_CPU_DEVICES`` (``jax_num_cpu_devices``) devices per process, and
  ``--xla_force_host_platform_device_count`` taken out of ``XLA_FLAGS`` (it would override it).
- GPU: ``CUDA_VISIBLE_DEVICES``, consecutive GPUs per process.

SIGTERM, SIGINT and SIGHUP are forwarded to every child (each one's run then stops after the
same step as the others). Each line a child prints comes out prefixed ``[I]``. When a child
fails (exits non-zero, other than a stop's :data:`titan.exit_codes.EXIT_STOPPED`) the others are
sent SIGTERM at once and SIGKILL after :data:`KILL_AFTER_S` (a process waiting in a collective
for a dead peer would otherwise wait for JAX's heartbeat timeout). The exit code is the worst
child's (:func:`titan.exit_codes.worst_exit_code`: a failure over a stop over completion; a
child killed by signal S counts as 128 + S), of the children that ended by themselves: one the
launcher stopped because another failed does not hide that failure's code.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from titan.errors import TitanError
from titan.exit_codes import EXIT_OK, EXIT_STOPPED, worst_exit_code

PLATFORMS = ("auto", "cpu", "gpu")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KILL_AFTER_S = 45.0  # past titan.trainer.peers.LOST_AFTER_S: survivors first record the lost one
_FORCE_DEVICES = re.compile(r"--xla_force_host_platform_device_count=\S*")


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
    if devices_per_process is not None and devices_per_process < 1:
        raise TitanError(f"--devices-per-process {devices_per_process}: must be at least 1")
    base = {**env, "PYTHONUNBUFFERED": "1"}
    if platform == "cpu":
        flags = _FORCE_DEVICES.sub("", env.get("XLA_FLAGS", "")).strip()
        per = str(devices_per_process or 1)
        return [
            {**base, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, "JAX_NUM_CPU_DEVICES": per}
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
        {**base, "CUDA_VISIBLE_DEVICES": ",".join(gpus[i * per_gpu : (i + 1) * per_gpu])}
        for i in range(processes)
    ]


def child_command(train_args: list[str], port: int, processes: int, index: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "titan.cli",
        *train_args,
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        str(processes),
        "--process-id",
        str(index),
    ]


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell reports it (128 + S for a child killed by signal S)."""
    return 128 - returncode if returncode < 0 else returncode


def _relay(index: int, stream: TextIO, out: TextIO, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            out.write(f"[{index}] {line}")
            out.flush()


def launch_local(
    train_args: list[str],
    processes: int,
    devices_per_process: int | None = None,
    platform: str = "auto",
    out: TextIO | None = None,
) -> int:
    """Run ``titan <train_args>`` as ``processes`` local processes of one run; returns the
    worst child's exit code.

    Raises:
        TitanError: ``train_args`` is not a ``train`` command, or the devices do not split.
    """
    if not train_args or train_args[0] != "train":
        raise TitanError("titan launch runs 'train': give it as -- train OPTIONS")
    envs = child_envs(
        processes,
        devices_per_process,
        resolve_platform(platform, dict(os.environ)),
        dict(os.environ),
    )
    port = free_port()
    out = out or sys.stdout
    lock = threading.Lock()
    children = [
        subprocess.Popen(
            child_command(train_args, port, processes, i),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, env in enumerate(envs)
    ]
    relays = [
        threading.Thread(target=_relay, args=(i, c.stdout, out, lock), daemon=True)
        for i, c in enumerate(children)
    ]
    for relay in relays:
        relay.start()

    def forward(signum: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        stopped = _wait(children)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for relay in relays:
        relay.join(timeout=5)
    ended = [c for i, c in enumerate(children) if i not in stopped]
    return worst_exit_code(exit_code(c.returncode) for c in ended)


def _wait(children: list[subprocess.Popen]) -> set[int]:
    """Wait for every child; after one fails, SIGTERM the rest, and SIGKILL them after
    :data:`KILL_AFTER_S`. Returns the indices of the children it signalled."""
    kill_at, stopped = None, set()
    while any(c.poll() is None for c in children):
        failed = any(c.returncode not in (None, EXIT_OK, EXIT_STOPPED) for c in children)
        if failed and kill_at is None:
            kill_at = time.monotonic() + KILL_AFTER_S
            for i, child in enumerate(children):
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
                    stopped.add(i)
        if kill_at is not None and time.monotonic() > kill_at:
            for child in children:
                if child.poll() is None:
                    child.kill()
        time.sleep(0.1)
    return stopped
