"""Which layout version made a namespace's queues and streams: the error an attach raises
for another version's, and the list of them a newer broker looks for at start
(``persistence.upgrade`` rebuilds an older one's from its files).

Strategy: the magic and the version word that follows it open every queue and stream
segment of every release (``layout.STATIC``, ``STREAM_STATIC``), so they are read here
with nothing else of the layout assumed: the rest of another version's segment is
never read.
"""

import struct
from typing import NamedTuple

from ...errors import LayoutMismatch, StreamLayoutMismatch
from . import layout as L
from .names import queue_segment, stream_base
from .segment import open_segment

__all__ = ["Outdated", "KINDS", "mismatch", "version_of", "outdated"]

_PREFIX = struct.Struct("<4sH")  # magic, version: the same in every release
# kind -> (its segment's name part, magic, this shmq's layout version)
KINDS = {"queue": ("q", L.MAGIC, L.LAYOUT_VERSION), "stream": ("s", L.STREAM_MAGIC, L.STREAM_VERSION)}


class Outdated(NamedTuple):
    """A queue or stream whose segment has another layout version than this shmq's."""

    kind: str  # "queue" or "stream"
    name: str
    found: int
    expected: int

    @property
    def older(self) -> bool:
        return self.found < self.expected


def mismatch(kind: str, name: str, namespace: str, found: int) -> LayoutMismatch:
    """The error for ``kind`` ``name`` found with layout version ``found``: it names both
    versions and what to do."""
    expected = KINDS[kind][2]
    if found < expected:
        who = "an older shmq"
        fix = (f"stop every process using namespace {namespace!r}, then start this shmq's `shmq server "
               f"--namespace {namespace} --data-dir DIR` on the data dir the older broker wrote: it rebuilds them "
               "from the files (docs/OPERATIONS.md, Upgrading)")
    else:
        who = "a newer shmq"
        fix = "use that newer shmq with it"
    cls = LayoutMismatch if kind == "queue" else StreamLayoutMismatch
    return cls(f"{kind} {name!r} in namespace {namespace!r} has layout version {found}, made by {who} "
                          f"(this one reads {kind} layout version {expected}): {fix}", kind, name, found, expected)


def version_of(namespace: str, kind: str, name: str) -> int | None:
    """The layout version of ``kind`` ``name``'s segment (a laned queue's first lane's);
    None while it is being created (no magic yet). FileNotFoundError if it has none."""
    part, magic, _expected = KINDS[kind]
    seg = open_segment((queue_segment if kind == "queue" else stream_base)(namespace, name))
    try:
        if seg.size < _PREFIX.size:
            return None
        found_magic, version = _PREFIX.unpack_from(seg._mmap, 0)
    finally:
        seg.close()
    return version if found_magic == magic else None


def outdated(broker) -> list[Outdated]:
    """The queues and streams of ``broker``'s namespace whose layout version is not this
    shmq's, queues first, by name."""
    found = []
    for kind, names in (("queue", broker.list_queues()), ("stream", broker.list_streams())):
        expected = KINDS[kind][2]
        for name in names:
            try:
                version = version_of(broker.namespace, kind, name)
            except (FileNotFoundError, ValueError):
                continue  # deleted meanwhile
            if version is not None and version != expected:
                found.append(Outdated(kind, name, version, expected))
    return found
