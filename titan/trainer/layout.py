"""Layout sharding: device meshes of the training layouts, model chunks and their shardings.

- SPMD (``--layout spmd``): one mesh with axes (data, fsdp, tensor) over the first
  dp x fsdp x tp devices of ``jax.devices()``, one model chunk (the whole model).
- MPMD (``--layout mpmd``): ``pp`` device groups of dp x fsdp x tp devices each, every group a
  sub-mesh with the same axes; the model is cut into ``pp * virtual_stages`` chunks of
  consecutive layers (:func:`plan_chunks`), chunk c on group c % pp.

``jax.devices()`` lists every process's devices, so under ``jax.distributed.initialize`` the
meshes are global. Parameter shardings come from the logical rules of
:mod:`titan.parallel.sharding`; optimizer moments follow their parameter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from titan.config import ModelConfig, TrainConfig
from titan.errors import TitanError
from titan.parallel.sharding import MESH_AXES, axis_rules, batch_spec, mesh_spec


def resolve_mesh_shape(cfg: TrainConfig, device_count: int) -> dict[str, int]:
    """Mesh axis sizes of one device group, with ``--dp 0`` filled from the devices left.

    Raises:
        TitanError: when the layout asks for more devices than are present.
    """
    per_dp = cfg.pp * cfg.fsdp * cfg.tp
    dp = cfg.dp or device_count // per_dp
    asked = max(dp, 1) * per_dp
    if dp == 0 or asked > device_count:
        pp = f" x --pp {cfg.pp}" if cfg.layout == "mpmd" else ""
        raise TitanError(
            f"--dp {max(dp, 1)} x --fsdp {cfg.fsdp} x --tp {cfg.tp}{pp} = {asked} devices "
            f"asked, {device_count} present ({jax.default_backend()})"
        )
    return {"data": dp, "fsdp": cfg.fsdp, "tensor": cfg.tp}


def _path_name(path: tuple) -> str:
    return "/".join(str(getattr(key, "key", key)) for key in path)


@dataclass(frozen=True)
class MeshLayout:
    """A mesh with axes ``data``, ``fsdp``, ``tensor``: the whole SPMD layout, or one pipeline
    stage's device group."""

    mesh: Mesh

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def param_shardings(self, boxed_params: Any) -> Any:
        """NamedShardings for a tree of ``nn.LogicallyPartitioned`` (abstract) parameters.

        Raises:
            TitanError: a parameter dimension does not divide its mesh axis.
        """
        logical = nn.get_partition_spec(boxed_params)
        shapes = nn.unbox(boxed_params)

        def to_sharding(path, spec, leaf):
            physical = mesh_spec(_path_name(path), spec, leaf.shape, self.mesh_shape)
            return NamedSharding(self.mesh, physical)

        return jax.tree_util.tree_map_with_path(
            to_sharding, logical, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Context for tracing programs on this mesh: the model's logical activation
        constraints resolve to this mesh's axes."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(axis_rules()):
            yield

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def batch_sharding(self, batch_size: int) -> NamedSharding:
        """Sharding of (B, ...) batch arrays. Raises TitanError if B does not split evenly."""
        return NamedSharding(self.mesh, batch_spec(batch_size, self.mesh_shape))

    def shard_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Place host arrays (B, ...) on the mesh (this process's rows on multi-host)."""
        return {key: self.shard_rows(value) for key, value in batch.items()}

    def shard_rows(self, value: np.ndarray) -> jax.Array:
        sharding = self.batch_sharding(value.shape[0])
        return jax.make_array_from_process_local_data(sharding, value)


def _device_mesh(devices: list, shape: dict[str, int]) -> Mesh:
    sizes = [shape[axis] for axis in MESH_AXES]
    return Mesh(mesh_utils.create_device_mesh(sizes, devices), MESH_AXES)


def build_group_layouts(cfg: TrainConfig) -> list[MeshLayout]:
    """One :class:`MeshLayout` per device group: ``pp`` groups (1 for SPMD) of
    dp x fsdp x tp consecutive devices.

    Raises:
        TitanError: when the devices present cannot hold the layout.
    """
    devices = jax.devices()
    shape = resolve_mesh_shape(cfg, len(devices))
    size = int(np.prod(list(shape.values())))
    return [
        MeshLayout(_device_mesh(devices[g * size : (g + 1) * size], shape)) for g in range(cfg.pp)
    ]


@dataclass(frozen=True)
class Chunk:
    """A model chunk: layers [start, end), with the embedding if first, the head if last.

    Attributes:
        index: position in the model, 0 .. chunks - 1.
        group: device group that runs it (index % pp).
    """

    index: int
    group: int
    start: int
    end: int
    first: bool
    last: bool

    @property
    def n_layers(self) -> int:
        return self.end - self.start


def plan_chunks(cfg: TrainConfig, model: ModelConfig) -> list[Chunk]:
    """Cut ``model`` into pp x virtual_stages chunks (one for SPMD): an even split, or the
    ``--stage-layers`` counts.

    Raises:
        TitanError: counts that do not sum to the layers, or layers that do not split evenly.
    """
    chunks = cfg.pp * cfg.virtual_stages if cfg.layout == "mpmd" else 1
    if cfg.stage_layers and cfg.layout == "mpmd":
        try:
            counts = [int(part) for part in cfg.stage_layers.split(",")]
        except ValueError:
            raise TitanError(f"--stage-layers {cfg.stage_layers!r} must be integers") from None
        if len(counts) != chunks or sum(counts) != model.n_layers or min(counts) < 1:
            raise TitanError(
                f"--stage-layers {cfg.stage_layers} must give {chunks} positive counts summing "
                f"to the {model.n_layers} layers of --preset {cfg.preset}"
            )
    elif model.n_layers % chunks:
        raise TitanError(
            f"{model.n_layers} layers of --preset {cfg.preset} do not split evenly into "
            f"--pp {cfg.pp} x --virtual-stages {cfg.virtual_stages} chunks (see --stage-layers)"
        )
    else:
        counts = [model.n_layers // chunks] * chunks
    bounds = np.cumsum([0, *counts])
    return [
        Chunk(c, c % cfg.pp, int(bounds[c]), int(bounds[c + 1]), c == 0, c == chunks - 1)
        for c in range(chunks)
    ]


def chunk_state_layout(
    layout: MeshLayout, tx: optax.GradientTransformation, boxed_params: Any
) -> tuple[Any, Any]:
    """(shardings, abstract arrays carrying them) of a chunk's ``{"params", "opt_state"}``;
    optimizer moments follow their parameter, scalars are replicated.

    Raises:
        TitanError: a parameter dimension does not divide its mesh axis.
    """
    param_shardings = layout.param_shardings(boxed_params)
    abstract_params = nn.unbox(boxed_params)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_shardings = optax.tree_utils.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        abstract_opt,
        param_shardings,
        transform_non_params=lambda _: layout.replicated(),
    )
    shardings = {"params": param_shardings, "opt_state": opt_shardings}
    abstract = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        {"params": abstract_params, "opt_state": abstract_opt},
        shardings,
    )
    return shardings, abstract


def cast_tree(tree: Any, dtype: jnp.dtype) -> Any:
    """Every leaf of ``tree`` as ``dtype`` (parameters to the compute dtype)."""
    return jax.tree.map(lambda leaf: leaf.astype(dtype), tree)
