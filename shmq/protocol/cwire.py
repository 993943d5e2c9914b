"""The seam for the codec's C half (``_wire.c``, optional; ``SHMQ_PURE_PYTHON=1`` leaves it out):
its calls, or None each where it is not built, whose callers then take the Python codec's way.

- ``frame(prefix, msg_type, msg_id, value)``: a shape's frame (``shapes.Shape.frame``), or None;
- ``Leased``: the base class whose fields a client's delivery keeps, and ``leased(payload, cls, q,
  conn)``: a CONSUME reply's bytes read straight into such deliveries, or None;
- ``replies(...)``: the reply frames at the start of a client's read taken in
  (``ClientCore.receive_data``), as far as it is sure of them;
- ``tags(deliveries, cls, q, conn)``: a plain ack_many's tags (``PlainQueueCalls._plain_tags``), or None.
"""

import os

try:
    if os.environ.get("SHMQ_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("SHMQ_PURE_PYTHON")
    from . import _wire
except ImportError:  # pragma: no cover - depends on the build
    _wire = None

__all__ = ["BUILT", "frame", "Leased", "leased", "replies", "tags"]

BUILT = _wire is not None
frame = _wire.frame if BUILT else None
Leased = _wire.Leased if BUILT else None
leased = _wire.leased if BUILT else None
replies = _wire.replies if BUILT else None
tags = _wire.tags if BUILT else None
