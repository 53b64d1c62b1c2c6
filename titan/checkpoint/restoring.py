"""Restoring checkpoints: onto the chunks that wrote them or onto others (re-cut), whole or their
parameters alone, and the newest one that can be read.

Restoring onto the same chunks (any mesh inside them) restores each array straight into its
new sharding. Restoring onto other chunks (another ``pp``, virtual stages, or SPMD from MPMD
and back) reads the items to host memory, joins the layer stacks in model order along the model
family's layer axis, cuts them at the new chunk boundaries and places them on the new devices
(:func:`reshard_items`). Each array's saved dtype is checked before orbax would cast it, and
what was read is compared with the digests its meta keeps
(:mod:`titan.checkpoint.finite_check`). A checkpoint that cannot be read is
:class:`Unrestorable`, and the newest-first reads (:meth:`Restorer.restore_latest`,
:meth:`Restorer.read_newest`) go on with the one before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import jax
import orbax.checkpoint as ocp
import tensorstore as ts

from titan.checkpoint.finite_check import DIGESTS, PARAMS_DIGESTS, check_digests, read_digests
from titan.checkpoint.folder import CheckpointFolder
from titan.checkpoint.stage_store import STAGE_CHECKPOINT_DIR, check_dtype
from titan.errors import CheckpointDamaged, TitanError, error_line, first_line, root_cause
from titan.layouts.contract import ChunkState, Trainer, TrainState
from titan.models.adapters.base import ModelAdapter
from titan.parallel.chunks import Chunk, chunk_item, chunks_from_ranges, cut_layers, join_layers
from titan.parallel.mesh import DeviceMesh, host_mesh
from titan.reading import read_json

UNRESTORABLE_DIR = "unrestorable_checkpoints"  # where restore_latest moves the ones it skipped
# Checkpoints that a newest-first read may see deleted under it (a live run's retention) before
# it gives up: each time the folder is listed afresh and the newest committed one tried.
VANISHED_TRIES = 10
T = TypeVar("T")


def _restore_args(tree: Any, partial: bool) -> ocp.args.CheckpointArgs:
    """orbax's restore arguments of one item placed like ``tree`` (``jax.ShapeDtypeStruct``
    leaves carrying shardings). Each array is cast to its dtype, so its saved dtype is checked
    before (:meth:`Restorer._check_dtypes`). ``partial``: ``tree`` is part of the item and
    the rest of its arrays is not read."""
    if not partial:
        return ocp.args.StandardRestore(tree)
    restore_args = jax.tree.map(
        lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding, global_shape=leaf.shape), tree
    )
    return ocp.args.PyTreeRestore(tree, restore_args=restore_args, partial_restore=True)


def params_only(abstract: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``abstract`` (:meth:`Trainer.abstract_items`, or a function like it) cut to each item's
    ``params``: what a partial restore reads (:meth:`Restorer.restore_params`,
    :meth:`Restorer.restore_host` with ``partial``), leaving the optimizer state unread."""

    def cut(*args: Any) -> dict[str, Any]:
        return {name: {"params": item["params"]} for name, item in abstract(*args).items()}

    return cut


def _saved_dtypes(item: Path, names: Iterable[str]) -> dict[str, Any]:
    """The saved dtype of each array ``names`` of the orbax item at ``item``, read from its zarr
    metadata alone (no array data, and no other array's metadata: a partial restore needs
    nothing else of the item).

    Raises:
        TitanError: the item's ``_METADATA`` cannot be read.
        ValueError: an array is missing or its metadata cannot be read (tensorstore's error).
    """
    layout = read_json(item / "_METADATA", "checkpoint")
    driver = "zarr3" if layout.get("use_zarr3") else "zarr"
    dtypes = {}
    for name in names:
        if layout.get("use_ocdbt", True):
            spec = {"kvstore": {"driver": "ocdbt", "base": f"file://{item}/"}, "path": name}
        else:
            spec = {"kvstore": {"driver": "file", "path": str(item / name)}}
        array = ts.open({"driver": driver, **spec}, open=True).result()
        dtypes[name] = array.dtype.numpy_dtype
    return dtypes


