"""The non-finite guard, loss spikes, and the checkpoint a watchdog abort leaves.

A poisoned batch (``--debug-nonfinite-at-step``: token ids beyond the vocabulary, whose
embedding is NaN) drives the real trainer; checkpoints are read back with orbax.
"""

from __future__ import annotations

import shutil
import statistics
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import cli_args, events, file_tree, run_in_process, small_run, start_subprocess

from titan.checkpoint.finite_check import (
    DIGESTS,
    PARAMS_DIGESTS,
    FiniteCheck,
    check_digests,
    read_digests,
)
from titan.cli import main
from titan.config import TrainConfig
from titan.errors import CheckpointDamaged, TitanError
from titan.exit_codes import EXIT_NONFINITE, EXIT_STALL, EXIT_STOPPED, worst_exit_code
from titan.layouts.contract import TrainState
from titan.trainer import train as train_module
from titan.trainer.guard import (
    LossSpikeDetector,
    NonFiniteAbort,
    NonFiniteGuard,
)

LAYOUTS = {
    "spmd": {"dp": 1},
    "mpmd": {"layout": "mpmd", "pp": 2, "dp": 1, "microbatches": 2},
}


def checkpoint_leaves(run_dir: Path, step: int) -> list[np.ndarray]:
    """Every array (parameters and optimizer state, all chunks) of checkpoint ``step``."""
    chunks = sorted((run_dir / "checkpoints" / str(step)).glob("chunk_*"))
    assert chunks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trees = [ocp.PyTreeCheckpointer().restore(path) for path in chunks]
    leaves = []
    for tree in trees:
        stack = [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                stack.extend(node[k] for k in sorted(node))
            elif isinstance(node, list | tuple):
                stack.extend(node)
            elif node is not None:
                leaves.append(np.asarray(node))
    return leaves


def assert_every_checkpoint_finite(run_dir: Path) -> list[int]:
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    for step in steps:
        assert all(np.isfinite(leaf).all() for leaf in checkpoint_leaves(run_dir, step)), step
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_poisoned_batch_is_skipped_and_recorded_and_the_run_completes(
    layout, corpus_dir, tmp_path, capsys
):
    options = small_run(
        corpus_dir,
        tmp_path,
        run_id=layout,
        steps=4,
        checkpoint_every=1,
        log_every=1,
        debug_nonfinite_at_step=3,
        **LAYOUTS[layout],
    )
    code, run_dir = run_in_process(options)
    assert code == 0
    [line] = [s for s in capsys.readouterr().out.splitlines() if s.startswith("step 3/4")]
    assert line.startswith("step 3/4  loss nan  grad_norm nan  lr ")
    assert line.endswith(" (update skipped)")
    steps = {e["step"]: e for e in events(run_dir, "step")}
    assert steps[3]["skipped"] is True
    assert steps[3]["nonfinite"] == {"loss": "nan", "grad_norm": "nan"}
    assert steps[3]["loss"] is None and steps[3]["grad_norm"] is None
    for step in (1, 2, 4):
        assert "skipped" not in steps[step] and "nonfinite" not in steps[step]
        assert np.isfinite(steps[step]["loss"])
    # the schedule's count does not advance on the skipped step: step 4 applies step 3's rate
    lrs = [steps[step]["lr"] for step in (1, 2, 3, 4)]
    assert lrs[0] < lrs[1] < lrs[2] == lrs[3]
    assert events(run_dir)[-1]["status"] == "completed"
    # checkpoints 2, 3, 4 are kept: step 3 changed nothing, step 4 trained again
    assert assert_every_checkpoint_finite(run_dir) == [2, 3, 4]
    before, skipped, after = (checkpoint_leaves(run_dir, s) for s in (2, 3, 4))
    assert all(np.array_equal(a, b) for a, b in zip(before, skipped, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(skipped, after, strict=True))


@pytest.mark.slow
def test_skip_ends_the_run_after_patience_non_finite_steps(corpus_dir, tmp_path):
    options = small_run(
        corpus_dir,
        tmp_path,
        run_id="patience",
        steps=6,
        dp=1,
        checkpoint_every=2,
        debug_nonfinite_at_step=3,
        nonfinite_patience=1,
    )
    assert main(["train", *cli_args(options)]) == EXIT_NONFINITE
    end = events(tmp_path / "patience")[-1]
    assert (end["type"], end["status"], end["reason"]) == ("run_end", "failed", "nonfinite")
    assert end["step"] == 3 and end["checkpoint_step"] == 2
    assert "--nonfinite-patience 1" in end["error"]


@pytest.mark.slow
def test_abort_fails_with_its_code_keeps_the_finite_checkpoint_and_resumes(
    corpus_dir, tmp_path, capsys
):
    options = small_run(
        corpus_dir,
        tmp_path,
        run_id="abort",
        steps=8,
        dp=1,
        checkpoint_every=2,
        debug_nonfinite_at_step=5,
        nonfinite="abort",
    )
    assert main(["train", *cli_args(options)]) == EXIT_NONFINITE
    assert "titan: non-finite: step 5: loss nan, grad_norm nan" in capsys.readouterr().err
    run_dir = tmp_path / "abort"
    end = events(run_dir)[-1]
    assert (end["status"], end["reason"], end["step"], end["checkpoint_step"]) == (
        "failed",
        "nonfinite",
        5,
        4,
    )
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [2, 4]
    assert assert_every_checkpoint_finite(run_dir) == [2, 4]
    code, _ = run_in_process({**options, "debug_nonfinite_at_step": 0}, resume=run_dir)
    assert code == 0
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 4
    resumed = events(run_dir, "step")[-4:]
    assert [e["step"] for e in resumed] == [5, 6, 7, 8]
    assert all(np.isfinite(e["loss"]) and "skipped" not in e for e in resumed)
    assert assert_every_checkpoint_finite(run_dir)[-1] == 8


def test_guard_counts_non_finite_steps_in_a_row():
    guard = NonFiniteGuard("skip", patience=3)
    nan = {"loss": "nan"}
    for step, finite in [(1, False), (2, False), (3, True), (4, False), (5, False)]:
        guard.check(step, finite, {} if finite else nan)
    assert guard.in_a_row == 2
    with pytest.raises(NonFiniteAbort, match="step 6: loss nan, 3 non-finite steps in a row") as e:
        guard.check(6, False, nan)
    assert e.value.step == 6
    with pytest.raises(NonFiniteAbort, match=r"--nonfinite abort"):
        NonFiniteGuard("abort", patience=3).check(1, False, {"grad_norm": "inf"})


def test_state_with_a_nan_weight_is_not_finite():
    chunk = {"params": {"w": jnp.ones((2, 3))}, "opt_state": (jnp.zeros(3),)}
    check = FiniteCheck()
    (compiled,) = check.compile(TrainState(0, (chunk, chunk)))
    assert (compiled.what, compiled.reason) == ("finite_check", None) and compiled.seconds > 0
    finite, digests, events = check(TrainState(1, (chunk, chunk)))
    assert (finite, events) == (True, [])  # compiled: no event
    assert [len(set(d)) for d in (digests[DIGESTS], digests[PARAMS_DIGESTS])] == [1, 1]
    poisoned = {
        "params": {"w": jnp.ones((2, 3)).at[1, 2].set(jnp.inf)},
        "opt_state": (chunk["opt_state"]),
    }
    finite, digests, events = check(TrainState(1, (chunk, poisoned)))
    assert (finite, events) == (False, [])
    assert [len(set(d)) for d in (digests[DIGESTS], digests[PARAMS_DIGESTS])] == [2, 2]


def test_the_digest_sees_any_flipped_bit_and_swapped_leaves_but_not_the_sharding():
    w = jnp.arange(64, dtype=jnp.float32).reshape(8, 8) / 7
    chunk = {"params": {"a": w, "b": w.astype(jnp.bfloat16) + 1}, "opt_state": (jnp.int32(3),)}
    check = FiniteCheck()
    _, base, _ = check(TrainState(0, (chunk,)))
    assert base[DIGESTS] != base[PARAMS_DIGESTS]
    bits = np.asarray(w).view(np.uint32)
    for index, bit in [(0, 0), (5, 17), (63, 31)]:
        flipped = bits.copy().reshape(-1)
        flipped[index] ^= np.uint32(1 << bit)
        changed = {
            **chunk,
            "params": {**chunk["params"], "a": jnp.asarray(flipped.view(np.float32).reshape(8, 8))},
        }
        digests = check(TrainState(0, (changed,)))[1]
        assert all(digests[k] != base[k] for k in (DIGESTS, PARAMS_DIGESTS)), (index, bit)
    swapped = {
        **chunk,
        "params": {"a": chunk["params"]["b"].astype(jnp.float32), "b": w.astype(jnp.bfloat16)},
    }
    assert check(TrainState(0, (swapped,)))[1][PARAMS_DIGESTS] != base[PARAMS_DIGESTS]
    moved = check(TrainState(0, ({**chunk, "opt_state": (jnp.int32(4),)},)))[1]
    assert moved[DIGESTS] != base[DIGESTS] and moved[PARAMS_DIGESTS] == base[PARAMS_DIGESTS]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    sharded = jax.tree.map(lambda x: jax.device_put(x, split) if x.ndim else x, chunk)
    assert check(TrainState(0, (sharded,)))[1] == base
    # as a restore reads them to host memory: the whole chunk, or its parameters alone
    host = jax.tree.map(np.asarray, chunk)
    assert read_digests([host]) == base
    only = read_digests([{"params": host["params"]}], partial=True)
    assert only == {PARAMS_DIGESTS: base[PARAMS_DIGESTS]}


def test_a_state_sharded_otherwise_recompiles_the_finite_check_with_its_cause():
    chunk = {"params": {"w": jnp.ones((2, 3))}, "opt_state": (jnp.zeros(3),)}
    check = FiniteCheck()
    check.compile(TrainState(0, (chunk,)))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    moved = {
        "params": {"w": jax.device_put(chunk["params"]["w"], split)},
        "opt_state": (jnp.zeros(3),),
    }
    finite, _, (event,) = check(TrainState(1, (moved,)))
    assert finite and event.what == "finite_check"
    assert event.reason.startswith("['params']['w']: sharding SingleDeviceSharding(")
    assert "-> NamedSharding(" in event.reason
    finite, _, events = check(TrainState(2, (moved,)))
    assert (finite, events) == (True, [])  # once per new signature


def test_spike_detector_flags_losses_above_mean_plus_sigma_std():
    detector = LossSpikeDetector(window=4, sigma=3.0)
    losses = [5.0, 5.2, 4.8, 5.0]  # mean 5.0, population std 0.1414: threshold 5.424
    assert all(detector.observe(i + 1, x) is None for i, x in enumerate(losses))
    assert detector.observe(5, 5.4) is None
    assert detector.observe(6, float("nan")) is None  # ignored, not in the window
    spike = detector.observe(7, 9.0)  # window 5.2, 4.8, 5.0, 5.4
    assert (spike.step, spike.loss, spike.window) == (7, 9.0, 4)
    assert spike.mean == pytest.approx(5.1)
    assert spike.std == pytest.approx(statistics.pstdev([5.2, 4.8, 5.0, 5.4]))
    assert spike.threshold == pytest.approx(5.1 + 3.0 * spike.std)


@pytest.mark.slow
def test_loss_spike_is_recorded_by_the_rule(corpus_dir, tmp_path):
    # A learning rate of 0.3 without clipping makes the loss jump once warmup raises it.
    window, sigma = 3, 3.0
    options = small_run(
        corpus_dir,
        tmp_path,
        run_id="spike",
        steps=6,
        dp=1,
        lr=0.3,
        warmup_steps=6,
        grad_clip=0,
        loss_spike_window=window,
        loss_spike_sigma=sigma,
    )
    code, run_dir = run_in_process(options)
    assert code == 0
    losses = [e["loss"] for e in events(run_dir, "step")]
    expected = []
    for i in range(window, len(losses)):
        recent = losses[i - window : i]
        mean = statistics.fmean(recent)
        if losses[i] > mean + sigma * statistics.pstdev(recent, mean):
            expected.append(i + 1)
    spikes = events(run_dir, "loss_spike")
    assert [s["step"] for s in spikes] == expected and expected
    assert spikes[0]["loss"] == losses[expected[0] - 1] > spikes[0]["threshold"]


def test_nonfinite_code_outranks_a_stop_and_a_stall_in_titan_launch():
    assert worst_exit_code([0, EXIT_STOPPED, EXIT_NONFINITE, EXIT_STALL]) == EXIT_NONFINITE


@pytest.mark.slow
def test_watchdog_abort_saves_the_reachable_state_and_resume_continues(small_options):
    options = {
        **small_options,
        "run_id": "stalled",
        "steps": 100,
        "checkpoint_every": 100,
        "watchdog_floor": 2.0,
        "debug_stall_at_step": 4,
        "watchdog_abort": True,
    }
    proc = start_subprocess(options)
    assert proc.wait(timeout=180) == EXIT_STALL, proc.stderr.read()
    run_dir = Path(options["runs_root"]) / "stalled"
    end = events(run_dir)[-1]
    assert (end["status"], end["reason"], end["saved"], end["checkpoint_step"]) == (
        "failed",
        "stall",
        "saved",
        3,
    )
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [3]
    assert assert_every_checkpoint_finite(run_dir) == [3]
    resume = {**options, "steps": 5, "debug_stall_at_step": 0, "watchdog_abort": False}
    code, _ = run_in_process(resume, resume=run_dir)
    assert code == 0
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 3
    assert [e["step"] for e in events(run_dir, "step")] == [1, 2, 3, 4, 5]
    # the data continues where step 3 left it: no batch repeats
    digests = [e["batch_digest"] for e in events(run_dir, "step")]
    assert len(set(digests)) == 5


@pytest.mark.slow
def test_resume_without_a_checkpoint_says_so_and_records_no_resumed_step(small_options, capsys):
    options = {
        **small_options,
        "run_id": "nothing-saved",
        "steps": 100,
        "watchdog_floor": 1.0,  # before any step time: max(LONG_PHASE_MIN_S, 20 floors) = 30 s
        "debug_stall_at_step": 1,
        "watchdog_abort": True,
    }
    proc = start_subprocess(options)
    assert proc.wait(timeout=180) == EXIT_STALL, proc.stderr.read()
    run_dir = Path(options["runs_root"]) / "nothing-saved"
    end = events(run_dir)[-1]
    assert end["saved"] == "nothing to save: no step done" and "checkpoint_step" not in end
    resume = {**options, "steps": 2, "debug_stall_at_step": 0, "watchdog_abort": False}
    code, _ = run_in_process(resume, resume=run_dir)
    assert code == 0
    assert "no committed checkpoint; starting from step 0" in capsys.readouterr().err
    start = events(run_dir, "run_start")[-1]
    assert (start["start_step"], start["resumed_from_step"]) == (0, None)


@pytest.mark.slow
def test_resume_of_a_run_whose_recorded_checkpoints_are_gone_is_refused_writing_nothing(
    finished_run, tmp_path, capsys, monkeypatch
):
    def prepared(*args, **kwargs):
        raise AssertionError("the tokenizer and corpus were prepared before the refusal")

    monkeypatch.setattr(train_module, "TextTask", prepared)
    run_dir = tmp_path / "done"
    shutil.copytree(finished_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    before = file_tree(run_dir)
    assert main(["train", "--resume", str(run_dir), "--steps", "35"]) == 2
    err = capsys.readouterr().err
    assert "--resume: the run's record names checkpoint 2, but " in err
    assert "holds nothing: it does not exist: refusing to start again from step 0" in err
    assert file_tree(run_dir) == before  # no empty checkpoints/, nothing started over
    (run_dir / "checkpoints").mkdir()
    for step in (1, 2):  # whose meta is gone: a copy of the run cut short
        shutil.copytree(finished_run / "checkpoints" / "2", run_dir / "checkpoints" / str(step))
        shutil.rmtree(run_dir / "checkpoints" / str(step) / "meta")
    before = file_tree(run_dir)
    assert main(["train", "--resume", str(run_dir), "--steps", "4"]) == 2
    assert (
        "holds no committed checkpoint: step folders 1, 2 hold no meta (a copy or a delete was "
        "cut short): refusing to start again from step 0"
    ) in capsys.readouterr().err
    assert file_tree(run_dir) == before


def test_guard_options_are_validated():
    with pytest.raises(TitanError, match="--nonfinite must be one of skip, abort, got 'never'"):
        TrainConfig.of(nonfinite="never")
    with pytest.raises(TitanError, match="--nonfinite-patience must be >= 1"):
        TrainConfig.of(nonfinite_patience=0)
    with pytest.raises(TitanError, match="--loss-spike-sigma must be > 0"):
        TrainConfig.of(loss_spike_sigma=0)
    with pytest.raises(TitanError, match="--loss-spike-window must be >= 2"):
        TrainConfig.of(loss_spike_window=1)


@pytest.mark.parametrize("saved", [["abc"], [1, 2], [-1], [2**32], [True], "deadbeef"])
def test_a_meta_whose_digests_are_no_list_of_32_bit_numbers_is_damage(saved):
    with pytest.raises(CheckpointDamaged, match=r"checkpoint 4: its meta's digests is not 1 "):
        check_digests(4, {DIGESTS: saved}, {DIGESTS: [7]})
    check_digests(4, {}, {DIGESTS: [7]})  # none saved (an older checkpoint): nothing to compare
