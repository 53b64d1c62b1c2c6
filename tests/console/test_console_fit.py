"""The launch form refuses a layout that ``titan train`` would refuse, with the same line and
before any run dir is made, counting the devices in a child process of the run's environment
(titan/parallel/fit.py, tui/devices.py, tui/screens/launch.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from console_helpers import fill_form, notes_into, tiny_form_texts, wait_until

from titan.config import TrainConfig
from titan.errors import TitanError
from titan.parallel.fit import check_layout, microbatch_rows, resolve_mesh_shape
from tui.app import TitanConsole
from tui.devices import Devices, devices_seen
from tui.launcher import child_env
from tui.screens.launch import LaunchScreen
from tui.widgets.option_input import OptionInput

SIZE = (80, 24)
ONE_CPU = "--xla_backend_optimization_level=0"
EIGHT_CPUS = f"--xla_force_host_platform_device_count=8 {ONE_CPU}"


def test_fit_rules_resolve_the_mesh_and_name_the_fix():
    assert resolve_mesh_shape(0, 2, 2, 1, 8, "cpu") == {"data": 2, "fsdp": 2, "tensor": 2}
    assert resolve_mesh_shape(0, 1, 1, 2, 8, "gpu") == {"data": 4, "fsdp": 1, "tensor": 1}
    with pytest.raises(TitanError) as wide:
        resolve_mesh_shape(2, 1, 1, 1, 1, "cpu")
    with pytest.raises(TitanError) as staged:
        resolve_mesh_shape(0, 1, 4, 4, 8, "gpu")
    assert str(wide.value) == "--dp 2 x --fsdp 1 x --tp 1 = 2 devices asked, 1 present (cpu)"
    assert str(staged.value) == (
        "--dp 1 x --fsdp 1 x --tp 4 x --pp 4 = 16 devices asked, 8 present (gpu)"
    )
    assert microbatch_rows(32, 4, {"data": 2, "fsdp": 4}) == 8
    assert microbatch_rows(12, 1, {"data": 3, "fsdp": 1}) == 12
    with pytest.raises(TitanError) as whole:
        microbatch_rows(10, 1, {"data": 4, "fsdp": 1})
    assert str(whole.value) == (
        "--batch-size 10 is not a multiple of dp x fsdp = 4 x 1 (mesh axes 'data' x 'fsdp'): "
        "--batch-size 12 would split"
    )
    idle = TrainConfig.of(dp=2, tp=2, batch_size=8, microbatches=2)
    assert check_layout(idle.parallel, 8, 8, "cpu") == (
        "the layout uses 4 of the 8 devices (--dp 2 x --fsdp 1 x --tp 2 x --pp 1)"
    )
    assert check_layout(TrainConfig.of(batch_size=8).parallel, 8, 8, "cpu") is None  # --dp 0: all 8


async def _refused(tmp_path: Path, texts: dict[str, str]) -> tuple[str, list[str], list[str]]:
    """Launch ``texts`` from the form and wait for its error; returns (the error shown, the
    notifications, the fields marked invalid, each also focused); the form must still be open
    and nothing launched."""
    notes: list[str] = []
    app = TitanConsole(tmp_path / "runs", show_launch_form=True)
    async with app.run_test(size=SIZE, message_hook=notes_into(notes)) as pilot:
        await pilot.pause()
        fill_form(app, texts)
        await pilot.press("ctrl+r")
        error = app.screen.query_one("#launch-error")
        await wait_until(pilot, lambda: str(error.content), lambda: "no error shown", 120)
        assert isinstance(app.screen, LaunchScreen) and app.launched == {}
        rows = [row for row in app.screen.query(OptionInput) if row.has_class("-invalid")]
        assert all(app.focused is row.control for row in rows)
        return str(error.content), notes, [row.option_name for row in rows]


@pytest.mark.slow
async def test_the_form_refuses_more_devices_than_the_run_sees_with_the_cli_line(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", ONE_CPU)
    runs = tmp_path / "runs"
    shown, notes, invalid = await _refused(tmp_path, {**tiny_form_texts(corpus_dir), "dp": "2"})
    cli = subprocess.run(
        [sys.executable, "-m", "titan.cli", "train", "--data", str(corpus_dir), "--dp", "2"]
        + ["--runs-root", str(runs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown == "--dp 2 x --fsdp 1 x --tp 1 = 2 devices asked, 1 present (cpu)"
    assert cli.returncode == 2 and cli.stderr.strip() == f"titan train: error: {shown}"
    assert notes == [shown]
    assert invalid == ["dp"]
    assert not runs.exists()


@pytest.mark.slow
async def test_the_form_refuses_microbatches_that_do_not_split_over_the_replicas(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XLA_FLAGS", EIGHT_CPUS)
    layout = {"batch_size": "4", "microbatches": "2", "dp": "2", "fsdp": "2"}
    shown, notes, invalid = await _refused(tmp_path, {**tiny_form_texts(corpus_dir), **layout})
    assert shown == (
        "--batch-size 4 / --microbatches 2 = 2 rows per microbatch, not a multiple of "
        "dp x fsdp = 2 x 2 (mesh axes 'data' x 'fsdp'): --batch-size 8 would split"
    )
    assert notes == [shown]
    assert invalid == ["batch_size"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
async def test_a_probe_that_fails_is_said_and_nothing_is_launched(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("JAX_PLATFORMS", "no-such-platform")
    shown, notes, invalid = await _refused(tmp_path, {**tiny_form_texts(corpus_dir), "dp": "1"})
    assert shown.startswith("cannot count the devices a run would see: RuntimeError: ")
    assert "no-such-platform" in shown and len(shown.splitlines()) == 1
    assert notes == [shown] and invalid == []
    assert not (tmp_path / "runs").exists()


def test_a_fitting_layout_on_eight_cpu_devices_passes_the_check(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", EIGHT_CPUS)
    seen = devices_seen(child_env())
    started = time.monotonic()
    again = devices_seen(child_env())
    cached_s = time.monotonic() - started
    layout = TrainConfig.of(dp=2, fsdp=2, tp=2, batch_size=8, microbatches=2)
    assert seen == again == Devices(8, "cpu")
    assert cached_s < 0.1  # kept for the session: JAX is not started again
    assert check_layout(layout.parallel, 8, seen.count, seen.backend) is None


def test_the_console_counts_devices_without_importing_jax():
    count = (
        "import sys; from tui.devices import devices_seen; from tui.launcher import child_env; "
        "seen = devices_seen(child_env()); print(seen.count, 'jax' in sys.modules)"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": EIGHT_CPUS}
    proc = subprocess.run(
        [sys.executable, "-c", count], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["8", "False"]
