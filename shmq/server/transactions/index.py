"""``TxnIndex``: what the transaction coordinator knows of the transactions in each
partition: which offsets are a transactional producer's records and which are markers, the
transactions still open, and those that ended in an abort.

Strategy: a partition's records stay plain stream records; the coordinator keeps beside
them, per (stream, creation time, partition), the spans a transactional Produce appended
(``[first, end)``, producer id and epoch) and each marker's offset, as a Kafka broker's
batch headers and transaction index say. From that come the three facts a Fetch needs:
the last stable offset (the first offset of the oldest open transaction: a read_committed
consumer stops below it), the aborted transactions a fetched range overlaps (Kafka's list:
producer id and first offset, the client drops that producer's transactional records
from there to its ABORT marker), and, for records encoded anew, which batch each one was
in (``spans``). An open transaction's first offset is where the partition ended just
before its first records there were appended (the coordinator notes it first): at or below
its first record, never above, so the stable offset is never past a record of it, and a
transaction that took a partition in without writing there yet holds no reader back. What
retention dropped is forgotten (``trim``).
"""

import bisect

__all__ = ["PartitionTxns", "TxnIndex", "DATA", "ABORT_MARKER", "COMMIT_MARKER"]

DATA, ABORT_MARKER, COMMIT_MARKER = 0, 1, 2  # a span's kind


class PartitionTxns:
    """One partition's transactional spans, open transactions and aborted ones."""

    __slots__ = ("firsts", "spans", "open", "aborted")

    def __init__(self):
        self.firsts = []  # the spans' first offsets, ascending (for bisect)
        self.spans = []  # (first, end, producer id, epoch, kind), by first offset
        self.open = {}  # producer id -> the first offset of its open transaction here
        self.aborted = []  # (marker offset, first offset, producer id), by marker offset

    def __bool__(self):
        return bool(self.spans or self.open)

    def begin(self, pid: int, first: int) -> None:
        """Producer ``pid``'s transaction takes this partition in, at or below ``first``."""
        self.open.setdefault(pid, first)

    def appended(self, pid: int, epoch: int, first: int, count: int, kind: int = DATA) -> None:
        """``count`` records of ``pid`` (a transaction's, or its marker) are at ``first``."""
        i = bisect.bisect_right(self.firsts, first)
        self.firsts.insert(i, first)
        self.spans.insert(i, (first, first + count, pid, epoch, kind))

    def ended(self, pid: int, epoch: int, offset: int, commit: bool) -> None:
        """``pid``'s marker is at ``offset``: its transaction here is over."""
        self.appended(pid, epoch, offset, 1, COMMIT_MARKER if commit else ABORT_MARKER)
        first = self.open.pop(pid, offset)
        if not commit:
            self.aborted.append((offset, first, pid))

    def stable(self, end: int) -> int:
        """The last stable offset of a partition that ends at ``end``."""
        return min(min(self.open.values(), default=end), end)

    def aborted_between(self, lo: int, hi: int) -> list:
        """[(producer id, first offset)] of the aborted transactions with a record in
        ``[lo, hi)`` (their marker at or above ``lo``, their first offset below ``hi``)."""
        i = bisect.bisect_left(self.aborted, (lo,))
        return [(pid, first) for _m, first, pid in self.aborted[i:] if first < hi]

    def spans_in(self, lo: int, hi: int) -> list:
        """The spans that hold an offset of ``[lo, hi)``, in order."""
        i = max(bisect.bisect_right(self.firsts, lo) - 1, 0)
        out = []
        for span in self.spans[i:]:
            if span[0] >= hi:
                break
            if span[1] > lo:
                out.append(span)
        return out

    def trim(self, earliest: int) -> None:
        """Forget what lies wholly below ``earliest`` (retention dropped it)."""
        i = 0
        while i < len(self.spans) and self.spans[i][1] <= earliest:
            i += 1
        if i:
            del self.spans[:i], self.firsts[:i]
        j = bisect.bisect_left(self.aborted, (earliest,))
        if j:
            del self.aborted[:j]

    def export(self) -> dict:
        return {"spans": [list(s) for s in self.spans], "open": [[p, f] for p, f in self.open.items()],
                "aborted": [list(a) for a in self.aborted]}

    @classmethod
    def restore(cls, row: dict, end: int) -> "PartitionTxns":
        """``export``'s row, of a partition that now ends at ``end`` (what lies at or past it
        is not there any more: a stream rebuilt from an older snapshot)."""
        t = cls()
        for first, stop, pid, epoch, kind in row["spans"]:
            if first < end and all(type(x) is int for x in (first, stop, pid, epoch, kind)):
                t.firsts.append(first)
                t.spans.append((first, min(stop, end), pid, epoch, kind))
        t.open = {int(p): min(int(f), end) for p, f in row["open"]}
        t.aborted = sorted((int(m), int(f), int(p)) for m, f, p in row["aborted"] if m < end)
        return t


class TxnIndex:
    """Every partition's ``PartitionTxns``, by (stream name, creation time, partition)."""

    def __init__(self):
        self.parts: dict[tuple, PartitionTxns] = {}

    def get(self, s, p: int) -> PartitionTxns | None:
        t = self.parts.get((s.name, s.created_at, p))
        return t if t else None

    def of(self, key: tuple) -> PartitionTxns:
        t = self.parts.get(key)
        if t is None:
            t = self.parts[key] = PartitionTxns()
        return t

    def forget(self, name: str) -> None:
        """A stream was deleted: its partitions' facts go."""
        for key in [k for k in self.parts if k[0] == name]:
            del self.parts[key]
