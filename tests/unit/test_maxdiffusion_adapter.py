"""diffusers' Flax UNet2DConditionModel (the MaxDiffusion model API) through the model seam:
Titan's SPMD trainer, objectives and digits batches train it, and its loss falls.

The UNet is the smallest that still has every part the adapter touches (0.18 M parameters): one
cross-attention down/up block pair at 32 channels (diffusers' GroupNorm fixes 32 groups, so 32 is
the least width), no mid block, the label table as ``encoder_hidden_states``, 8 x 8 digits."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from titan.config import TrainConfig
from titan.data.images import ImageBatches, open_images
from titan.diffusion.objectives import Objective
from titan.layouts.spmd import SpmdTrainer
from titan.models.adapters.maxdiffusion import DiffusersUNetAdapter, UNetShape
from titan.optimizer import build_optimizer
from titan.parallel.chunks import plan_chunks
from titan.parallel.mesh import build_stage_meshes

pytest.importorskip("diffusers", reason="the [diffusion] extra is not installed")
pytestmark = pytest.mark.slow

TINY_UNET = UNetShape(
    image_size=8,
    channels=1,
    labels=11,
    block_out_channels=(32,),
    down_block_types=("CrossAttnDownBlock2D",),
    up_block_types=("CrossAttnUpBlock2D",),
    mid_block_type=None,
)
STEPS = 20
BATCH = 32
WINDOW = 5  # steps averaged at each end of the run
FALL = 1.5  # measured: mean loss 1.71 -> 0.88, a 1.94x fall


def test_the_diffusers_unet_learns_the_digits_under_the_spmd_trainer():
    adapter = DiffusersUNetAdapter(TINY_UNET)
    cfg = TrainConfig.of(steps=STEPS, warmup_steps=3, lr=3e-3)
    mesh = build_stage_meshes(2, 1, 1, 1)[0]  # data parallel over 2 devices
    tx, schedule = build_optimizer(cfg.optimizer)
    trainer = SpmdTrainer(
        adapter, mesh, plan_chunks(1, 1, 1), tx, schedule, jax.numpy.float32, 1.0, BATCH
    )
    state = trainer.init_state(0)
    trainer.trace()
    trainer.compile()
    batches = ImageBatches(open_images("digits", 8, 1), Objective(), BATCH, 0, 0.1)
    losses = []
    for _ in range(STEPS):
        state, metrics = trainer.step(state, batches.next_batch()[0])
        losses.append(float(metrics["loss"]))
    first, last = np.mean(losses[:WINDOW]), np.mean(losses[-WINDOW:])
    assert first / last > FALL, (first, last)
    assert adapter.param_count() == sum(x.size for x in jax.tree.leaves(state.chunks[0]["params"]))
    per_pixel, _ = adapter.token_flops()
    assert per_pixel["full"] > 3 * 2 * adapter.param_count() / 64  # convolutions reuse weights
