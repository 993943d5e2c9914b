"""Dead letters: a message that was rejected or delivered ``max_deliveries`` times moves
to the queue's dead-letter queue (or is dropped when it has none).

Strategy: the copy goes first, then the original is settled as dead-lettered: a crash in
between duplicates the message, never loses it. A full dead-letter queue leaves the
message where it was, delayed by ``DLQ_RETRY_DELAY_S``, to try again.
"""

from ..errors import DeliveryExpired, QueueFull, QueueNotFound

__all__ = ["DLQ_RETRY_DELAY_S", "dead_letter"]

DLQ_RETRY_DELAY_S = 1.0  # when the dead-letter queue is full, retry after this


def dead_letter(q, deliveries, reason: str) -> None:
    """Move leased deliveries of ``q`` to its dead-letter queue, then settle them. With
    ``reason == "rejected"`` a delivery no longer leased raises DeliveryExpired."""
    keep = []
    q._acquire()
    try:
        for d in deliveries:
            if q._leased_word(d) < 0:
                if reason == "rejected":
                    raise DeliveryExpired(f"delivery {q.name}#{d.id} attempt {d.attempt} is no longer leased")
                continue
            keep.append(d)
    finally:
        q._release()
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
            try:
                q._dead_letter_target().put_nowait(d.body, headers)
            except QueueFull:
                full.append(d)
            except QueueNotFound:
                q._dlq = None  # deleted: the message is dropped, as with no DLQ
        if full:
            q.nack_many(full, DLQ_RETRY_DELAY_S)
            keep = [d for d in keep if d not in full]
    if keep:
        try:
            q._settle_acks(keep, dead_lettered=True)
        except DeliveryExpired:
            pass  # expired meanwhile: it is redelivered (and was copied): at least once
