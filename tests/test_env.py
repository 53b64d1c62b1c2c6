"""Environment capture: recorded variables (never secrets), git state, driver versions."""

from __future__ import annotations

import shutil

from titan.observability.env import (
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
