"""Gradient accumulation under ``--layout spmd``: ``--microbatches M`` scans over M slices of
the batch inside the one jitted step and gives the whole batch's step, in less memory."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from helpers import trainer_of

from titan.cli import main
from titan.config import TrainConfig, model_config, resumable_options
from titan.errors import TitanError
from titan.layouts.builders import check_layout_fits
from titan.layouts.spmd import SpmdTrainer
from titan.ops import Ops

VOCAB = 512


def _trainer(compiled: bool = True, **options) -> SpmdTrainer:
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", **options)
    trainer = trainer_of(cfg, model_config(cfg.model.shape, VOCAB), Ops("cpu", cfg.compute.ops))
    if compiled:
        trainer.trace()
        trainer.compile()
    return trainer


def _batch(seed: int, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (batch_size, seq_len + 1), dtype=np.int32)
    # two documents per row, cut at a random point
    cuts = rng.integers(1, seq_len, (batch_size, 1))
    segment_ids = (np.arange(seq_len)[None, :] >= cuts).astype(np.int32) + 1
    return {"tokens": tokens, "segment_ids": segment_ids}


def _two_steps(trainer: SpmdTrainer, batch_size: int, seq_len: int):
    state = trainer.init_state(seed=0)
    metrics = []
    for seed in (1, 2):
        state, step_metrics = trainer.step(state, _batch(seed, batch_size, seq_len))
        metrics.append(jax.device_get(step_metrics))
    return metrics, jax.device_get(state.chunks[0]["params"])


def _collectives(trainer: SpmdTrainer) -> set[str]:
    """The data-moving collectives of the compiled step (all-reduces of gradients aside)."""
    moves = r"= \S+ (all-gather|all-to-all|collective-permute|reduce-scatter)[-\w.]*\("
    return set(re.findall(moves, trainer._compiled.as_text()))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [{"dp": 1}, {"dp": 2, "fsdp": 2}], ids=["one-device", "dp2-fsdp2"])
def test_four_microbatches_give_the_whole_batch_step(mesh):
    shape = {"batch_size": 16, "seq_len": 32, **mesh}
    whole_metrics, whole_params = _two_steps(_trainer(**shape), 16, 32)
    accumulated = _trainer(microbatches=4, **shape)
    metrics, params = _two_steps(accumulated, 16, 32)
    for ours, theirs in zip(metrics, whole_metrics, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
        assert ours["lr"] == theirs["lr"]
    for ours, theirs in zip(jax.tree.leaves(params), jax.tree.leaves(whole_params), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_microbatch_rows_must_split_over_dp_x_fsdp():
    with pytest.raises(TitanError) as err:
        _trainer(compiled=False, batch_size=8, microbatches=4, dp=2, fsdp=2)
    message = str(err.value)
    assert message == (
        "--batch-size 8 / --microbatches 4 = 2 rows per microbatch, not a multiple of "
        "dp x fsdp = 2 x 2 (mesh axes 'data' x 'fsdp'): --batch-size 16 would split"
    )
    with pytest.raises(TitanError, match="--batch-size 8 is not a multiple of --microbatches 3"):
        TrainConfig.of(batch_size=8, microbatches=3)


def test_titan_train_refuses_microbatch_rows_in_one_line_before_the_run_dir(
    corpus_dir, tmp_path, capsys
):
    runs = tmp_path / "runs"
    argv = ["train", "--data", str(corpus_dir), "--vocab-size", "512", "--runs-root", str(runs)]
    layout = ["--batch-size", "8", "--microbatches", "4", "--dp", "2", "--fsdp", "2"]
    assert main([*argv, *layout]) == 2
    err = capsys.readouterr().err.strip()
    assert "--batch-size 8 / --microbatches 4 = 2 rows per microbatch" in err
    assert len(err.splitlines()) == 1
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize(
    ("layout", "error"),
    [
        # the default batch of 16 in 8 microbatches over pp 2 x dp 4: 2 rows per microbatch
        (
            ["--layout", "mpmd", "--pp", "2", "--microbatches", "8", "--schedule", "1f1b"],
            "--batch-size 16 / --microbatches 8 = 2 rows per microbatch, not a multiple of "
            "dp x fsdp = 4 x 1 (mesh axes 'data' x 'fsdp'): --batch-size 32 would split",
        ),
        (["--dp", "16"], "--dp 16 x --fsdp 1 x --tp 1 = 16 devices asked, 8 present (cpu)"),
        (
            ["--dp", "3"],
            "--batch-size 16 is not a multiple of dp x fsdp = 3 x 1 (mesh axes 'data' x "
            "'fsdp'): --batch-size 18 would split",
        ),
    ],
)
def test_layout_errors_name_the_fix_and_come_before_the_tokenizer(
    corpus_dir, tmp_path, capsys, layout, error
):
    runs = tmp_path / "runs"
    argv = ["train", "--data", str(corpus_dir), "--vocab-size", "512", "--runs-root", str(runs)]
    assert main([*argv, *layout]) == 2
    out, err = capsys.readouterr()
    assert error in err
    assert len(err.strip().splitlines()) == 1
    assert "tokenizer" not in out + err  # refused before the tokenizer is trained
    assert not runs.exists() or not any(runs.iterdir())


def test_a_layout_that_leaves_devices_idle_says_so():
    cfg = TrainConfig.of(layout="mpmd", pp=2, dp=1, microbatches=8)
    assert check_layout_fits(cfg.parallel, cfg.data.batch_size) == (
        "the layout uses 2 of the 8 devices (--dp 1 x --fsdp 1 x --tp 1 x --pp 2)"
    )
    mpmd = TrainConfig.of(layout="mpmd", pp=2, microbatches=4)
    assert check_layout_fits(mpmd.parallel, mpmd.data.batch_size) is None


def test_spmd_takes_microbatches_but_no_other_pipeline_option():
    assert TrainConfig.of(microbatches=4).parallel.microbatches == 4
    assert "microbatches" in resumable_options()
    for option, value, flag in [
        ("pp", 2, "--pp"),
        ("schedule", "gpipe", "--schedule"),
        ("virtual_stages", 2, "--virtual-stages"),
        ("stage_layers", "2,2", "--stage-layers"),
    ]:
        with pytest.raises(TitanError, match=f"^{flag} needs --layout mpmd$"):
            TrainConfig.of(**{option: value})


def test_describe_records_microbatches_only_when_the_step_accumulates():
    whole = _trainer(compiled=False, batch_size=8, dp=1).describe().to_json()
    assert "microbatches" not in whole
    accumulated = _trainer(compiled=False, batch_size=8, dp=1, microbatches=2).describe().to_json()
    assert accumulated == {**whole, "microbatches": 2}


@pytest.mark.slow
def test_one_microbatch_compiles_without_a_scan_and_more_with_one():
    whole = _trainer(batch_size=8, seq_len=16, dp=1)
    accumulated = _trainer(batch_size=8, seq_len=16, dp=1, microbatches=2)
    assert "while" not in whole._lowered.as_text()
    assert "while" in accumulated._lowered.as_text()


@pytest.mark.slow
def test_microbatches_keep_the_batch_on_its_data_shards():
    # on a data-parallel mesh the whole-batch step moves no data but the gradient all-reduce;
    # the split into microbatches must not gather or permute the batch either
    assert _collectives(_trainer(batch_size=8, seq_len=16, dp=4)) == set()
    assert _collectives(_trainer(batch_size=8, seq_len=16, dp=4, microbatches=2)) == set()


@pytest.mark.slow
def test_more_microbatches_need_less_temporary_memory():
    # 16 x 128 tokens through the tiny model: activations (attention scores above all) dominate
    temp = {
        m: _trainer(batch_size=16, seq_len=128, dp=1, microbatches=m)
        ._compiled.memory_analysis()
        .temp_size_in_bytes
        for m in (1, 2, 4)
    }
    assert temp[1] > 1.5 * temp[2] > 1.5**2 * temp[4]
