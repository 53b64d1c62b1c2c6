"""JAX's own cluster detection, as ``jax.distributed.initialize`` runs it: the one use of
``jax._src.clusters`` and ``jax._src.cloud_tpu_init`` in Titan (JAX has no public API for it;
``tests/multiprocess/test_clusters.py`` pins what is used here).

JAX tries each registered cluster type (``ClusterEnv._cluster_types``: SLURM, Open MPI,
Kubernetes, a Cloud TPU VM's slice on GCE or GKE) in order, skipping the opt-in-only ones, and
takes the first whose ``is_env_present()`` holds. A TPU slice is read from environment variables
(``TPU_WORKER_HOSTNAMES``, ``MEGASCALE_NUM_SLICES``, ...) and, for those not set, from the
cloud's metadata server (``metadata.google.internal``, or ``GCE_METADATA_IP``): on a TPU VM
without one, the read raises an HTTP connection error (requests' ``ConnectionError``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from titan.errors import TitanError, first_line

if TYPE_CHECKING:
    from jax._src.clusters.cloud_tpu_cluster import BaseTpuCluster


@dataclass(frozen=True)
class Cluster:
    """A cluster JAX's detection found.

    Attributes:
        name: the cluster type's class name (``SlurmCluster``, ``GkeTpuCluster``, ...).
        processes: the run's process count as the cluster reports it.
        coordinator: ``HOST:PORT`` of process 0, read here for a TPU slice of several
            processes (so that a metadata server that does not answer is caught here, not in
            ``jax.distributed.initialize``); None: JAX reads it when joining.
        process_id: this process's index, read with ``coordinator``; else None.
    """

    name: str
    processes: int
    coordinator: str | None = None
    process_id: int | None = None


class TpuDetectionFailed(Exception):
    """JAX's TPU slice detection raised (typically: no metadata server answers). The run is
    then one process: the message says why in a few words."""


def on_cloud_tpu_vm() -> bool:
    """Whether JAX found a Cloud TPU VM at import (libtpu and TPU chips present, or
    ``JAX_FORCE_TPU_INIT`` set): ``jax._src.cloud_tpu_init.running_in_cloud_tpu_vm``."""
    from jax._src import cloud_tpu_init

    return bool(cloud_tpu_init.running_in_cloud_tpu_vm)


def detected_cluster(timeout_s: int) -> Cluster | None:
    """The cluster JAX's own detection finds here, or None. For a TPU slice of several
    processes, its coordinator (waiting up to ``timeout_s`` seconds for its host name to
    resolve; port ``JAX_COORDINATOR_PORT`` or JAX's default) and this process's index too.

    Raises:
        TpuDetectionFailed: a TPU cluster type raised while detecting or reading its process
            count (the metadata server did not answer, or answered nonsense).
        TitanError: a TPU slice of several processes whose coordinator or process index
            cannot be read; another cluster type whose process count cannot be read from its
            environment.
    """
    from jax._src.clusters import ClusterEnv
    from jax._src.clusters.cloud_tpu_cluster import BaseTpuCluster

    for env in ClusterEnv._cluster_types:
        if env.opt_in_only_method:
            continue
        if issubclass(env, BaseTpuCluster):
            try:
                present = env.is_env_present()
                processes = int(env.get_process_count()) if present else 0
            except Exception as err:  # noqa: BLE001 - any failure of detection is "no slice"
                raise TpuDetectionFailed(f"{env.__name__}: {_why(err)}") from err
            if present:
                return _tpu_slice(env, processes, timeout_s)
            continue
        if env.is_env_present():
            try:
                return Cluster(env.__name__, int(env.get_process_count()))
            except (ValueError, TypeError, KeyError) as err:
                raise TitanError(
                    f"a {env.__name__} job is detected, but its process count cannot be read "
                    f"from its environment ({err})"
                ) from None
    return None


def _tpu_slice(env: type[BaseTpuCluster], processes: int, timeout_s: int) -> Cluster:
    """A detected TPU slice of ``processes`` processes, with its coordinator and this process's
    index where there are several."""
    if processes == 1:
        return Cluster(env.__name__, 1)
    try:
        port = os.environ.get("JAX_COORDINATOR_PORT")  # as jax.distributed.initialize reads it
        coordinator = env.get_coordinator_address(timeout_s, port)
        process_id = int(env.get_process_id())
    except Exception as err:  # noqa: BLE001 - said in one line
        raise TitanError(
            f"a TPU slice of {processes} processes is detected ({env.__name__}), but its "
            f"coordinator cannot be read ({_why(err)}): give --coordinator and --process-id"
        ) from None
    return Cluster(env.__name__, processes, coordinator, process_id)


def _why(err: Exception) -> str:
    """Why a TPU slice's detection failed, in a few words."""
    if isinstance(err, OSError):  # requests' errors are OSErrors
        return "the cloud metadata server did not answer"
    return f"{type(err).__name__}: {first_line(err)}"
