"""Device meshes of the training layouts, and the shardings of a chunk's state on them.

- SPMD (``--layout spmd``): one mesh with axes (data, fsdp, tensor) over the first
  dp x fsdp x tp devices of ``jax.devices()``.
- MPMD (``--layout mpmd``): ``pp`` pipeline stages of dp x fsdp x tp devices
  each, every stage a sub-mesh with the same axes.

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
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from titan.parallel.fit import resolve_mesh_shape
from titan.parallel.sharding import MESH_AXES, axis_rules, batch_spec, mesh_spec


def _path_name(path: tuple) -> str:
    return "/".join(str(getattr(key, "key", key)) for key in path)


@dataclass(frozen=True)
class DeviceMesh:
    """A mesh with axes ``data``, ``fsdp``, ``tensor``: the whole SPMD layout, or one pipeline
    stage's devices."""

    jax_mesh: Mesh

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.jax_mesh.shape)

    @property
    def device_count(self) -> int:
        return int(self.jax_mesh.devices.size)

    @property
    def processes(self) -> frozenset[int]:
        """Indices of the processes whose devices are in this mesh."""
        return frozenset(int(d.process_index) for d in self.jax_mesh.devices.flat)

    @property
    def is_local(self) -> bool:
        """Whether this process owns devices of the mesh (and so runs its programs)."""
        return jax.process_index() in self.processes

    def param_shardings(self, shapes: Any, logical: Any) -> Any:
        """NamedShardings for a tree of parameter shapes and their logical axes.

        Args:
            shapes: tree of arrays or ``jax.ShapeDtypeStruct``.
            logical: the same tree with a ``PartitionSpec`` of logical axis names per leaf.

        Raises:
            TitanError: a parameter dimension does not divide its mesh axis.
        """

        def to_sharding(path, spec, leaf):
            physical = mesh_spec(_path_name(path), spec, leaf.shape, self.mesh_shape)
            return NamedSharding(self.jax_mesh, physical)

        return jax.tree_util.tree_map_with_path(
            to_sharding, logical, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Context for tracing programs on this mesh: the model's logical activation
        constraints resolve to this mesh's axes."""
        with jax.set_mesh(self.jax_mesh), nn.logical_axis_rules(axis_rules()):
            yield

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.jax_mesh, PartitionSpec())

    def batch_sharding(self, batch_size: int) -> NamedSharding:
        """Sharding of (B, ...) batch arrays. Raises TitanError if B does not split evenly."""
        return NamedSharding(self.jax_mesh, batch_spec(batch_size, self.mesh_shape))

    def shard_batch(
        self, batch: dict[str, np.ndarray], rows: int | None = None
    ) -> dict[str, jax.Array]:
        """Place host arrays on the mesh as a global batch of ``rows`` rows: ``batch`` holds
        the rows this process's devices hold (:meth:`process_rows`), all of them by default."""
        return {key: self.shard_rows(value, rows) for key, value in batch.items()}

    def shard_rows(self, value: np.ndarray, rows: int | None = None) -> jax.Array:
        rows = rows or value.shape[0]
        sharding = self.batch_sharding(rows)
        return jax.make_array_from_process_local_data(sharding, value, (rows, *value.shape[1:]))

    def process_rows(self, batch_size: int) -> np.ndarray:
        """(R,) sorted indices of the rows of a (B, ...) batch that this process's devices hold
        (every row once, whichever of its devices hold it)."""
        indices = self.batch_sharding(batch_size).addressable_devices_indices_map((batch_size,))
        held = [index for index in indices.values() if index is not None]  # JAX: Optional
        rows = {r for index in held for r in range(batch_size)[index[0]]}
        return np.array(sorted(rows), dtype=np.int64)

    def state_shardings(
        self, tx: optax.GradientTransformation, shapes: Any, logical: Any
    ) -> tuple[Any, Any]:
        """(shardings, abstract arrays carrying them) of a chunk's ``{"params", "opt_state"}``
        on this mesh; optimizer moments follow their parameter, scalars are replicated.

        Args:
            shapes: tree of the chunk's parameter shapes (``jax.ShapeDtypeStruct``).
            logical: the same tree with each parameter's logical axes (``PartitionSpec``).

        Raises:
            TitanError: a parameter dimension does not divide its mesh axis.
        """
        param_shardings = self.param_shardings(shapes, logical)
        abstract_opt = jax.eval_shape(tx.init, shapes)
        opt_shardings = optax.tree_utils.tree_map_params(
            tx,
            lambda _, sharding: sharding,
            abstract_opt,
            param_shardings,
            transform_non_params=lambda _: self.replicated(),
        )
        shardings = {"params": param_shardings, "opt_state": opt_shardings}
        abstract = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            {"params": shapes, "opt_state": abstract_opt},
            shardings,
        )
        return shardings, abstract


def _device_mesh(devices: list, shape: dict[str, int]) -> Mesh:
    sizes = [shape[axis] for axis in MESH_AXES]
    return Mesh(mesh_utils.create_device_mesh(sizes, devices), MESH_AXES)


def build_stage_meshes(dp: int, fsdp: int, tp: int, pp: int) -> list[DeviceMesh]:
    """One :class:`DeviceMesh` per stage: ``pp`` stages (1 for SPMD) of dp x fsdp x tp
    consecutive devices of ``jax.devices()``.

    Raises:
        TitanError: when the devices present cannot hold the layout.
    """
    devices = jax.devices()
    shape = resolve_mesh_shape(dp, fsdp, tp, pp, len(devices), jax.default_backend())
    size = int(np.prod(list(shape.values())))
    return [DeviceMesh(_device_mesh(devices[s * size : (s + 1) * size], shape)) for s in range(pp)]


def remote_array(abstract: jax.ShapeDtypeStruct) -> jax.Array:
    """A handle, on a process that holds none of its shards, to an array of ``abstract``'s shape,
    dtype and sharding that other processes hold: what this process passes to a collective or
    transfer that involves the array (:func:`titan.layouts.mpmd.transfer`)."""
    return jax.make_array_from_single_device_arrays(
        abstract.shape, abstract.sharding, [], dtype=abstract.dtype
    )


def host_mesh() -> DeviceMesh:
    """A one-device CPU mesh of this process: where checkpoints are read to host memory before
    re-cutting."""
    device = jax.local_devices(backend="cpu")[0]
    return DeviceMesh(Mesh(np.array([device]).reshape(1, 1, 1), MESH_AXES))
