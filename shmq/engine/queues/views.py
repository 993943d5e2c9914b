"""Arrays that view a delivery's body where it lies in the ring (``Delivery.array``), and the rule
that keeps their memory theirs: a delivery is not settled while such an array is alive.

Strategy: the array is made on an object of its own that lends the body's bytes
(``Consuming._loan_of``: a read-only ``Loan``, or a ctypes array on the Python paths), which
numpy keeps as the base of the array and of everything made from it (numpy lets go of the
buffer export itself at once, so the object's references are what say an array is alive).
A settle of the delivery (ack, nack, reject, alone or in a batch, or the consume loop's ack of
the one before) first looks at those views: one still referred to makes the settle raise
BufferError and change nothing, so the message stays leased to its holder and no other
message is written where the array reads; else they are released. Free while no array view
lives in the process (one dict's truthiness per settle).
"""

import sys

from ...model import arrays

_getrefcount = sys.getrefcount

__all__ = ["array_of", "release"]

# id(delivery) -> (the delivery, [the views its arrays were made on]) (the delivery is held: the id stays its own)
_viewed = {}


def array_of(d, headers, copy: bool):
    """``d``'s body as the ndarray ``put_array`` sent: a read-only view of the ring, valid until
    ``d`` is settled (which it then guards), or with ``copy`` an array of its own."""
    meta = arrays.meta_of(headers)
    if copy:
        return arrays.from_body(meta, d.view, copy=True)  # (DeliveryExpired when it is no longer leased)
    view = d._q._loan_of(d)
    a = arrays.from_body(meta, view)
    a.flags.writeable = False  # (a ctypes array lends writable bytes: read-only, as the Loan's)
    entry = _viewed.get(id(d))
    if entry is None or entry[0] is not d:
        _viewed[id(d)] = entry = (d, [])
    entry[1].append(view)
    return a


def release(deliveries) -> None:
    """Before settling ``deliveries``: let go of their arrays' views; BufferError (nothing
    settled) when an array made on one is still alive."""
    for d in deliveries:
        entry = _viewed.get(id(d))
        if entry is None or entry[0] is not d:
            continue
        views = entry[1]
        while views:
            view = views[-1]
            if _getrefcount(view) > 3:  # (the list's, ours, getrefcount's): an array's base besides
                raise BufferError(
                    f"an array made by {d!r}.array() is still alive: its memory is the queue's until the "
                    "delivery is settled, and then other messages' -- let it go first (del it, and anything made "
                    "from it), or take a copy: d.array(copy=True)")
            views.pop()
        del _viewed[id(d)]


def viewing() -> bool:
    """Whether any array view lives in this process (a settle then asks ``release``)."""
    return bool(_viewed)
