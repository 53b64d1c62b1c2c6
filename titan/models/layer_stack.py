"""The decoder blocks of a model as one ``nn.scan`` over a stacked ``layers`` parameter axis,
each block under its ``--remat`` policy (``titan.remat.REMAT_POLICIES``); shared by Titan's
Llama (:mod:`titan.models.llama`) and DiT (:mod:`titan.models.dit`)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from titan.remat import REMAT_POLICIES

# Deepest stack that --layer-unroll 0 unrolls fully, by --remat policy: 28 layers where little is
# recomputed, so that the unrolled program, in which XLA merges the recomputation with the
# forward (module docstring of layer_stack), keeps what the rolled one keeps; 16 under dots and
# full, whose memory needs the rolled loop's boundaries. Source: bench/results/
# layer-loop-nvidia-h200.json (llama3-3b, 28 layers: 7.7% more tokens/s unrolled, 13.3 s cold
# compile; llama3-8b, 32 layers: 4.4% more, but 108.8 s to compile).
FULL_UNROLL_MAX_LAYERS = {"none": 28, "dots-attention": 28, "dots": 16, "full": 16}
# Blocks per iteration of the layer loop in the program that creates the parameters (flax's
# init): rolled, whatever --layer-unroll says. The scan splits one key per layer whatever its
# unroll, so the values are those of an unrolled init (tests/unit/test_layer_init.py); its program
# holds one layer's initializers instead of one copy per layer, and compiles in a fraction of
# the time (28 layers of d_model 256 on CPU, jax 0.10.2: 2.3 s against 17.8 s unrolled). On an
# H200 (jax 0.11.2), `titan train --preset llama3-3b --batch-size 4 --param-dtype float32` with
# no compilation cache reached its first step 50.5 s after launch, against 74.5 s with the
# unrolled init (and the tokenizer already cached).
INIT_LAYER_UNROLL = 1


def layer_unroll_for(n_layers: int, layer_unroll: int, remat: str) -> int:
    """Blocks per iteration of the layer loop for ``--layer-unroll`` ``layer_unroll``.

    0 chooses by depth and ``remat`` (a ``--remat`` policy): up to
    :data:`FULL_UNROLL_MAX_LAYERS` layers the loop is fully unrolled (about 6% faster steps on an
    H200 at 16 layers, ``bench/results/mfu-nvidia-h200-unroll.json``; 7.7% at 28); deeper
    models get a rolled loop (1), whose program does not grow with depth and compiles in
    seconds. Any other value is used as given, at most ``n_layers``.

    Raises:
        KeyError: ``remat`` is not a policy (``auto`` is resolved before the model is built).
    """
    if layer_unroll == 0:
        return n_layers if n_layers <= FULL_UNROLL_MAX_LAYERS[remat] else 1
    return min(layer_unroll, n_layers)


def layer_stack(block: type[nn.Module], remat: str, n_layers: int, layer_unroll: int, args: int):
    """The scanned module class of ``n_layers`` blocks.

    Args:
        block: the block's module class; called as ``block(*attributes)(carry, *args)``.
        remat: a ``--remat`` policy name (``none``: nothing recomputed).
        n_layers: blocks in the stack (the length of the ``layers`` axis).
        layer_unroll: blocks per loop iteration; 0: chosen by depth (:func:`layer_unroll_for`);
            at least ``n_layers``: fully unrolled.
        args: call arguments after the carry, broadcast to every block.

    Remat runs with ``prevent_cse=False``, as Flax recommends under ``nn.scan``: a loop keeps
    XLA from merging the recomputation with the forward. A fully unrolled loop (the default
    ``--layer-unroll 0`` up to :data:`FULL_UNROLL_MAX_LAYERS`) is inlined into the backward's
    computation; there XLA:CPU drops the ``dots`` policy's recomputed attention, and
    ``--remat`` saves little memory (``docs/planner.md``, limits).
    """
    unroll = layer_unroll_for(n_layers, layer_unroll, remat)
    wrapped: Any = block
    if remat != "none":
        policy = REMAT_POLICIES[remat].jax_policy()
        wrapped = nn.remat(block, policy=policy, prevent_cse=False)
    return nn.scan(
        wrapped,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(nn.broadcast,) * args,
        length=n_layers,
        unroll=unroll,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
