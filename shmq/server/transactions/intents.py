"""``Intents``: the transactional appends the coordinator has begun and not yet noted: a
producer's batch of records, or a transaction's marker, each journaled before it is
appended and noted with its offset after (the index's span, ``index.py``).

Strategy: a server killed between an append and its note left records in the partition
that no span claims: a Fetch would send them as plain records (an aborted transaction's
results read as committed, a marker read as a record of six zero bytes). So each append is
journaled first as an intent: the producer, where the partition ended just before (the
records go at or past it), and what finds them again: a batch's count and the crc32 of its
values (``digest``), a marker's kind. A restart looks for every intent still pending in
what the partition holds from there (``locate``): the first run of records no span claims
that matches is the batch's (or the marker's) and is noted as it would have been; none
found, the append never happened. An append that fails is dropped from the pending ones
(nothing was appended: an append is all or nothing); one that the server never finishes
is found, or not, at the next start, so nothing here waits on a client.
"""

import logging
import zlib

from ...errors import ShmqError
from ...kafka.control import marker

__all__ = ["Intents", "digest"]

log = logging.getLogger("shmq.server")

READ_CHUNK = 4096  # records read at a time while an intent is looked for
DATA, MARK = "appending", "marking"  # the journal's events: ["appending", pid, epoch, name, created, p, after,
# count, crc]; ["marking", pid, epoch, name, created, p, after, commit]


def digest(values) -> int:
    """The crc32 of records' values in order, a null value adding nothing: what a batch
    is found again by."""
    return zlib.crc32(b"".join(v for v in values if v is not None))


class Intents:
    """The pending intents, by (stream, creation time, partition), as journal events."""

    def __init__(self):
        self.by_key: dict[tuple, list] = {}

    def __bool__(self):
        return bool(self.by_key)

    def add(self, event: list) -> list:
        """Hold ``event`` (``DATA`` or ``MARK``) until ``drop``; returns it."""
        self.by_key.setdefault(tuple(event[3:6]), []).append(event)
        return event

    def drop(self, event: list) -> None:
        key = tuple(event[3:6])
        held = self.by_key.get(key, [])
        if event in held:
            held.remove(event)
        if not held:
            self.by_key.pop(key, None)

    def done(self, kind: str, pid: int, key: tuple, what) -> None:
        """A journal's "batch" (``what``: its count) or "marker" (its commit) event: the
        oldest intent of that producer it finishes is no longer pending."""
        for e in self.by_key.get(key, []):
            if e[0] == kind and e[1] == pid and e[7] == what:
                self.drop(e)
                return

    def rows(self) -> list:
        return [e for held in self.by_key.values() for e in held]


def locate(s, p: int, spans: list, event: list) -> int | None:
    """Where intent ``event``'s records are in partition ``p`` of ``s``: the first offset,
    at or past its ``after``, of a run of records no ``spans`` claim that is its batch (the
    count and digest) or its marker (the key and value); None if there is none (the
    append never happened)."""
    kind, after = event[0], event[6]
    claimed = [(f, e) for f, e, *_rest in spans if e > after]
    count, crc = (event[7], event[8]) if kind == DATA else (1, None)
    mk, mv = (None, None) if kind == DATA else marker(event[7])
    run = []  # the unclaimed records just read, in order: (offset, key, value)
    offset = after
    try:
        earliest, end = s.offsets(p)
        offset = max(offset, earliest)
        while offset < end:
            rows = s.read_raw(p, offset, READ_CHUNK)
            if not rows:
                return None
            for off, _ts, key, _h, value in rows:
                if any(f <= off < e for f, e in claimed):  # another's records
                    run = []
                    continue
                if run and off != run[-1][0] + 1:  # a gap
                    run = []
                run.append((off, key, value))
                if len(run) > count:
                    del run[0]
                if len(run) == count and (digest([v for _o, _k, v in run]) == crc if kind == DATA else
                                          bytes(run[0][1] or b"") == mk and bytes(run[0][2] or b"") == mv):
                    return run[0][0]
            offset = rows[-1][0] + 1
    except (ShmqError, ValueError) as e:
        log.warning("%s partition %d: where producer %d's %s went cannot be read: %s", s.name, p, event[1],
                    "batch" if kind == DATA else "marker", e)
    return None
