"""The bulk paths a stream handle runs, bound when it attaches (and handed to each of its
partitions): C's (``_fast.c``), or Python's, whose entries are None ("take the Python
path"), as ``queues/paths.py`` does for queues.
"""

from ..shm import cpaths
from .partitioner import murmur2_python

__all__ = ["PartitionPaths", "C", "PYTHON", "chosen"]

_CALLS = ("read_columns", "write_columns", "columns_check", "columns_end", "columns_log", "key_partitions",
          "compact_scan", "ring_drop")


class PartitionPaths:
    """``kind`` ("c" or "python"); the C calls (None each on the Python paths):
    ``read_columns`` (a partition's records as Arrow buffers), ``write_columns`` and the
    calls of its append (``columns_check``, ``columns_end``, ``columns_log``),
    ``key_partitions`` (each record's partition by its key: the Spark sink's routing);
    ``compact_scan`` (what a compaction keeps: ``compaction._scan``'s twin); ``ring_drop``
    (the records an append drops to make room: ``Partition._room``'s walk); and ``murmur2``,
    the key hash itself (the C one, or ``partitioner.murmur2_python``: the same numbers)."""

    __slots__ = ("kind", "murmur2", *_CALLS)

    def __init__(self, kind: str, calls=None):
        self.kind = kind
        for name in _CALLS:
            setattr(self, name, getattr(calls, name) if calls is not None else None)
        self.murmur2 = calls.murmur2 if calls is not None else murmur2_python

    @property
    def uses_c(self) -> bool:
        return self.kind == "c"

    def __repr__(self):
        return f"<PartitionPaths {self.kind}>"


PYTHON = PartitionPaths("python")
C = PartitionPaths("c", cpaths.C) if cpaths.C is not None else None


def chosen() -> PartitionPaths:
    """The paths of a stream handle attached now (``cpaths.set_enabled``)."""
    return C if cpaths.enabled() else PYTHON
