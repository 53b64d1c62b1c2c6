"""Sharding as data: logical parameter axes mapped to mesh axes, with divisibility checks.

Mesh axes: ``data`` (DP: replicas), ``fsdp`` (FSDP: ZeRO-3 style parameter, gradient and
optimizer-state sharding; Rajbhandari et al. 2020) and ``tensor`` (TP: Megatron-style head and
MLP sharding; Shoeybi et al. 2019). The batch is split over ``data`` x ``fsdp``.

Rules (:data:`LOGICAL_RULES`): TP shards ``heads``, ``kv_heads``, ``mlp`` and ``vocab``; FSDP
shards ``embed``, the model dimension, which is the largest dimension of every matrix that TP
leaves unsharded. Norm scales, ``head_dim``, the ``layers`` stacking axis and the DiT's small
axes (``patch``, ``timestep``, ``modulation``, ``label``) are not sharded.

Activations (:data:`ACTIVATION_RULES`) keep the batch split over ``data`` x ``fsdp`` from the
embedding lookup to the loss; the model constrains the residual stream to
:data:`ACTIVATION_AXES` and the embedding lookup's output to :data:`EMBEDDING_LOOKUP_AXES`.
"""

from __future__ import annotations

from collections.abc import Mapping

from jax.sharding import PartitionSpec

from titan.errors import TitanError
from titan.parallel.fit import check_batch_splits

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
LOGICAL_RULES: Mapping[str, str | None] = {
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "embed": "fsdp",
    "head_dim": None,
    "norm": None,
    "layers": None,
    # the DiT's (titan.models.dit): pixels of a patch, timestep frequencies, adaLN's chunks,
    # class labels (a few rows: not worth splitting)
    "patch": None,
    "timestep": None,
    "modulation": None,
    "label": None,
    # every axis of a family whose parameters are not split (diffusers' UNet)
    "replicated": None,
}
# The residual stream (B, S, E) between blocks: batch over data x fsdp, the rest replicated.
# Without this constraint the partitioner may keep FSDP-sharded weights in place and split the
# contraction instead (all-reducing whole-batch activations), which is not FSDP.
ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")
ACTIVATION_RULES: Mapping[str, tuple[str, ...] | None] = {
    "activation_batch": BATCH_AXES,
    "activation_length": None,
    "activation_embed": None,
    "lookup_batch": ("data",),
}
# The embedding lookup's output (B, S, E): batch over data only, the model dimension split over
# fsdp as in the table, so each device looks up its data shard's tokens in its own slice of the
# table (only token ids move), and the residual-stream constraint that follows moves the fsdp
# split from E to B with an all-to-all of per-device activations (its transpose does the same for
# the gradient's scatter-add). Neither the table nor any activation is gathered. Left to itself
# the partitioner goes from the table's layout to the batch over data x fsdp by replicating the
# whole global batch on every device ("involuntary full rematerialization").
EMBEDDING_LOOKUP_AXES = ("lookup_batch", "activation_length", "embed")
MESH_AXIS_FLAGS = {"data": "--dp", "fsdp": "--fsdp", "tensor": "--tp"}


def axis_rules() -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """Logical -> mesh axis rules of parameters and activations, as ``flax.linen`` takes them
    (``nn.logical_axis_rules``) for ``nn.with_logical_constraint`` inside the model."""
    return (*LOGICAL_RULES.items(), *ACTIVATION_RULES.items())


def mesh_spec(
    name: str,
    logical: PartitionSpec,
    shape: tuple[int, ...],
    mesh_shape: Mapping[str, int],
) -> PartitionSpec:
    """Map one parameter's logical axes to a mesh ``PartitionSpec``.

    Args:
        name: parameter path, for error messages (``layers/wq``).
        logical: logical axis names, one per dimension (None: a replicated dimension).
        shape: the parameter's shape.
        mesh_shape: mesh axis name -> size.

    Raises:
        TitanError: a dimension's size is not a multiple of the mesh axis that shards it (names
            the flag, the dimension and both sizes).
    """
    axes = []
    for logical_axis, size in zip(logical, shape, strict=True):
        mesh_axis = LOGICAL_RULES[logical_axis] if logical_axis else None
        parts = mesh_shape.get(mesh_axis, 1) if mesh_axis else 1
        if mesh_axis is not None and size % parts:  # (unsharded: parts 1 divides it)
            raise TitanError(
                f"{MESH_AXIS_FLAGS[mesh_axis]} {parts} (mesh axis '{mesh_axis}') does not divide "
                f"'{logical_axis}' of size {size} in parameter {name}"
            )
        axes.append(mesh_axis if parts > 1 else None)
    return PartitionSpec(*axes)


def batch_spec(batch_size: int, mesh_shape: Mapping[str, int]) -> PartitionSpec:
    """Spec of a (B, ...) batch: B split over ``data`` x ``fsdp``.

    Raises:
        TitanError: when B is not a multiple of dp x fsdp (the message names the
            ``--batch-size`` that would split; :func:`titan.parallel.fit.check_batch_splits`).
    """
    check_batch_splits(batch_size, mesh_shape)
    return PartitionSpec(BATCH_AXES)
