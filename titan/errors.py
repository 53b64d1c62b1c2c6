"""The one exception type for mistakes a user can fix.

The CLI turns a :class:`TitanError` into a one-line message and exit code 2; the console turns it
into a notification. Everything else is a bug or an environment failure and is reported as such
(:func:`error_line`).
"""


class TitanError(Exception):
    """A user-facing error: bad option, bad input file, impossible layout.

    The message is one line and names the field (``--batch-size``, ``data``) and what is allowed.
    """


class CheckpointDamaged(TitanError):
    """A checkpoint's files are missing, incomplete or changed on disk: a damaged checkpoint,
    whatever layout reads it (told apart from a layout that cannot be mapped onto another)."""


# What tensorstore and orbax append to an error's first line: the store's spec, kilobytes of
# JSON (``[tensorstore_spec='{...}']``; orbax: ``See full TensorStore details: <...spec of
# TensorStore({``, the rest of it on the lines after).
_SPEC_SUFFIXES = (" [tensorstore_spec", " See full TensorStore details")


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message ("" when empty), less the store spec that
    tensorstore and orbax append to it (:data:`_SPEC_SUFFIXES`)."""
    text = str(err).strip().splitlines()
    line = text[0] if text else ""
    for suffix in _SPEC_SUFFIXES:
        line = line.split(suffix)[0]
    return line


def root_cause(err: BaseException) -> BaseException:
    """The error that ``err`` was raised from (``raise ... from``), followed to its end: orbax
    wraps a checkpoint read's error (tensorstore's, which names the array and the file) in one
    that names only the array's index."""
    seen = {id(err)}
    while err.__cause__ is not None and id(err.__cause__) not in seen:
        err = err.__cause__
        seen.add(id(err))
    return err


def error_line(err: BaseException) -> str:
    """An error as one line: ``Type: message`` (:func:`first_line`), or the type alone when
    the message is empty."""
    line = first_line(err)
    return f"{type(err).__name__}: {line}" if line else type(err).__name__
