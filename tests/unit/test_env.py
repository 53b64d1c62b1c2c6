"""Environment capture: recorded variables (never secrets), git state, driver versions."""

from __future__ import annotations

import shutil

from titan.telemetry.env import (
    JAX_OPTIONS,
    accelerator_versions,
    capture_environment,
    git_commit,
    git_dirty,
    recorded_env_vars,
)


def test_env_vars_keep_xla_and_collectives_and_never_secrets():
    environ = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "NCCL_DEBUG": "INFO",
        "RCCL_MSCCL_ENABLE": "0",
        "JAX_PLATFORMS": "cpu",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_IB_PASSWORD": "hunter2",
        "JAX_API_TOKEN": "t",
        "HF_TOKEN": "t",
        "XLA_SECRET_SAUCE": "s",
        "CUDA_KEY": "k",
        "HOME": "/root",
        "PATH": "/usr/bin",
    }
    assert recorded_env_vars(environ) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "JAX_PLATFORMS": "cpu",
        "NCCL_DEBUG": "INFO",
        "RCCL_MSCCL_ENABLE": "0",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    }


def test_git_state_outside_a_checkout_is_null(tmp_path):
    assert git_commit(tmp_path) is None and git_dirty(tmp_path) is None


def test_capture_records_git_drivers_and_variables(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_AUTH_KEY", "do-not-record")
    env = capture_environment()
    assert env["env_vars"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "NCCL_AUTH_KEY" not in env["env_vars"]
    assert "do-not-record" not in str(env)
    if env["git_commit"] is not None:
        assert len(env["git_commit"]) == 40 and isinstance(env["git_dirty"], bool)
    versions = accelerator_versions()
    if shutil.which("nvidia-smi") is None:
        assert versions["nvidia_driver"] is None and versions["cuda"] is None
    assert isinstance(versions["jax_plugins"], dict)


def test_env_vars_are_an_allow_list_that_leaves_credentials_out():
    environ = {
        "JAX_PASSWD": "hunter2",
        "CUDA_CREDENTIALS": "c",
        "JAX_GCS_PRIVATE_CERT": "-----BEGIN PRIVATE KEY-----",
        "JAX_SOMETHING_NEW": "x",
        "XLA_PASSWORD_FILE": "/secret",
        "RCCL_AUTH_TOKEN": "t",
        "NCCL_IB_HCA": "mlx5",
        "RCCL_ENABLE_HIPGRAPH": "1",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
        "JAX_ENABLE_X64": "1",
        "JAX_COMPILATION_CACHE_DIR": "/cache",
        "HIP_VISIBLE_DEVICES": "0",
        "ROCR_VISIBLE_DEVICES": "GPU-abc",
        "OMP_NUM_THREADS": "8",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=true",
    }
    assert recorded_env_vars(environ) == {
        "HIP_VISIBLE_DEVICES": "0",
        "JAX_COMPILATION_CACHE_DIR": "/cache",
        "JAX_ENABLE_X64": "1",
        "LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=true",
        "NCCL_IB_HCA": "mlx5",
        "OMP_NUM_THREADS": "8",
        "RCCL_ENABLE_HIPGRAPH": "1",
        "ROCR_VISIBLE_DEVICES": "GPU-abc",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
    }


def test_every_recorded_jax_name_is_a_jax_config_option():
    import jax

    for name in JAX_OPTIONS:
        assert name.lower() in jax.config.values, name