def _leaf_dtypes(tree: Any) -> dict[str, Any]:
    """orbax's leaf name (:func:`_key_name`) -> dtype, of each leaf of ``tree``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(map(_key_name, path)): leaf.dtype for path, leaf in leaves}


def _layout_name(layout: dict[str, Any]) -> str:
    if layout["layout"] == "spmd":
        return f"spmd {layout['mesh']}"
    return f"mpmd pp={layout['pp']} v={layout['virtual_stages']} stage mesh {layout['stage_mesh']}"


def reshard_items(
    saved: dict[str, ChunkState],
    saved_chunks: list[Chunk],
    target: dict[str, ChunkState],
    target_chunks: list[Chunk],
    adapter: ModelAdapter,
) -> dict[str, ChunkState]:
    """Re-cut host checkpoint items at new chunk boundaries and place them per ``target``.

    Args:
        saved: ``chunk_<c>`` -> tree of host arrays, in the saved layout.
        target: ``chunk_<c>`` -> tree of ``jax.ShapeDtypeStruct`` with shardings.
        adapter: the model family (which arrays stack layers, along which axis).

    Raises:
        TitanError: an array of the target has no counterpart in the checkpoint.
    """
    stacked, axis = adapter.is_layer_stacked, adapter.layer_axis
    joined = join_layers([saved[chunk_item(c.index)] for c in saved_chunks], stacked, axis)
    return {
        chunk_item(c.index): cut_layers(joined, target[chunk_item(c.index)], c, stacked, axis)
        for c in target_chunks
    }


@dataclass(frozen=True)
class Unrestorable:
    """A checkpoint that could not be restored (corrupt, written by an incompatible layout, or
    a step folder without ``meta``); the restore went on with an older one."""

    step: int
    error: str


def _key_name(key: Any) -> str:
    """One key of a tree path as orbax names it in a leaf's name (``opt_state.0.mu.embed``)."""
    for field in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey
        if hasattr(key, field):
            return str(getattr(key, field))
    return str(key)


