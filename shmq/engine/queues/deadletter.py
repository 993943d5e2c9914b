"""Dead letters: a message that was rejected or delivered ``max_deliveries`` times moves
to the queue's dead-letter queue (or is dropped when it has none), as soon as whatever
ends its last delivery happens: its nack (``settle``), its lease lapsing or its holder
dying (``housekeeping``), never left ready for the next take.

Strategy: the copy goes first, then the original is settled as dead-lettered: a crash in
between duplicates the message, never loses it. A full dead-letter queue leaves the
message where it was, delayed by ``DLQ_RETRY_DELAY_S``, to try again. ``redrive`` moves
them back the same way round (put, then ack).
"""

from ...errors import DeliveryExpired, QueueEmpty, QueueFull, QueueNotFound
from ...model.headers import encode_headers
from ...model.messages import raw_body
from ..shm import layout as L
from . import extension
from ..shm.mutex import unlock as _unlock

__all__ = ["DLQ_RETRY_DELAY_S", "dead_letter", "redrive"]

DLQ_RETRY_DELAY_S = 1.0  # when the dead-letter queue is full, retry after this


def dead_letter(q, deliveries, reason: str) -> list:
    """Move leased deliveries of ``q`` to its dead-letter queue, then settle them; returns
    those no longer leased, left alone. With ``reason == "rejected"`` one no longer leased
    raises DeliveryExpired instead, and none is touched. ``x-death-attempts`` is each
    one's ``attempt``: how many times it was delivered."""
    keep, stale = [], []
    q._acquire()
    try:
        for d in deliveries:
            if q._leased_word(d) < 0:
                if reason == "rejected":
                    raise DeliveryExpired(f"delivery {q.name}#{d.id} attempt {d.attempt} is no longer leased")
                stale.append(d)
                continue
            keep.append(d)
    finally:
        _unlock(q._lockp)
    if q.dead_letter_queue:
        full = []
        for d in keep:
            headers = dict(d.headers)
            headers.update({
                "x-death-reason": reason,
                "x-death-queue": q.name,
                "x-death-id": d.id,
                "x-death-attempts": d.attempt,
            })
            if d.priority:
                headers["x-death-priority"] = d.priority
            if d.group is not None:
                headers["x-death-group"] = d.group
            try:
                q._dead_letter_target().put_nowait(raw_body(d), headers)
            except QueueFull:
                full.append(d)
            except QueueNotFound:
                q._dlq = None  # deleted: the message is dropped, as with no DLQ
        if full:  # delayed where it is (not nacked: a last delivery would come straight back here)
            q._requeue(full, DLQ_RETRY_DELAY_S)
            keep = [d for d in keep if d not in full]
    if keep:
        try:  # expired and dropped: counted in expired_total already, not as dead-lettered
            q._settle_acks(keep, dead_lettered=True, counted=bool(q.dead_letter_queue) or reason != "expired")
        except DeliveryExpired:
            pass  # expired meanwhile: it is redelivered (and was copied): at least once
    return stale


_DEATH_HEADERS = ("x-death-reason", "x-death-queue", "x-death-id", "x-death-attempts", "x-death-priority",
                  "x-death-group")
REDRIVE_BATCH = 64


def redrive(dlq, target, to=None, max_messages=None) -> int:
    """Move dead letters of ``dlq`` back to the queue each came from (``x-death-queue``),
    or to ``to``, keeping their ids (``x-death-id``), headers, priority and group, with
    the attempt count reset. ``target(name)`` attaches a queue. Each message is put
    first, then acked from the dead-letter queue: a crash in between leaves it in both
    places for an instant, never in neither. Messages that arrive while it runs stay.
    Returns how many moved. Moving back to the origin is done once per dead letter (a
    dedup id in the target): a redrive killed between the two and run again within the
    target's ``dedup_window`` adds no second copy."""
    # later arrivals are not this redrive's: each lane's next id now (ids are per lane)
    stop_at = {q: q._mq[L.I_NEXT_ID] for q in getattr(dlq, "_lanes", (dlq,))}
    moved = 0
    skipped = []
    try:
        while max_messages is None or moved < max_messages:
            n = REDRIVE_BATCH if max_messages is None else min(REDRIVE_BATCH, max_messages - moved)
            try:
                batch = dlq.get_many(n, timeout=0)
            except QueueEmpty:
                break
            for i, d in enumerate(batch):
                headers = dict(d.headers)
                dest = to or headers.get("x-death-queue")
                if d.id >= stop_at[d._q] or not dest or (max_messages is not None and moved >= max_messages):
                    skipped.append(d)
                    continue
                msg_id = headers.get("x-death-id")
                priority = headers.get("x-death-priority", 0)
                group = headers.get("x-death-group")
                for k in _DEATH_HEADERS:
                    headers.pop(k, None)
                if to is not None or not isinstance(msg_id, int) or msg_id < 1:
                    msg_id = d.id if to is None else None
                q = target(dest)
                if priority >= q._levels:
                    priority = q._levels - 1
                hraw = extension.encode(priority, 0, 0, 0, group) + (encode_headers(headers) if headers else b"")
                try:
                    if msg_id is None:
                        q._append(((d.body, hraw, L.record_size(len(hraw), len(d.body))),), 0,
                                  (extension.flags_of(hraw), 0, 0))
                    else:  # once per dead letter: a redrive killed before its ack and run again adds none
                        q._import_messages([(msg_id, 0, d._enq, hraw, d.body)],
                                          once=extension.dedup_hash(f"redrive:{dlq.name}:{d.id}"))
                except QueueFull:
                    skipped.extend(batch[i:])
                    raise QueueFull(f"queue {dest!r} is full: {moved} dead letters of {dlq.name!r} were moved, "
                                    "the rest stay") from None
                d.ack()
                moved += 1
    finally:
        if skipped:
            dlq.nack_many(skipped, 0.0)
    return moved
