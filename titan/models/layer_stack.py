"""The decoder blocks of a model as one ``nn.scan`` over a stacked ``layers`` parameter axis,
each block under its ``--remat`` policy (``titan.remat.REMAT_POLICIES``); shared by Titan's
Llama (:mod:`titan.models.llama`) and DiT (:mod:`titan.models.dit`)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from titan.remat import REMAT_POLICIES


def layer_stack(block: type[nn.Module], remat: str, n_layers: int, layer_unroll: int, args: int):
    """The scanned module class of ``n_layers`` blocks.

    Args:
        block: the block's module class; called as ``block(*attributes)(carry, *args)``.
        remat: a ``--remat`` policy name (``none``: nothing recomputed).
        n_layers: blocks in the stack (the length of the ``layers`` axis).
        layer_unroll: blocks per loop iteration; 0 or at least ``n_layers``: fully unrolled.
        args: call arguments after the carry, broadcast to every block.

    Remat runs with ``prevent_cse=False``, as Flax recommends under ``nn.scan``: a loop keeps
    XLA from merging the recomputation with the forward. A fully unrolled loop (the default
    ``--layer-unroll 0``) is inlined into the backward's computation; there XLA:CPU drops the
    ``dots`` policy's recomputed attention, and ``--remat`` saves little memory
    (``docs/planner.md``, limits).
    """
    unroll = min(layer_unroll or n_layers, n_layers)
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
