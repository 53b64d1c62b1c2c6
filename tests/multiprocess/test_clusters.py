"""``--distributed auto`` on a Cloud TPU VM, simulated on CPU processes.

``JAX_FORCE_TPU_INIT`` makes JAX take the host for a Cloud TPU VM; ``TPU_WORKER_HOSTNAMES`` and
``TPU_WORKER_ID`` describe a GKE TPU slice; ``GCE_METADATA_IP`` points the metadata server at a
closed port, so that any value the environment does not give fails as on a TPU VM without one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from titan.errors import TitanError

JOIN = """
from titan.parallel.distributed import LaunchSettings, initialize
from titan.errors import TitanError
try:
    count = initialize(LaunchSettings())
except TitanError as err:
    raise SystemExit(f"error: {err}")
import jax
print("processes", count, jax.process_count(), jax.process_index())
"""


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed once the probe is


def tpu_vm(**env: str) -> dict[str, str]:
    """The environment of a simulated TPU VM whose metadata server does not answer."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_"))}
    return {
        **base,
        "JAX_PLATFORMS": "cpu",
        "JAX_FORCE_TPU_INIT": "1",
        "GCE_METADATA_IP": f"127.0.0.1:{closed_port()}",
        **env,
    }


def join(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", JOIN],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_tpu_vm_whose_metadata_server_does_not_answer_runs_one_process_saying_so():
    out, err = join(tpu_vm(TPU_WORKER_HOSTNAMES="127.0.0.1")).communicate(timeout=120)
    assert out.split() == ["processes", "1", "1", "0"], err
    assert err.strip().splitlines() == [
        "titan: one process on this TPU VM: its TPU slice could not be detected "
        "(GkeTpuCluster: the cloud metadata server did not answer)"
    ]


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"TPU_WORKER_HOSTNAMES": "127.0.0.1", "MEGASCALE_NUM_SLICES": "1"}, "a single-host"),
        ({}, "no multi-host TPU slice detected"),
    ],
)
def test_a_single_host_tpu_vm_runs_one_process_saying_so(env, why):
    out, err = join(tpu_vm(**env)).communicate(timeout=120)
    assert out.split() == ["processes", "1", "1", "0"], err
    assert len(err.strip().splitlines()) == 1 and why in err


def test_the_processes_of_a_tpu_slice_join_as_detected():
    slice_env = {
        "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1",
        "MEGASCALE_NUM_SLICES": "1",
        "MEGASCALE_SLICE_ID": "0",
        "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1",
        "JAX_COORDINATOR_PORT": str(closed_port()),
        "JAX_NUM_CPU_DEVICES": "2",
    }
    procs = [join(tpu_vm(**slice_env, TPU_WORKER_ID=str(i))) for i in (0, 1)]
    try:
        outs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [out.split() for out, _ in outs] == [
        ["processes", "2", "2", "0"],
        ["processes", "2", "2", "1"],
    ], outs
    assert "process 1 joining 2 processes at 127.0.0.1:" in outs[1][1]
    assert "(GkeTpuCluster)" in outs[1][1]


def test_a_tpu_slice_whose_coordinator_cannot_be_read_is_a_one_line_error():
    env = tpu_vm(TPU_WORKER_HOSTNAMES="127.0.0.1,127.0.0.1", MEGASCALE_NUM_SLICES="1")
    out, err = join({**env, "TPU_WORKER_ID": "0"}).communicate(timeout=120)
    assert not out
    assert err.strip().splitlines() == [
        "error: a TPU slice of 2 processes is detected (GkeTpuCluster), but its coordinator "
        "cannot be read (the cloud metadata server did not answer): give --coordinator and "
        "--process-id"
    ]


def test_jax_cluster_detection_is_what_the_wrapper_relies_on():
    """Pins the private JAX names titan.parallel.clusters uses."""
    from jax._src import cloud_tpu_init
    from jax._src.clusters import ClusterEnv
    from jax._src.clusters.cloud_tpu_cluster import BaseTpuCluster, GceTpuCluster, GkeTpuCluster

    from titan.parallel.clusters import detected_cluster, on_cloud_tpu_vm

    assert {GceTpuCluster, GkeTpuCluster} <= set(ClusterEnv._cluster_types)
    assert all(issubclass(c, BaseTpuCluster) for c in (GceTpuCluster, GkeTpuCluster))
    for env in ClusterEnv._cluster_types:
        assert isinstance(env.opt_in_only_method, bool)
        for method in ("is_env_present", "get_process_count", "get_process_id"):
            assert callable(getattr(env, method))
    assert callable(BaseTpuCluster.get_coordinator_address)
    assert isinstance(cloud_tpu_init.running_in_cloud_tpu_vm, bool)
    assert on_cloud_tpu_vm() is False  # the test host is no TPU VM (JAX_FORCE_TPU_INIT unset)
    assert detected_cluster(1) is None


def test_a_job_whose_process_count_cannot_be_read_is_a_titan_error(monkeypatch):
    from titan.parallel.clusters import detected_cluster

    slurm = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "a", "SLURM_NTASKS": "many"}
    for name, value in {**slurm, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(TitanError, match="SlurmCluster job is detected, but its process count"):
        detected_cluster(1)


@pytest.mark.slow
def test_the_default_train_run_completes_on_a_tpu_vm_without_a_metadata_server(tmp_path):
    argv = [sys.executable, "-m", "titan.cli", "train", "--steps", "2"]
    env = tpu_vm(TPU_WORKER_HOSTNAMES="127.0.0.1")  # its slice is read from the metadata server
    proc = subprocess.run(
        [*argv, "--runs-root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "the cloud metadata server did not answer" in proc.stderr
    assert "HTTPConnectionPool" not in proc.stderr and "run completed at step 2" in proc.stderr
