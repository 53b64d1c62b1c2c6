"""The one exception type for mistakes a user can fix.

The CLI turns a :class:`TitanError` into a one-line message and exit code 2; the console turns it
into a notification. Everything else is a bug or an environment failure and is reported as such
(:func:`error_line`).
"""


class TitanError(Exception):
    """A user-facing error: bad option, bad input file, impossible layout.

    The message is one line and names the field (``--batch-size``, ``data``) and what is allowed.
    """


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message ("" when empty), less the JSON spec that
    tensorstore appends to its errors (kilobytes of ``[tensorstore_spec='{...}']``)."""
    text = str(err).strip().splitlines()
    return text[0].split(" [tensorstore_spec")[0] if text else ""


def error_line(err: BaseException) -> str:
    """An error as one line: ``Type: message`` (:func:`first_line`), or the type alone when
    the message is empty."""
    line = first_line(err)
    return f"{type(err).__name__}: {line}" if line else type(err).__name__
