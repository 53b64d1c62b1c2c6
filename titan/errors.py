"""The one exception type for mistakes a user can fix.

The CLI turns a :class:`TitanError` into a one-line message and exit code 2; the console turns it
into a notification. Everything else is a bug or an environment failure and is reported as such.
"""


class TitanError(Exception):
    """A user-facing error: bad option, bad input file, impossible layout.

    The message is one line and names the field (``--batch-size``, ``data``) and what is allowed.
    """
