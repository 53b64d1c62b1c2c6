"""The persistent compilation cache, the compile events of repeated compilations, and the
layer loop chosen by depth."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests.helpers import events, small_run, start_subprocess
from titan.models.layer_stack import FULL_UNROLL_MAX_LAYERS, layer_unroll_for
from titan.remat import REMAT_POLICIES
from titan.trainer.compilation import CompileWatch, compilation_settings


def _train_subprocess(options: dict) -> Path:
    """``titan train`` in its own process (a fresh JAX: nothing compiled in memory)."""
    process = start_subprocess(options)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-2000:]
    return Path(options["runs_root"]) / options["run_id"]


@pytest.mark.slow
def test_second_start_loads_the_step_from_the_compilation_cache(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TITAN_CACHE", str(cache))
    options = small_run(corpus_dir, tmp_path / "runs", steps=2, checkpoint_every=2)
    first = _train_subprocess({**options, "run_id": "first"})
    second = _train_subprocess({**options, "run_id": "second"})
    cold, warm = events(first, "compile")[0], events(second, "compile")[0]
    assert cold["cache_dir"] == warm["cache_dir"] == str(cache / "xla")
    assert cold["cache_hits"] == 0
    assert warm["cache_hits"] >= 1  # the step, at least
    assert any((cache / "xla").iterdir())


@pytest.mark.slow
def test_no_compilation_cache_compiles_afresh(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache = tmp_path / "cache"
    options = small_run(corpus_dir, tmp_path / "runs", steps=1, checkpoint_every=1)
    options |= {"run_id": "off", "compilation_cache": False}
    monkeypatch.setenv("TITAN_CACHE", str(cache))
    run = _train_subprocess(options)
    compile_event = events(run, "compile")[0]
    assert "cache_dir" not in compile_event and "cache_hits" not in compile_event
    assert not (cache / "xla").exists()


def test_compilation_settings_are_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path))
    before = jax.config.jax_compilation_cache_dir
    with compilation_settings(cache=True) as directory:
        assert directory == tmp_path / "xla"
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_compilation_cache_dir == before


def scaled(x):
    return x * 2.0


def test_a_function_compiled_again_gets_a_compile_event_naming_the_changed_input():
    with compilation_settings(cache=False), CompileWatch() as watch:
        step = jax.jit(scaled)
        step(jnp.ones((4,), jnp.float32)).block_until_ready()
        assert watch.drain() == []  # a first compilation is no repeat
        step(jnp.ones((8,), jnp.float32)).block_until_ready()
        step(jnp.ones((8,), jnp.float32)).block_until_ready()  # cached: nothing new
        repeats = watch.drain()
    assert [e.what for e in repeats] == ["scaled"]
    assert repeats[0].reason.startswith("compiled again (2 times)")
    assert "f32[8]" in repeats[0].reason and "f32[4]" in repeats[0].reason
    assert repeats[0].seconds > 0


def test_two_functions_of_one_name_are_no_repeat():
    def make():
        def twin(x):
            return x + 1.0

        return jax.jit(twin)

    with compilation_settings(cache=False), CompileWatch() as watch:
        make()(jnp.ones((3,))).block_until_ready()
        make()(jnp.ones((3,))).block_until_ready()
        assert watch.drain() == []


@pytest.mark.parametrize(
    ("n_layers", "flag", "remat", "unroll"),
    [
        (16, 0, "full", 16),
        (2, 0, "dots", 2),
        (17, 0, "dots", 1),
        (28, 0, "dots-attention", 28),  # llama3-3b: unrolled
        (28, 0, "none", 28),
        (28, 0, "full", 1),  # its memory needs the rolled loop
        (32, 0, "dots-attention", 1),  # llama3-8b: rolled
        (28, 4, "full", 4),
        (8, 20, "dots", 8),
        (32, 1, "none", 1),
    ],
)
def test_layer_loop_is_chosen_by_depth_and_remat(n_layers: int, flag: int, remat: str, unroll: int):
    assert layer_unroll_for(n_layers, flag, remat) == unroll
    assert set(FULL_UNROLL_MAX_LAYERS) == set(REMAT_POLICIES)


def test_cache_misses_and_writes_are_not_logged(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setenv("TITAN_CACHE", str(tmp_path))
    with compilation_settings(cache=True), CompileWatch():
        jax.jit(lambda x: x * 3.0)(jnp.ones((5,))).block_until_ready()
    assert any((tmp_path / "xla").iterdir())  # written
    assert not [r for r in caplog.records if "PERSISTENT" in r.getMessage()]
    assert not [r for r in caplog.records if r.getMessage().startswith("Writing ")]


def test_a_write_left_to_process_0_is_not_logged_on_the_others(tmp_path: Path, monkeypatch, caplog):
    # what JAX logs per compiled program on every process but 0 (jax._src.compiler), which
    # filled a failed process's last lines under titan launch
    from jax._src import distributed

    monkeypatch.setenv("TITAN_CACHE", str(tmp_path))
    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    with compilation_settings(cache=True), CompileWatch():
        jax.jit(lambda x: x * 5.0)(jnp.ones((6,))).block_until_ready()
    assert not [r for r in caplog.records if "Not writing" in r.getMessage()]
