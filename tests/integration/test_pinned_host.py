"""Pinned host memory reserved before the first save: what a save copies (against orbax's own
rule), the reservation, when it is made, and a run that records it after its first step, in no
step's time (forced on CPU, whose devices have a pinned_host memory too; orbax pins only on
GPUs)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import jax
import numpy as np
import pytest
from helpers import events, run_in_process, trainer_of
from orbax.checkpoint._src.serialization.replica_slices import get_replica_slices

from titan.checkpoint import pinned_host
from titan.checkpoint.pinned_host import (
    Shard,
    copied_shards,
    orbax_replica_parallel,
    reservation_pays,
    reserve_host,
)
from titan.config import CheckpointOptions, TrainConfig, model_config
from titan.exit_codes import EXIT_STOPPED
from titan.ops import Ops
from titan.trainer.loop_hooks import pin_host_hook
from titan.trainer.saver import Saver


def _sharded_trainer():
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", dp=2, fsdp=4)
    return trainer_of(cfg, model_config(cfg.model.shape, 512), Ops("cpu"))


def _orbax_copies(items, replica_parallel: bool) -> Counter:
    """What orbax's own rule copies on this process for ``items``: its replica slices."""
    copies = Counter()
    for leaf in jax.tree.leaves(items):
        for r in get_replica_slices(leaf, 0, replica_parallel).replica_slices:
            shape = list(r.unsliced_data.shape)
            if r.slice_args is not None:
                shape[r.slice_args.axis] = r.slice_args.limit_index - r.slice_args.start_index
            copies[(r.unsliced_data.device, tuple(shape), r.unsliced_data.dtype)] += 1
    return copies


@pytest.mark.parametrize("replica_parallel", [True, False])
def test_the_copied_shards_are_what_orbax_copies_whatever_the_form(replica_parallel):
    trainer = _sharded_trainer()
    state = trainer.init_state(seed=0)
    expected = _orbax_copies(state.items(), replica_parallel)
    leaves = jax.tree.leaves(state.items())
    assert any(leaf.sharding.is_fully_replicated for leaf in leaves)  # dp=2: two replicas each
    for items in (state.items(), trainer.abstract_items()):
        shards = copied_shards(items, replica_parallel)
        assert Counter((s.device, s.shape, s.dtype) for s in shards) == expected
        assert sum(s.nbytes for s in shards) == sum(leaf.nbytes for leaf in leaves)


def test_orbax_splits_replicas_unless_jax_platforms_names_the_gpu(monkeypatch):
    for platforms, split in (("", True), ("cpu", True), ("cuda", False), ("gpu,cpu", False)):
        monkeypatch.setenv("JAX_PLATFORMS", platforms)
        assert orbax_replica_parallel() is split


def test_a_reservation_places_each_copy_in_pinned_host_memory(monkeypatch):
    items = _sharded_trainer().abstract_items()
    assert reserve_host(items, pinned=False) is None
    assert reserve_host(items) is None  # on CPU orbax copies without pinned memory
    placed = Counter()
    put = jax.device_put

    def spy(value, sharding):
        placed[(sharding.memory_kind, sharding._device, value.shape, value.dtype)] += 1
        return put(value, sharding)

    monkeypatch.setattr(pinned_host.jax, "device_put", spy)
    event = reserve_host(items, pinned=True)
    assert event is not None and event.error is None
    shards = copied_shards(items)
    assert placed == Counter(("pinned_host", s.device, s.shape, s.dtype) for s in shards)
    assert event.bytes == sum(s.nbytes for s in shards) > 0
    assert event.seconds is not None and event.seconds > 0
    assert event.stopped is None


def test_a_stop_signal_ends_a_reservation_between_two_shards(monkeypatch):
    items = _sharded_trainer().abstract_items()
    placed = []
    put = jax.device_put

    def spy(value, sharding):
        placed.append(value.shape)
        return put(value, sharding)

    monkeypatch.setattr(pinned_host.jax, "device_put", spy)
    event = reserve_host(items, pinned=True, stopped=lambda: len(placed) == 3)
    assert event is not None and event.stopped is True and event.error is None
    assert len(placed) == 3 < len(copied_shards(items))
    event = reserve_host(items, pinned=True, stopped=lambda: True)
    assert event is not None and event.stopped is True and len(placed) == 3


@pytest.mark.parametrize(
    "error, said",
    [(MemoryError(), "MemoryError"), (RuntimeError("RESOURCE_EXHAUSTED: pool\nmore"), None)],
)
def test_a_reservation_that_fails_keeps_its_error_and_raises_nothing(monkeypatch, error, said):
    def failing_put(value, sharding):
        raise error

    monkeypatch.setattr(pinned_host.jax, "device_put", failing_put)
    event = reserve_host(_sharded_trainer().abstract_items(), pinned=True)
    assert event is not None and event.bytes > 0
    assert event.error == (said or "RuntimeError: RESOURCE_EXHAUSTED: pool")


