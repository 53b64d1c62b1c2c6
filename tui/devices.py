"""How many devices a run launched from the console would see, asked of a child process.

The console never initialises JAX (it would take a GPU for as long as it runs): a short-lived
``python -c`` in the run's environment (:func:`tui.launcher.child_env`: ``JAX_PLATFORMS``,
``XLA_FLAGS``, ``CUDA_VISIBLE_DEVICES``, ...) prints ``len(jax.devices())`` and
``jax.default_backend()``. The answer is kept per environment for the console's session, so a
second launch does not wait for JAX again; a failed probe is not kept. It blocks for seconds:
call it from a worker, never on the UI thread.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from titan.errors import TitanError

PROBE = "import jax; print(len(jax.devices()), jax.default_backend())"
PROBE_TIMEOUT_S = 120.0  # a GPU host's first JAX start-up can take tens of seconds
# Counting devices needs none of their memory: the probe must not take a GPU's from a run.
_PROBE_SETTINGS = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@dataclass(frozen=True)
class Devices:
    """What a run in one environment sees: ``count`` devices (``len(jax.devices())``) of
    ``backend`` (``jax.default_backend()``: ``cpu``, ``gpu``, ``tpu``)."""

    count: int
    backend: str


def devices_seen(env: Mapping[str, str]) -> Devices:
    """The devices a process started with environment ``env`` sees (blocks while the probe
    runs, up to :data:`PROBE_TIMEOUT_S`; at once for an environment already asked about).

    Raises:
        TitanError: the probe failed, timed out or printed something else (one line: the last
            line of its stderr).
    """
    return _probe(tuple(sorted(env.items())))


@functools.cache
def _probe(env: tuple[tuple[str, str], ...]) -> Devices:
    failed = "cannot count the devices a run would see"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE],
            env={**dict(env), **_PROBE_SETTINGS},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise TitanError(f"{failed}: JAX did not start in {PROBE_TIMEOUT_S:.0f} s") from None
    except OSError as err:
        raise TitanError(f"{failed}: {sys.executable}: {err.strerror or err}") from None
    answer = proc.stdout.strip().splitlines()[-1:]
    words = answer[0].split() if answer else []
    if proc.returncode == 0 and len(words) == 2 and words[0].isdigit():
        return Devices(int(words[0]), words[1])
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    raise TitanError(f"{failed}: {lines[-1] if lines else f'exit code {proc.returncode}'}")
