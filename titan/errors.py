"""The one exception type for mistakes a user can fix.

The CLI turns a :class:`TitanError` into a one-line message and exit code 2; the console turns it
into a notification. Everything else is a bug or an environment failure and is reported as such
(:func:`error_line`).
"""


class TitanError(Exception):
    """A user-facing error: bad option, bad input file, impossible layout.

    The message is one line and names the field (``--batch-size``, ``data``) and what is allowed.
    """


def error_line(err: BaseException) -> str:
    """An error as one line: ``Type: message`` (the message's first line), or the type alone
    when the message is empty."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
