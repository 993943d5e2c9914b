"""A work queue as a Spark source: its messages moved into a stream the query reads.

Strategy: a queue forgets what it delivered, and a micro-batch must be readable again
after a crash, so the source reads a stream that stages the queue (``NAME:stage``, one
partition, as durable as the queue). The stager, run by the source before it plans a
batch, gets messages, appends them (each with its queue id in the header
``shmq.queue.id``), and acks them only once the append is in. A stager killed between
the append and the ack leaves them leased by a dead process: the queue delivers them
again (attempt > 1), and the next stager looks for their ids among the stage's newest
records (``DEDUP_WINDOW``) before it appends: each message lands in the stage once.
"""

from ..errors import OffsetOutOfRange, QueueEmpty, StreamNotFound

__all__ = ["Stager", "stage_name", "ID_HEADER"]

ID_HEADER = "shmq.queue.id"
DEDUP_WINDOW = 200_000  # newest stage records searched for a redelivered message's id
MOVE_MAX = 10_000  # messages one move takes at most


def stage_name(queue: str) -> str:
    return f"{queue}:stage"


class Stager:
    """Moves messages of ``queue`` into its stage stream, each once (``move``)."""

    def __init__(self, broker, queue: str, max_bytes: int | None = None, durability: str | None = None):
        self.broker = broker
        self.queue = broker.queue(queue)
        try:
            self.stage = broker.stream(stage_name(queue))
        except StreamNotFound:
            self.stage = broker.create_stream(
                stage_name(queue), partitions=1, max_bytes=max_bytes or 256 * 2**20,
                durability=durability or getattr(self.queue, "durability", "wal"), exist_ok=True)

    def move(self, max_messages: int = MOVE_MAX) -> int:
        """Move what the queue has ready now, up to ``max_messages``; returns how many
        messages were taken (appended, or found staged already, and acked)."""
        try:
            ds = self.queue.get_many(max_messages, timeout=0)
        except QueueEmpty:
            return 0
        again = {d.id for d in ds if d.attempt > 1}
        staged = self._staged(again) if again else set()
        fresh = [d for d in ds if d.id not in staged]
        if fresh:
            self.stage.append_many([d.body for d in fresh],
                                   headers=[{**d.headers, ID_HEADER: str(d.id)} for d in fresh], partition=0)
        self._settle(ds)
        return len(ds)

    def _settle(self, ds) -> None:
        self.queue.ack_many(ds)

    def _staged(self, ids: set) -> set:
        """Those of ``ids`` found among the stage's newest DEDUP_WINDOW records."""
        earliest, end = self.stage.offsets(0)
        start = max(earliest, end - DEDUP_WINDOW)
        want, found = {str(i): i for i in ids}, set()
        offset = start
        while offset < end and len(found) < len(want):
            try:
                rs = self.stage.read(0, offset, max_records=min(10_000, end - offset))
            except OffsetOutOfRange as e:  # dropped meanwhile, or a gap: read on where records are
                if e.earliest <= offset:
                    break
                offset = e.earliest
                continue
            if not rs:
                break
            found.update(want[h] for r in rs if (h := r.headers.get(ID_HEADER)) in want)
            offset = rs[-1].offset + 1
        return found
