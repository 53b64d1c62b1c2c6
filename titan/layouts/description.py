"""What a trainer records of its layout (:meth:`titan.layouts.contract.Trainer.describe`): the
``layout`` of ``run_start`` and of every checkpoint's meta, written as
:meth:`LayoutDescription.to_json`.

The JSON form is the one the records already on disk hold, key for key and in the same order:
SPMD writes ``layout``, ``mesh``, ``devices``, ``chunks``, and ``microbatches`` only when the step
accumulates (more than 1); MPMD writes ``layout``, ``pp``, ``virtual_stages``, ``microbatches``,
``schedule``, ``stage_mesh``, ``devices``, ``chunks``. Readers in the training process read the
fields; readers of records on disk (run summaries, the console, checkpoint restore) read the JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from titan.config import TrainLayout


@dataclass(frozen=True)
class LayoutDescription:
    """A trainer's layout as its records hold it.

    Attributes:
        layout: ``spmd`` or ``mpmd`` (``--layout``).
        mesh: the device mesh of one stage, axis name -> devices (``data``, ``fsdp``,
            ``tensor``): SPMD's one mesh (recorded as ``mesh``) or MPMD's mesh of every stage
            (recorded as ``stage_mesh``).
        devices: devices the layout uses, over all its stages.
        chunks: the model chunks as ``(start, end)`` layer ranges, in model order.
        microbatches: microbatches per step (SPMD: gradient accumulation, 1 when none).
        pp: pipeline stages (1 under SPMD).
        virtual_stages: chunks per stage (1 under SPMD).
        schedule: the pipeline schedule's name (:mod:`titan.schedules`); None under SPMD.
    """

    layout: TrainLayout
    mesh: dict[str, int]
    devices: int
    chunks: tuple[tuple[int, int], ...]
    microbatches: int = 1
    pp: int = 1
    virtual_stages: int = 1
    schedule: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form that ``run_start`` and checkpoints hold (see the module's docstring)."""
        return _JSON_FORMS[self.layout](self)

    def _placement(self) -> dict[str, Any]:
        return {"devices": self.devices, "chunks": [list(layers) for layers in self.chunks]}


def _spmd_json(d: LayoutDescription) -> dict[str, Any]:
    accumulation = {"microbatches": d.microbatches} if d.microbatches > 1 else {}
    return {"layout": "spmd", "mesh": dict(d.mesh), **d._placement(), **accumulation}


def _mpmd_json(d: LayoutDescription) -> dict[str, Any]:
    return {
        "layout": "mpmd",
        "pp": d.pp,
        "virtual_stages": d.virtual_stages,
        "microbatches": d.microbatches,
        "schedule": d.schedule,
        "stage_mesh": dict(d.mesh),
        **d._placement(),
    }


# Each layout's JSON form, by layout name.
_JSON_FORMS: dict[TrainLayout, Callable[[LayoutDescription], dict[str, Any]]] = {
    "spmd": _spmd_json,
    "mpmd": _mpmd_json,
}
