"""Layout sharding: the device mesh of a training layout and the shardings derived from it.

The SPMD baseline uses one mesh with axes (data, fsdp, tensor) over the first dp x fsdp x tp
devices of ``jax.devices()`` (every process's devices, so multi-host runs under
``jax.distributed.initialize`` see the global mesh). Parameter shardings come from the logical
rules of :mod:`titan.parallel.sharding`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from titan.config import TrainConfig
from titan.errors import TitanError
from titan.parallel.sharding import MESH_AXES, batch_spec, mesh_spec


def resolve_mesh_shape(cfg: TrainConfig, device_count: int) -> dict[str, int]:
    """Mesh axis sizes for the options, with ``--dp 0`` filled from the devices left.

    Raises:
        TitanError: when the layout asks for more devices than are present.
    """
    dp = cfg.dp or device_count // (cfg.fsdp * cfg.tp)
    asked = max(dp, 1) * cfg.fsdp * cfg.tp
    if dp == 0 or asked > device_count:
        raise TitanError(
            f"--dp {max(dp, 1)} x --fsdp {cfg.fsdp} x --tp {cfg.tp} = {asked} devices asked, "
            f"{device_count} present ({jax.default_backend()})"
        )
    return {"data": dp, "fsdp": cfg.fsdp, "tensor": cfg.tp}


def _path_name(path: tuple) -> str:
    return "/".join(str(getattr(key, "key", key)) for key in path)


@dataclass(frozen=True)
class SpmdLayout:
    """One mesh for the whole model; one jitted program per step.

    Attributes:
        mesh: ``jax.sharding.Mesh`` with axes ``data``, ``fsdp``, ``tensor``.
    """

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

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def batch_sharding(self, batch_size: int) -> NamedSharding:
        """Sharding of (B, ...) batch arrays. Raises TitanError if B does not split evenly."""
        return NamedSharding(self.mesh, batch_spec(batch_size, self.mesh_shape))

    def shard_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Place a host batch on the mesh (this process's rows; global arrays on multi-host)."""
        sharding = self.batch_sharding(next(iter(batch.values())).shape[0])
        return {
            key: jax.make_array_from_process_local_data(sharding, value)
            for key, value in batch.items()
        }

    def describe(self) -> dict[str, Any]:
        """The layout as recorded in ``run_start`` and in checkpoints."""
        return {
            "layout": "spmd",
            "mesh": self.mesh_shape,
            "devices": int(self.mesh.devices.size),
        }


def build_spmd_layout(cfg: TrainConfig) -> SpmdLayout:
    """The SPMD mesh for ``cfg`` over the first dp x fsdp x tp global devices.

    Raises:
        TitanError: when the devices present cannot hold the layout.
    """
    devices = jax.devices()
    shape = resolve_mesh_shape(cfg, len(devices))
    sizes = [shape[axis] for axis in MESH_AXES]
    used = devices[: int(np.prod(sizes))]
    return SpmdLayout(Mesh(mesh_utils.create_device_mesh(sizes, used), MESH_AXES))
