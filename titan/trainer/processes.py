"""What each process of a run does differently: one writer of the record, work done once, a
heartbeat per process.

With several processes (:mod:`titan.parallel.distributed`) process 0 is the run's one writer of
``events.jsonl``, ``config.json`` and ``tokenizer.model``; the others record nothing there
(:class:`MutedRecord`). Process 0 decides the run id (:func:`agreed_run_id`) and the tokenizer
(:func:`one_tokenizer`), and tokenizes the corpus into the cache while the others wait
(:func:`first_then_others`). Every process, process 0 too, keeps ``processes/<id>.json`` in the
run dir up to date (:class:`Heartbeat`), so that a dead or hung process is named by its host,
pid and the age of its last beat.

Heartbeat file fields: ``process`` (index), ``processes`` (count), ``host``, ``pid``, ``pgid``
(process group), ``started`` (unix s, when the process started, from /proc), ``step`` (last
step reported), ``beat`` (unix s of the last update), ``status`` (``running``, then the run's
``run_end`` status). :mod:`titan.analysis.liveness` reads them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from titan.config import flag_of, options_by_name
from titan.data.tokenizer import Tokenizer
from titan.errors import TitanError
from titan.parallel.distributed import (
    barrier,
    broadcast_bytes,
    broadcast_text,
    largest_over_processes,
    process_count,
    process_index,
    processes_without,
)
from titan.telemetry.events import Stall
from titan.telemetry.heartbeat import BEAT_INTERVAL_S, PROCESSES_DIR, ProcessId
from titan.telemetry.interval_thread import Ticker
from titan.telemetry.records import EventT, RunRecord, new_run_id, write_json_atomic

STALL_FIELDS = ("phase", "elapsed_s", "threshold_s", "step")  # published by a stalled process
T = TypeVar("T")


def is_writer() -> bool:
    """Whether this process writes the run's record (process 0)."""
    return process_index() == 0


def batch_rows(trainer: Any, batch_size: int) -> np.ndarray | None:
    """Rows of each global batch this process materialises (the trainer's
    ``process_rows``), or None for all of them (one process, or a layout that reads them all)."""
    if process_count() == 1:
        return None
    return trainer.process_rows(batch_size)


def agreed_run_id(preset: str) -> str:
    """A fresh run id, drawn by process 0 and the same on every process."""
    return broadcast_text(new_run_id(preset) if is_writer() else None)


HOST_OPTIONS = frozenset({"compilation_cache", "data_workers"})
"""Options that may differ between hosts of one run: a node-local compilation cache, the
tokenizer's workers for each host's CPUs."""


def same_options(options: dict[str, Any]) -> None:
    """Refuse a run whose processes were started with different options (by hand, or by a
    SLURM or Kubernetes script that varies them per task): each process compares its options
    (``TrainConfig.record()`` less :data:`HOST_OPTIONS`, and its ``--num-processes``) with
    process 0's, and every process
    learns whether any differ, so that all of them stop before the run starts.

    Raises:
        TitanError: this process's options differ from process 0's (naming the first
            options and both values), or another process's do.
    """
    if process_count() == 1:
        return
    options = {k: v for k, v in options.items() if k not in HOST_OPTIONS}
    mine = json.dumps(options, sort_keys=True)
    first = json.loads(broadcast_text(mine if is_writer() else None))
    differ = [name for name in sorted({*first, *options}) if first.get(name) != options.get(name)]
    if largest_over_processes(int(bool(differ))) == 0:
        return
    if not differ:
        raise TitanError(
            "another process of this run was started with other options (it names them); "
            "every process of a run takes the same options"
        )
    shown = "; ".join(
        f"{flag_of(name) if name in options_by_name() else name} {options.get(name)!r} "
        f"here, {first.get(name)!r} on process 0"
        for name in differ[:3]
    )
    raise TitanError(
        f"process {process_index()} was started with other options than process 0: {shown}; "
        "every process of a run takes the same options"
    )


def checked_on_every_process(check: Callable[[], T]) -> T:
    """``check()`` (a process's checks of its own inputs: the files it reads, its devices),
    whose refusal on any process stops every one before the run starts: the processes agree
    once all have checked, so that none waits in a later collective (the tokenizer's broadcast)
    for one that has left. One process: ``check()`` itself.

    Raises:
        TitanError: ``check()``'s own error on the process that refused; on the others, one
            line naming the processes that refused (their own output says why).
    """
    if process_count() == 1:
        return check()
    try:
        value = check()
    except TitanError:
        processes_without(False)
        raise
    refused = processes_without(True)
    if refused:
        named = ("process " if len(refused) == 1 else "processes ") + ", ".join(map(str, refused))
        raise TitanError(
            f"{named} of the run refused to start (its own output says why): nothing was started"
        )
    return value


