"""Pinned host memory reserved before the loop: the shards a save copies (JAX's replica 0 of
each), the reservation on its thread, and a run that records it (forced on CPU, whose devices
have a pinned_host memory too; orbax pins only on GPUs)."""

from __future__ import annotations

from collections import Counter

import jax
import numpy as np
import pytest
from helpers import events, run_in_process, trainer_of

from titan.config import TrainConfig, model_config
from titan.ops import Ops
from titan.trainer import pinned_host
from titan.trainer.pinned_host import Shard, copied_shards, reserve_host


def _sharded_trainer():
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", dp=2, fsdp=4)
    return trainer_of(cfg, model_config(cfg.model.shape, 512), Ops("cpu"))


def _first_replicas(items) -> Counter:
    """What JAX itself numbers replica 0 of each array of ``items``."""
    return Counter(
        (shard.device, shard.data.shape, shard.data.dtype)
        for leaf in jax.tree.leaves(items)
        for shard in leaf.addressable_shards
        if shard.replica_id == 0
    )


def test_the_copied_shards_are_replica_0_of_each_array_once_whatever_the_form():
    trainer = _sharded_trainer()
    state = trainer.init_state(seed=0)
    expected = _first_replicas(state.items())
    replicated = [
        leaf for leaf in jax.tree.leaves(state.items()) if leaf.sharding.is_fully_replicated
    ]
    assert replicated and len(expected) < sum(  # dp=2 holds two of each shard, copied once
        len(leaf.addressable_shards) for leaf in jax.tree.leaves(state.items())
    )
    for items in (state.items(), trainer.abstract_items()):
        shards = copied_shards(items)
        assert Counter((s.device, s.shape, s.dtype) for s in shards) == expected
        assert sum(s.nbytes for s in shards) == sum(
            leaf.nbytes for leaf in jax.tree.leaves(state.items())
        )


def test_a_reservation_holds_the_copied_bytes():
    items = _sharded_trainer().abstract_items()
    assert reserve_host(items, pinned=False) is None
    assert reserve_host(items) is None  # on CPU orbax copies without pinned memory
    event = reserve_host(items, pinned=True)
    assert event is not None and event.error is None
    assert event.bytes == sum(s.nbytes for s in copied_shards(items)) > 0
    assert event.seconds is not None and event.seconds > 0


def test_a_reservation_that_fails_keeps_its_error_and_raises_nothing(monkeypatch):
    petabyte = [Shard(jax.devices()[0], (1 << 50,), np.dtype(np.uint8))]
    monkeypatch.setattr(pinned_host, "copied_shards", lambda items: petabyte)
    event = reserve_host({}, pinned=True)
    assert event is not None and event.bytes == 1 << 50
    assert event.error is not None and event.error.startswith("MemoryError")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["reserved", "failed", "off"])
def test_a_run_records_its_reservation_before_its_first_step(
    small_options, monkeypatch, capfd, case
):
    monkeypatch.setattr(pinned_host, "orbax_pins_host", lambda: True)
    if case == "failed":
        petabyte = [Shard(jax.devices()[0], (1 << 50,), np.dtype(np.uint8))]
        monkeypatch.setattr(pinned_host, "copied_shards", lambda items: petabyte)
    options = {**small_options, "run_id": "pinned", "steps": 3}
    code, run_dir = run_in_process({**options, "checkpoint_pin_host": case != "off"})
    assert code == 0
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [3]
    said = capfd.readouterr().err
    kinds = [e["type"] for e in events(run_dir)]
    if case == "off":
        assert "pinned_host" not in kinds
        return
    at = kinds.index("pinned_host")
    assert max(i for i, k in enumerate(kinds) if k == "compile") < at < kinds.index("step")
    (reserved,) = events(run_dir, "pinned_host")
    assert reserved["bytes"] > 0 and reserved["seconds"] > 0
    if case == "failed":
        assert reserved["error"].startswith("MemoryError")
        assert "titan: reserving 1125899.9 GB of pinned host memory for checkpoints failed" in said
    else:
        assert "error" not in reserved and "pinned host" not in said