@pytest.mark.parametrize(
    "pin_host, asynchronous, every, every_s, start, steps, pays",
    [
        (True, True, 100, 0.0, 0, 300, True),  # saves at 100 and 200 overlap steps
        (True, True, 100, 0.0, 0, 100, False),  # the only save is the last, waited for
        (True, True, 100, 0.0, 250, 300, False),  # resumed past the last save before the end
        (True, True, 100, 0.0, 150, 300, True),
        (True, True, 100, 60.0, 0, 50, True),  # a timed save may come before the end
        (True, False, 100, 0.0, 0, 300, False),  # synchronous saves hold the loop anyway
        (False, True, 100, 0.0, 0, 300, False),  # --no-checkpoint-pin-host
    ],
)
def test_a_reservation_is_made_only_where_a_save_overlaps_steps(
    pin_host, asynchronous, every, every_s, start, steps, pays, monkeypatch
):
    monkeypatch.setattr(pinned_host, "orbax_pins_host", lambda: True)
    options = CheckpointOptions(
        checkpoint_every=every,
        checkpoint_every_s=every_s,
        checkpoint_async=asynchronous,
        checkpoint_pin_host=pin_host,
    )
    assert reservation_pays(options, start, steps) is pays


def test_no_reservation_where_saves_copy_through_no_pinned_memory():
    assert jax.default_backend() == "cpu"  # orbax copies no save through pinned memory here
    assert not reservation_pays(CheckpointOptions(checkpoint_every=100), 0, 300)


SLOW_RESERVATION_S = 2.0  # far longer than a tiny step on CPU


@pytest.mark.slow
@pytest.mark.parametrize("case", ["reserved", "failed", "off"])
def test_a_run_records_its_reservation_after_its_first_step_in_no_step(
    small_options, monkeypatch, capfd, case
):
    monkeypatch.setattr(pinned_host, "orbax_pins_host", lambda: True)
    if case == "failed":
        petabyte = [Shard(jax.devices()[0], (1 << 50,), np.dtype(np.uint8))]
        monkeypatch.setattr(pinned_host, "copied_shards", lambda items: petabyte)

    order = []
    save = Saver.save

    def slow_reserve(items, stopped):
        order.append("reserve")
        time.sleep(SLOW_RESERVATION_S)
        return reserve_host(items, stopped=stopped)

    def spied_save(saver, state, position):
        order.append(f"save {state.step}")
        return save(saver, state, position)

    monkeypatch.setattr(pin_host_hook, "reserve_host", slow_reserve)
    monkeypatch.setattr(Saver, "save", spied_save)
    options = {**small_options, "run_id": "pinned", "steps": 3, "checkpoint_every": 1}
    code, run_dir = run_in_process({**options, "checkpoint_pin_host": case != "off"})
    assert code == 0
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [1, 2, 3]
    captured = capfd.readouterr()
    kinds = [e["type"] for e in events(run_dir)]
    if case == "off":
        assert "pinned_host" not in kinds and "pinned host" not in captured.out
        return
    assert order == ["reserve", "save 1", "save 2", "save 3"]  # before the save of step 1
    at = kinds.index("pinned_host")
    assert kinds.index("step") < at < kinds.index("checkpoint")
    assert [e["step"] for e in events(run_dir)[:at] if e["type"] == "step"] == [1]
    assert "titan: reserving pinned host memory for checkpoints" in captured.out
    second = next(e for e in events(run_dir, "step") if e["step"] == 2)
    assert second["step_time_s"] < SLOW_RESERVATION_S  # the clock restarts after it
    (reserved,) = events(run_dir, "pinned_host")
    assert reserved["bytes"] > 0 and reserved["seconds"] > 0
    if case == "failed":
        assert reserved["error"].startswith("MemoryError")
        said = "titan: reserving 1125899.9 GB of pinned host memory for checkpoints failed"
        assert said in captured.err
    else:
        assert "error" not in reserved and "pinned host" not in captured.err
    assert "stopped" not in reserved


@pytest.mark.slow
def test_a_stop_signal_during_the_reservation_ends_it_and_the_run_saves(small_options, monkeypatch):
    monkeypatch.setattr(pinned_host, "orbax_pins_host", lambda: True)

    def signalled_reserve(items, stopped):
        os.kill(os.getpid(), signal.SIGTERM)
        return reserve_host(items, stopped=stopped)

    monkeypatch.setattr(pin_host_hook, "reserve_host", signalled_reserve)
    options = {**small_options, "run_id": "pin-stop", "steps": 8, "checkpoint_every": 4}
    code, run_dir = run_in_process(options)
    assert code == EXIT_STOPPED
    (reserved,) = events(run_dir, "pinned_host")
    assert reserved["stopped"] is True
    assert [e["step"] for e in events(run_dir, "step")] == [1]
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [1]
    assert events(run_dir, "run_end")[0]["status"] == "stopped"


@pytest.mark.slow
def test_a_stop_signal_before_the_reservation_spares_it(small_options, monkeypatch):
    monkeypatch.setattr(pinned_host, "orbax_pins_host", lambda: True)
    on_step = pin_host_hook.PinHostHook.on_step

    def signalled_on_step(hook, loop, step, state):
        os.kill(os.getpid(), signal.SIGTERM)
        return on_step(hook, loop, step, state)

    monkeypatch.setattr(pin_host_hook.PinHostHook, "on_step", signalled_on_step)
    options = {**small_options, "run_id": "pin-stop-first", "steps": 8, "checkpoint_every": 4}
    code, run_dir = run_in_process(options)
    assert code == EXIT_STOPPED
    assert events(run_dir, "pinned_host") == []
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [1]
