"""The one array_record module grain imports (bench/stubs/array_record/__init__.py)."""

from typing import Any

PathLikeOrFileInstruction = Any  # what grain's data_sources declares where array_record is absent


class ArrayRecordDataSource:
    """array_record's data source; not available in the stand-in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("array_record stand-in (bench/stubs): install array_record to read")