def one_tokenizer(make: Callable[[], Tokenizer]) -> Tokenizer:
    """Process 0's tokenizer (``make()`` runs there only) on every process."""
    if process_count() == 1:
        return make()
    tokenizer = make() if is_writer() else None
    proto = broadcast_bytes(tokenizer.model_proto if tokenizer else None)
    return tokenizer or Tokenizer(proto)


def first_then_others(name: str, make: Callable[[], T]) -> T:
    """``make()`` on process 0, then, once it is done (barrier ``name``), on the others: for
    work that fills a cache the others then read (tokenizing the corpus)."""
    if is_writer():
        value = make()
        barrier(name)
        return value
    barrier(name)
    return make()


class MutedRecord(RunRecord):
    """The record of a process that is not the writer: events are built and returned (the
    progress line uses them) but written nowhere."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir, self.run_id = run_dir, run_id

    def emit(self, event: EventT) -> EventT:
        return dataclasses.replace(event, time=time.time(), run_id=self.run_id)

    def close(self) -> None:
        pass


def clear_heartbeats(run_dir: Path) -> None:
    """Remove the heartbeat files of the run's earlier attempts (``processes/*.json``), before
    this attempt's processes write theirs (the writer, before they pass a barrier): after a
    resume onto fewer processes, a process of an earlier attempt would otherwise read as lost
    by this one's peer watch (ending it), and to ``titan summarize`` and the console as a
    process of this attempt."""
    for path in (Path(run_dir) / PROCESSES_DIR).glob("*.json"):
        path.unlink(missing_ok=True)


class Heartbeat:
    """This process's ``processes/<id>.json``, rewritten (atomically) every
    :data:`~titan.telemetry.heartbeat.BEAT_INTERVAL_S` by a thread between :meth:`start`
    and :meth:`stop`, whatever the loop is doing (a hung step still beats: the process is alive;
    its ``step`` does not move), and by the loop at most as often; after a stall it also holds
    the stall (:meth:`stalled`), which the writer records (:mod:`titan.trainer.peers`)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / PROCESSES_DIR / f"{process_index()}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields: dict[str, Any] = {
            **ProcessId.current(process_index()).as_dict(),
            "processes": process_count(),
            "step": None,
            "status": "running",
        }
        self._last = 0.0
        self._lock = threading.Lock()  # the loop and the thread write the same file
        self._ticker = Ticker(BEAT_INTERVAL_S, self._beat_in_background, "titan-heartbeat")
        self.beat(None, force=True)

    def start(self) -> None:
        """Beat from a background thread until :meth:`stop`."""
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def beat(self, step: int | None, force: bool = False) -> None:
        """Record ``step`` as the last one done; writes only if a beat interval has passed (or
        ``force``)."""
        with self._lock:
            self.fields["step"] = step if step is not None else self.fields["step"]
            now = time.time()
            if force or now - self._last >= BEAT_INTERVAL_S:
                self._last = now
                write_json_atomic(self.path, {**self.fields, "beat": now})

    def _beat_in_background(self) -> None:
        """A beat from the thread. One that cannot be written (a full disk) is skipped: the
        loop's own beats meet the same error, which ends the run with one line."""
        with contextlib.suppress(OSError):
            self.beat(None)

    def in_phase(self, phase: str, step: int) -> None:
        """The loop entered ``phase`` working on ``step``: a checkpoint save is published at once
        (``saving``: its step; :meth:`ProcessBeat.doing`), so that a peer that waits for this
        process, or finds it lost, says so; the end of one with the next beat."""
        saving = step if phase == "checkpoint_save" else None
        if self.fields.get("saving") != saving:
            self.fields["saving"] = saving
            if saving is not None:
                self.beat(None, force=True)

    def stalled(self, stall: Stall) -> None:
        """Publish a stall this process's watchdog found (the writer records it)."""
        self.fields["stall"] = {name: getattr(stall, name) for name in STALL_FIELDS}
        self.beat(None, force=True)

    def close(self, status: str, step: int | None) -> None:
        """The last beat: the run's end status."""
        self.fields["status"] = status
        self.beat(step, force=True)
