"""One function per request type, in one table: ``HANDLERS[msg_type](conn, fields)``
returns the reply payload, raises, or (a CONSUME with nothing ready) returns a ``Wait``.

Strategy: a handler knows nothing of sockets, frames or msg ids. It gets the connection
it serves and the request's checked fields (``validate_request``), calls only the
engine's public API, and returns the payload; the connection turns the payload, an
exception (``status_of``) or a ``Wait`` into frames. Every engine call here is
non-blocking (``put_nowait``, ``get_many(timeout=0)``, settles), so it holds a queue's
lock for microseconds and the loop never waits. What a handler uses of ``conn``:

- ``conn.server``: ``broker``, ``queue(name)`` (a cached handle), ``forget(name)``,
  ``notify(name)``, ``on_create``, ``token``, ``max_frame_bytes``, ``stopping``;
- ``conn.leases``: the deliveries the connection holds (``leases.Leases``);
- ``conn.authenticated()``: after a HELLO with the right token.
"""

import hmac
from dataclasses import dataclass

from .. import __version__
from ..errors import QueueEmpty, Unauthorized
from ..protocol import MsgType
from ..protocol.forms import consume_args, create_args, stats_fields
from .waiters import NOTHING

__all__ = ["HANDLERS", "Wait", "RECORD_OVERHEAD"]

RECORD_OVERHEAD = 128  # bytes a message adds to a CONSUME reply besides body and headers


@dataclass(frozen=True, slots=True)
class Wait:
    """A CONSUME found nothing ready and may wait ``wait_ms``: the connection puts it in
    ``q``'s line (or refuses it past its limit) and answers it later."""

    q: object
    most: int
    vis: float | None
    max_bytes: int
    wait_ms: int


def hello(conn, f):
    server = conn.server
    if server.token is not None:
        if not hmac.compare_digest(str(f.get("token") or "").encode(), server.token.encode()):
            raise Unauthorized("wrong or missing token")
        conn.authenticated()
    return {"server": "shmq", "version": __version__, "max_frame_bytes": server.max_frame_bytes}


def ping(conn, f):
    return {}


def list_queues(conn, f):
    return {"queues": conn.server.broker.list_queues()}


def create(conn, f):
    server = conn.server
    q = server.broker.create_queue(f["queue"], **create_args(f))
    try:
        if server.on_create is not None:
            server.on_create(q)  # e.g. point a wal queue's log at the data dir
    finally:
        q.close()
    return {}


def delete(conn, f):
    conn.server.forget(f["queue"])
    conn.server.broker.delete_queue(f["queue"])
    return {}


def stats(conn, f):
    return stats_fields(conn.server.queue(f["queue"]).stats())


def purge(conn, f):
    return {"purged": conn.server.queue(f["queue"]).purge()}


def produce(conn, f):
    q = conn.server.queue(f["queue"])
    msg_id = q.put_nowait(f["body"], f.get("headers"))
    conn.server.notify(q.name)
    return {"id": msg_id}


def produce_batch(conn, f):
    q = conn.server.queue(f["queue"])
    ids = q.put_many([(m["body"], m.get("headers")) for m in f["messages"]], timeout=0)
    conn.server.notify(q.name)
    return {"ids": ids}


def consume(conn, f):
    """Lease what is ready now; else, with ``wait_ms``, a Wait (not while stopping)."""
    server = conn.server
    q = server.queue(f["queue"])
    most, vis = consume_args(f)
    # the reply must fit in a frame: bodies and headers, plus per-message framing
    max_bytes = max(server.max_frame_bytes - 1024 - most * RECORD_OVERHEAD, 0)
    try:
        ds = q.get_many(most, timeout=0, visibility_timeout=vis, max_bytes=max_bytes)
    except QueueEmpty:
        if f["wait_ms"] and not server.stopping:
            return Wait(q, most, vis, max_bytes, f["wait_ms"])
        ds = NOTHING
    return {"messages": conn.leases.lease(q, ds)}


def ack(conn, f):
    q = conn.server.queue(f["queue"])
    tags = f["deliveries"]
    return {"acked": conn.leases.settle(q, tags, q.ack_many) if tags else 0}


def nack(conn, f):
    q = conn.server.queue(f["queue"])
    if not f.get("requeue", True):
        conn.leases.settle(q, f["deliveries"], q.reject_many)
        return {}
    delay = f.get("delay_ms", 0) / 1000
    conn.leases.settle(q, f["deliveries"], lambda ds: q.nack_many(ds, delay))
    conn.server.notify(q.name)
    return {}


def reject(conn, f):
    q = conn.server.queue(f["queue"])
    conn.leases.settle(q, f["deliveries"], q.reject_many)
    return {}


def extend(conn, f):
    q = conn.server.queue(f["queue"])
    seconds = f["visibility_ms"] / 1000
    for d in conn.leases.take(q, f["deliveries"]):
        d.extend(seconds)
    return {}


# request type -> its handler: every type of protocol.requests.REQUEST_FIELDS
HANDLERS = {
    MsgType.HELLO: hello,
    MsgType.CREATE: create,
    MsgType.DELETE: delete,
    MsgType.LIST: list_queues,
    MsgType.STATS: stats,
    MsgType.PURGE: purge,
    MsgType.PING: ping,
    MsgType.PRODUCE: produce,
    MsgType.PRODUCE_BATCH: produce_batch,
    MsgType.CONSUME: consume,
    MsgType.ACK: ack,
    MsgType.NACK: nack,
    MsgType.EXTEND: extend,
    MsgType.REJECT: reject,
}
