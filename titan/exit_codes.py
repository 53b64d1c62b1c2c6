"""Exit codes of the ``titan`` commands, one table for the trainer, the CLI and ``titan launch``.

A wrapper (SLURM, Kubernetes, a shell loop) tells the outcomes of ``titan train`` apart by them:

- :data:`EXIT_OK` (0): the run completed (or, with ``--exit-zero-on-stop``, stopped).
- :data:`EXIT_FAILED` (1): the run failed (``run_end`` ``failed``).
- :data:`EXIT_USAGE` (2): bad input, refused with one line before the run started.
- :data:`EXIT_STALL` (3): the watchdog ended a stalled run (``--watchdog-abort``): restart it.
- :data:`EXIT_STOPPED` (4): a signal stopped the run after a checkpoint (``run_end``
  ``stopped``): resume it.
- :data:`EXIT_NONFINITE` (5): the loss or gradient norm was not finite (``--nonfinite abort``,
  or ``--nonfinite-patience`` such steps in a row; ``run_end`` ``failed``, reason
  ``nonfinite``): the last checkpoint holds finite weights, but a plain restart would diverge
  again; look at the data or the learning rate first.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STALL, EXIT_STOPPED, EXIT_NONFINITE = 0, 1, 2, 3, 4, 5


def worst_exit_code(codes: Iterable[int]) -> int:
    """The code that speaks for several processes of one run (``titan launch``): any failure
    (1, 2, 3, 5, a signal's 128 + S) outranks a stop, which outranks completion; among failures the
    highest code."""
    return max(codes, key=lambda code: (code not in (EXIT_OK, EXIT_STOPPED), code != EXIT_OK, code))
