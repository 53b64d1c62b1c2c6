"""The order in which the processes of a run save one checkpoint, what pruning may delete, and
the fault-injection points the tests kill processes at.

A save of step ``N`` goes through these phases, on every process alike
(:class:`titan.checkpoint.saving.SaveSequence`):

1. ``write``: each process writes the items it holds alone, the pipeline stages on its own
   devices (:mod:`titan.checkpoint.stage_store`, ``stage_checkpoints/N/chunk_<c>``).
2. ``barrier``: every process has written its items, or the save fails on every process (an
   all-gather of one flag: a process that could not write its items, a file too large or a
   read-only mount on that host alone, fails the save everywhere, and nobody waits for it).
3. ``commit``: orbax's save, on every process: each writes its shards of the other items and
   process 0 writes ``meta`` (which names the stage items) into ``N.orbax-checkpoint-tmp``;
   once every process has written (orbax's own barrier) process 0 renames it to ``N``. Step
   ``N`` is committed when ``N/meta`` exists. An asynchronous save does this in a background
   thread; the next save, or the wait for the last one, settles it.
4. ``seen``: every process has seen ``N`` committed (barrier ``titan:checkpoint-seen:N``). A
   save that failed stops before it: nothing is pruned after it.
5. ``prune``: process 0 removes what retention no longer keeps (each step's orbax folder first,
   which uncommits it, then its stage items) and the leftovers of saves that never committed,
   all of them of steps up to ``N`` (:func:`leftovers`).

So a step is committed only after every process has written its items, and pruning runs only
after a commit every process has seen. Every process is then past its own save of ``N``, and
none writes a step up to ``N`` again; a later save writes a higher step, which pruning leaves
alone. Pruning therefore never deletes an item that a commit names (retention keeps the newest
committed step) and never races a commit.

Each barrier's name carries the step, and JAX's barrier checks that every process passes the
same name: processes that disagree on whether a save committed (one at ``seen``, another already
at the next save) fail at once rather than prune apart.

Leftovers are a failed or killed save's ``<step>.orbax-checkpoint-tmp*`` folder and its stage
items. With one process they go as soon as the save has failed; with several, at the prune of
the next commit, or at the first save of the next run (all of them, whatever their step: before
the barrier that follows, nothing is being written).

Fault injection, for the tests (``tests/multiprocess/test_checkpoint_protocol.py``): with
``TITAN_CHECKPOINT_FAULT=PHASE:PROCESS:STEP`` the process with index ``PROCESS`` sends itself
SIGKILL at the start of ``PHASE`` of the save of ``STEP``; ``PHASE:PROCESS:STEP:SECONDS`` makes
it sleep that long there instead (to widen a race). ``STEP`` ``*`` matches every step. Unset,
:func:`fault_point` does nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import orbax.checkpoint as ocp

from titan.errors import TitanError
from titan.parallel.distributed import barrier, on_every_process, process_index

TMP_DIR_SUFFIX = ocp.path.step.TMP_DIR_SUFFIX  # orbax names a save in progress <step><this>...
PHASES = ("write", "barrier", "commit", "seen", "prune")
FAULT_ENV = "TITAN_CHECKPOINT_FAULT"


def fault_point(phase: str, step: int) -> None:
    """The start of ``phase`` of the save of ``step``: kill or pause this process there when
    ``TITAN_CHECKPOINT_FAULT`` says so (see the module docstring).

    Raises:
        TitanError: ``TITAN_CHECKPOINT_FAULT`` is malformed (names it and the allowed phases).
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fields = spec.split(":")
    if len(fields) not in (3, 4) or fields[0] not in PHASES:
        raise TitanError(
            f"{FAULT_ENV}={spec}: expected PHASE:PROCESS:STEP[:SECONDS], PHASE one of "
            f"{', '.join(PHASES)}"
        )
    who, when = fields[1], fields[2]
    if fields[0] != phase or int(who) != process_index() or when not in ("*", str(step)):
        return
    if len(fields) == 4:
        time.sleep(float(fields[3]))
        return
    os.kill(os.getpid(), signal.SIGKILL)


def written_everywhere(step: int, written: bool) -> bool:
    """The ``barrier`` phase of the save of ``step``: whether every process has written its own
    items (``written``: this one has), an all-gather of one flag on every process."""
    fault_point("barrier", step)
    return on_every_process(written)


def seen_everywhere(step: int) -> None:
    """The ``seen`` phase of the save of ``step``, committed: return once every process has seen
    it (barrier ``titan:checkpoint-seen:<step>``), at the start of the ``prune`` phase."""
    fault_point("seen", step)
    barrier(f"titan:checkpoint-seen:{step}")
    fault_point("prune", step)


def leftovers(folders: Iterable[Path], upto: int | None, kept: set[int] | None) -> list[Path]:
    """The folders among ``folders`` that pruning after the commit of step ``upto`` removes
    (``upto`` None: any step, when the run starts): orbax's temporary folders
    (``<step>.orbax-checkpoint-tmp*``) and, given ``kept`` (the committed steps retention
    keeps), the ``<step>`` folders of other steps. Folders of steps above ``upto`` may be a save
    in progress on another process and are never among them; other names neither."""
    chosen = []
    for folder in folders:
        head = folder.name.split(TMP_DIR_SUFFIX, 1)[0]
        if not head.isdigit() or (upto is not None and int(head) > upto):
            continue
        temporary = head != folder.name
        if temporary or (kept is not None and int(head) not in kept):
            chosen.append(folder)
    return sorted(chosen)