class Restorer:
    """Reads a run's checkpoints back: into a trainer's layout, into host memory as written, or
    the newest one that can be read.

    Args:
        folder: the run's checkpoints.
    """

    def __init__(self, folder: CheckpointFolder) -> None:
        self._folder = folder

    def restore_latest(
        self,
        trainer: Trainer,
        verify: Callable[[int, TrainState, dict[str, Any]], None] | None = None,
    ) -> tuple[TrainState, dict[str, Any], list[Unrestorable]] | None:
        """Restore the newest committed checkpoint that restores, newest first; ``verify(step,
        state, meta)`` may refuse a restored one (raising :class:`TitanError`), which then
        counts as unrestorable (:func:`titan.trainer.saver.digest_check`).

        Returns:
            None when there is no committed checkpoint; else (state, meta, the newer
            checkpoints that could not be restored and the step folders of any step that hold
            no ``meta``; nothing on disk changes here: the caller moves them aside with
            :meth:`set_aside` once the run has started, so that their steps can be saved
            again and nothing keeps them from retention's count).

        Raises:
            TitanError: none restores (how many were tried, and the newest one's error).
        """

        def read(step: int) -> tuple[TrainState, dict[str, Any]]:
            state, meta = self.restore(step, trainer)
            if verify is not None:
                verify(step, state, meta)
            return state, meta

        restored, skipped = self._newest_readable(read)
        if restored is not None:
            return *restored, skipped + self.uncommitted()
        if len(skipped) > 1:  # that the older ones were tried too
            raise TitanError(
                f"--resume: none of the {len(skipped)} committed checkpoints can be restored "
                f"(the newest: {skipped[0].error})"
            )
        if skipped:
            raise TitanError(f"--resume: {skipped[0].error}")
        return None

    def uncommitted(self) -> list[Unrestorable]:
        """The step folders without ``meta``: no save of this run leaves one (orbax renames a
        whole folder), so a copy of the run dir cut short, or a delete cut short, did."""
        steps = sorted(
            s for s in self._folder.manager.all_steps() if not self._folder.is_committed(s)
        )
        reason = "no meta: a copy or a delete of it was cut short"
        return [Unrestorable(step, f"{self._folder.path(step)} holds {reason}") for step in steps]

    def restore_params_newest(self, trainer: Trainer) -> tuple[list[Any], int, list[Unrestorable]]:
        """:meth:`restore_params` of the newest committed checkpoint that can be read, newest
        first (``titan generate`` and ``--init-from`` of a run dir).

        Returns:
            (one parameter tree per chunk of ``trainer``, the step read, the newer checkpoints
            that could not be read; nothing on disk changes).

        Raises:
            TitanError: there is no committed checkpoint, or none can be read (names the
                checkpoints' folder and the newest one's error).
        """
        return self.read_newest(lambda step: self.restore_params(step, trainer))

    def check_committed(self, step: int | None) -> None:
        """Refuse to read ``step`` (None: the newest) where it is not committed.

        Raises:
            TitanError: no committed checkpoint at all, or none of ``step`` (names the steps
                there are).
        """
        steps = self._folder.committed_steps()
        if not steps:
            raise TitanError(f"{self._folder.directory.parent}: no committed checkpoint")
        if step is not None and step not in steps:
            raise TitanError(
                f"--step {step}: {self._folder.directory.parent} has no checkpoint of it "
                f"(it has: {', '.join(map(str, steps))})"
            )

    def read_params(
        self, step: int | None, trainer: Trainer
    ) -> tuple[list[Any], int, list[Unrestorable]]:
        """(the parameters of checkpoint ``step`` (:meth:`restore_params`), or of the newest
        that can be read (None, :meth:`restore_params_newest`), the step read, the newer
        checkpoints that could not be read).

        Raises:
            TitanError: as :meth:`restore_params` or :meth:`restore_params_newest`.
        """
        if step is None:
            return self.restore_params_newest(trainer)
        return self.restore_params(step, trainer), step, []

    def read_newest(self, read: Callable[[int], T]) -> tuple[T, int, list[Unrestorable]]:
        """``read(step)`` of the newest committed checkpoint that it reads, newest first.

        Returns:
            (what ``read`` returned, the step read, the newer checkpoints that could not be
            read).

        Raises:
            TitanError: there is no committed checkpoint, or none can be read (names the
                checkpoints' folder and the newest one's error).
        """
        done, skipped = self._newest_readable(lambda step: (read(step), step))
        if done is not None:
            return *done, skipped
        if not skipped:
            raise TitanError(f"{self._folder.directory}: no committed checkpoint")
        raise TitanError(
            f"{self._folder.directory}: none of the {len(skipped)} committed checkpoints can be "
            f"read (the newest: {skipped[0].error})"
        )

    def _newest_readable(self, read: Callable[[int], T]) -> tuple[T | None, list[Unrestorable]]:
        """(``read(step)`` of the newest committed checkpoint it reads, None when it reads
        none; the newer checkpoints it could not read, each with its error in one line).

        The folder is listed afresh before each try: a run still training (``titan generate``
        of a live run) commits new checkpoints and deletes old ones meanwhile. A checkpoint
        deleted while it was read is not unreadable: the newest one committed then is read
        instead, up to :data:`VANISHED_TRIES` times (then it counts as unreadable)."""
        skipped: list[Unrestorable] = []
        vanished = 0
        while steps := [s for s in self._listed_steps() if s not in {u.step for u in skipped}]:
            step = steps[-1]
            try:
                return read(step), skipped
            except Exception as err:  # noqa: BLE001 - a corrupt checkpoint: try the previous
                if (
                    not self._folder.is_committed(step)
                    and (vanished := vanished + 1) < VANISHED_TRIES
                ):
                    continue
                message = str(err) if isinstance(err, TitanError) else self._unreadable(step, err)
                skipped.append(Unrestorable(step, message.splitlines()[0]))
        return None, skipped

    def _listed_steps(self) -> list[int]:
        """:meth:`committed_steps` of the folder as it is now (orbax's manager lists it once,
        when made, and then knows only its own saves). A checkpoint deleted while orbax lists
        the folder (its files stat-ed after its name was found) makes it list again, up to
        :data:`VANISHED_TRIES` times; then the last listing, less what is gone, is used."""
        for _ in range(VANISHED_TRIES):
            try:
                self._folder.manager.reload()
                break
            except FileNotFoundError:
                continue
        return self._folder.committed_steps()

    def restore(self, step: int, trainer: Trainer) -> tuple[TrainState, dict[str, Any]]:
        """Restore checkpoint ``step`` into ``trainer``'s layout (resharding as needed).

        Returns:
            (train state, meta).

        Raises:
            TitanError: the checkpoint cannot be mapped onto the trainer's model (names both
                layouts).
        """
        items, meta = self._restore_onto(step, trainer, trainer.abstract_items, partial=False)
        return TrainState.from_items(items, step), meta

    def restore_params(self, step: int, trainer: Trainer) -> list[Any]:
        """The parameters of checkpoint ``step`` on ``trainer``'s chunks (resharded as needed),
        without reading its optimizer state: orbax's partial restore reads only the arrays of
        ``params``, a third of the bytes under AdamW (whose two moments are each the
        parameters' size).

        Returns:
            One parameter tree per chunk of ``trainer``, in model order, placed in its
            shardings.

        Raises:
            TitanError: the checkpoint cannot be read (names it and its folder: a truncated or
                garbled file, or parameters unlike their saved digest) or mapped onto the
                trainer's model.
        """
        try:
            abstract = params_only(trainer.abstract_items)
            items, _ = self._restore_onto(step, trainer, abstract, partial=True)
        except TitanError:
            raise
        except Exception as err:  # noqa: BLE001 - tensorstore's DATA_LOSS, orbax's wrap of it
            raise TitanError(self._unreadable(step, err)) from None
        return [items[chunk_item(c.index)]["params"] for c in trainer.chunks]

    def _restore_onto(
        self, step: int, trainer: Trainer, abstract: Callable[..., dict[str, Any]], partial: bool
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the items of checkpoint ``step`` placed like ``abstract()``, its meta):
        ``abstract`` is ``trainer.abstract_items`` or a part of each item (``partial``)."""
        meta = self._folder.meta(step)
        current = trainer.describe().to_json()  # compared with the meta's JSON
        try:
            if meta["layout"]["chunks"] == current["chunks"]:
                items = self._restore_items(step, meta, abstract(), partial)
                # a whole state is checked on its devices (titan.trainer.saver.digest_check);
                # several processes' sums would need unsigned collectives, which gloo lacks
                if partial and jax.process_count() == 1:
                    _check_as_read(step, meta, items, trainer.chunks, partial)
            else:  # checked as written, before the cut
                saved, saved_chunks, _ = self.restore_host(step, abstract, partial)
                adapter = trainer.adapter
                items = reshard_items(saved, saved_chunks, abstract(), trainer.chunks, adapter)
        except CheckpointDamaged as err:  # damaged whatever the layouts
            raise TitanError(self._unreadable(step, err)) from None
        except (ValueError, KeyError, TitanError) as err:
            written, target = _layout_name(meta["layout"]), _layout_name(current)
            if written == target:
                raise TitanError(self._unreadable(step, err)) from None
            raise TitanError(
                f"checkpoint {step} written by {written} cannot be restored onto {target}: "
                f"{first_line(err)}"
            ) from None
        return items, meta

    def set_aside(self, steps: list[int]) -> None:
        """Move the unrestorable checkpoints newer than the restored one to
        ``<run dir>/unrestorable_checkpoints/<step>``, with their stage items (its
        ``stage_checkpoints``), kept for inspection; the run saves those steps again. Process
        0 moves them; every process then re-reads the steps."""
        if not steps:
            return
        if ocp.multihost.process_index() == 0:
            aside = self._folder.directory.parent / UNRESTORABLE_DIR
            aside.mkdir(exist_ok=True)
            for step in steps:
                target = aside / str(step)
                suffix = 1
                while target.exists():
                    target, suffix = aside / f"{step}.{suffix}", suffix + 1
                self._folder.path(step).rename(target)
                self._folder.stages.move(step, target / STAGE_CHECKPOINT_DIR)
        ocp.multihost.sync_global_processes("titan:unrestorable-set-aside")
        self._folder.manager.reload()

    def _restore_items(
        self, step: int, meta: dict[str, Any], abstract: dict[str, Any], partial: bool = False
    ) -> dict[str, Any]:
        """Items ``abstract`` names of checkpoint ``step``, placed like it; ``partial``: it holds
        part of each item (orbax then reads only that part; stage items are read leaf by leaf
        anyway)."""
        kept = set(meta.get("stage_items", []))
        items = {name: self._folder.stages.restore(step, name, abstract[name]) for name in kept}
        args = {
            name: _restore_args(tree, partial)
            for name, tree in abstract.items()
            if name not in kept
        }
        for name in args:  # orbax would cast each array to the target's dtype (partial too)
            item = self._folder.path(step) / name
            if partial:  # the arrays read only: the others may be absent
                saved = _saved_dtypes(item, _leaf_dtypes(abstract[name]))
            else:
                metadata = ocp.StandardCheckpointHandler().metadata(item)
                saved = {leaf.name: leaf.dtype for leaf in jax.tree.leaves(metadata)}
            self._check_dtypes(step, name, abstract[name], saved)
        if args:
            items.update(self._folder.manager.restore(step, args=ocp.args.Composite(**args)))
        return items

    def _check_dtypes(self, step: int, name: str, abstract: Any, saved: dict[str, Any]) -> None:
        """:func:`titan.checkpoint.stage_store.check_dtype` for each leaf of orbax item ``name``
        (``saved``: its saved dtypes by orbax's leaf names)."""
        for leaf_name, dtype in _leaf_dtypes(abstract).items():
            if leaf_name in saved:
                check_dtype(step, name, leaf_name, saved[leaf_name], dtype)

    def restore_host(
        self,
        step: int,
        abstract: Callable[[list[Chunk], DeviceMesh], dict[str, Any]],
        partial: bool = False,
    ) -> tuple[dict[str, Any], list[Chunk], dict[str, Any]]:
        """Read checkpoint ``step`` as written, into this process's host memory.

        Args:
            abstract: (the checkpoint's chunks, the host mesh) -> their items as
                ``jax.ShapeDtypeStruct`` trees (:meth:`Trainer.abstract_items`).
            partial: ``abstract`` holds part of each item (its ``params``): only that is read.

        Returns:
            (``chunk_<c>`` -> host state, the checkpoint's chunks, its meta).

        Raises:
            TitanError: the checkpoint cannot be read (corrupt metadata or arrays).
            CheckpointDamaged: what was read does not match the digests saved in its meta
                (:func:`_check_as_read`).
        """
        try:
            meta = self._folder.meta(step)
            saved_chunks = chunks_from_ranges(meta["layout"]["chunks"])
            items = self._restore_items(step, meta, abstract(saved_chunks, host_mesh()), partial)
            _check_as_read(step, meta, items, saved_chunks, partial)
        except TitanError:
            raise
        except Exception as err:  # noqa: BLE001 - tensorstore's DATA_LOSS, a hand-edited meta
            raise TitanError(self._unreadable(step, err)) from None
        return items, saved_chunks, meta

    def _unreadable(self, step: int, err: Exception) -> str:
        """Why checkpoint ``step`` cannot be read, in one line: Titan's own message, else the
        error at the root of ``err`` (tensorstore's names the array and the file)."""
        why = first_line(err) if isinstance(err, TitanError) else error_line(root_cause(err))
        return f"checkpoint {step} ({self._folder.path(step)}) cannot be read: {why}"


def _check_as_read(
    step: int, meta: dict[str, Any], items: dict[str, Any], chunks: list[Chunk], partial: bool
) -> None:
    """Checkpoint ``step``'s ``items`` as read (whole chunks, or their ``params`` alone:
    ``partial``) against the digests saved in its ``meta``
    (:func:`titan.checkpoint.finite_check.check_digests`); none saved (an older checkpoint, or
    one of several processes): nothing is compared.

    Raises:
        CheckpointDamaged: a chunk, or its parameters, do not match (names them).
    """
    if (PARAMS_DIGESTS if partial else DIGESTS) in meta:
        read = [items[chunk_item(c.index)] for c in chunks]
        check_digests(step, meta, read_digests(read, partial))
