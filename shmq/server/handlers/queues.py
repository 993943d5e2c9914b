"""The queues' requests: CREATE, DELETE, LIST, STATS, PURGE, the consumers' counts, the
puts and gets (and their plain shapes, answered as frames), the settles, PEEK, REDRIVE and
the subscriptions."""

import functools
import logging

import msgpack

from ...engine import maintenance
from ...engine.shm.waits import serving
from ...errors import MessageTooLarge, QueueEmpty, QueueExists, QueueFull, QueueNotFound, SettingsMismatch, ShmqError
from ...model.settings import QUEUE_TABLE
from ...protocol import REPLY_BIT, MsgType
from ...protocol.shapes import Shape
from ...protocol.status import reason_of, status_of
from ...protocol.payloads import (
    consume_args,
    delivery_fields,
    delivery_row,
    create_args,
    messages_args,
    peeked_fields,
    put_args,
    stats_fields,
)
from .answers import RECORD_OVERHEAD, Wait, reply_budget, wait_or_answer


def list_queues(conn, f):
    return {"queues": conn.server.broker.list_queues()}


def create(conn, f):
    """CREATE: a queue made; with ``update``, an existing one's settings changed; with
    ``declare``, either (``Broker.declare_queue``). Those two answer the settings."""
    server = conn.server
    if f.get("update"):
        return {"settings": server.broker.update_queue(f["queue"], **_given_settings(f))}
    if f.get("declare"):
        given = _given_settings(f)
        try:
            q = server.broker.create_queue(f["queue"], **given)
        except SettingsMismatch:
            raise
        except QueueExists:
            return {"settings": server.broker.update_queue(f["queue"], **given)}
    else:
        q = server.broker.create_queue(f["queue"], **create_args(f))
    try:
        if server.on_create is not None:
            server.on_create(q)  # e.g. point a wal queue's log at the data dir
        return {"settings": q.settings()} if f.get("declare") else {}
    finally:
        q.close()

# a live queue's settings as CREATE's fields carry them (``declare``, ``update``); ``clear``: set to none
_SETTINGS = tuple(s.name for s in QUEUE_TABLE if s.wire_field == s.name)  # (visibility_timeout: in ms)
_CLEARABLE = tuple(s.name for s in QUEUE_TABLE if s.clearable)


def _given_settings(f) -> dict:
    """``update_queue``'s keyword arguments: the settings CREATE gives, and none else."""
    args = {k: f[k] for k in _SETTINGS if k in f}
    if "visibility_timeout_ms" in f:
        args["visibility_timeout"] = f["visibility_timeout_ms"] / 1000
    for k in f.get("clear") or ():
        if k not in _CLEARABLE:
            raise ValueError(f"clear: {k!r} is not a setting that can be none ({', '.join(_CLEARABLE)})")
        args[k] = None
    return args


def delete(conn, f):
    conn.server.forget(f["queue"])
    conn.server.broker.delete_queue(f["queue"])
    return {}


def consumer_add(conn, f):
    """CONSUMER_ADD: one more consumer of the queue, this connection's (``Queue.add_consumer``
    by the server's process, counted per connection and given back when it closes)."""
    q = conn.server.queue(f["queue"])
    n = q.add_consumer()
    made, held = conn.consumers.get(q.name, (q.created_at, 0))
    conn.consumers[q.name] = (q.created_at, (held if made == q.created_at else 0) + 1)  # (a queue made again: anew)
    return {"consumers": n}


def consumer_remove(conn, f):
    """CONSUMER_REMOVE: one of this connection's consumers of the queue fewer; an auto-delete
    queue left with none is deleted."""
    q = conn.server.queue(f["queue"])
    made, held = conn.consumers.get(q.name, (None, 0))
    if not held or made != q.created_at:
        raise ValueError(f"queue {q.name!r}: this connection has no consumer of it registered (CONSUMER_ADD)")
    if held > 1:
        conn.consumers[q.name] = (made, held - 1)
    else:
        del conn.consumers[q.name]
    n = q.remove_consumer()
    if q.deleted:
        conn.server.forget(q.name)
    return {"consumers": n}


def give_back_consumers(conn):
    """The connection closed (or was killed): its consumers go, and an auto-delete queue
    that this leaves with none is deleted."""
    for name, (made, held) in conn.consumers.items():
        try:
            q = conn.server.queue(name)
            if q.created_at != made:
                continue  # that queue was deleted, and its counts with it
            for _ in range(held):
                q.remove_consumer()
            if q.deleted:
                conn.server.forget(name)
        except QueueNotFound:
            continue
        except (ShmqError, ValueError) as e:
            logging.getLogger("shmq.server").warning("%s: consumers of queue %s not given back: %s",
                                                     getattr(conn, "peer", None), name, e)
    conn.consumers.clear()


def stats(conn, f):
    q = conn.server.queue(f["queue"])
    return {**stats_fields(q.stats()), "settings": q.settings()}


def purge(conn, f):
    return {"purged": conn.server.queue(f["queue"]).purge(delayed=f.get("delayed", False))}


def produce(conn, f):
    server = conn.server
    q = server.queue(f["queue"])
    options = put_args(f)  # put_nowait (timeout 0), with the options; a plain put with no keywords to build
    with serving():  # (this loop serves the waiters: ``notify``, no post to its doorbell)
        msg_id = q.put(f["body"], f.get("headers"), 0, **options) if options else q.put(f["body"], f.get("headers"), 0)
    server.notify(q.name)
    return {"id": msg_id}


def plain_produce(conn, msg_id, f):
    """``produce`` of a plain PRODUCE (``requests.check_plain_produce``): its reply frame."""
    queues = conn.server.queues  # (``server.queue`` and ``server.notify``, a call less each)
    q = queues.get(f["queue"])
    with serving():
        put_id = q.put(f["body"], None, 0)
    queues.notify(q.name)
    return _PRODUCED.frame(msg_id, put_id)


def produce_batch(conn, f):
    q = conn.server.queue(f["queue"])
    bodies, headers = messages_args(f["messages"])
    options = put_args(f)
    try:
        with serving():
            ids = q.put_many(bodies, timeout=0, headers=headers, **options)
    except (QueueFull, MessageTooLarge):
        if not f.get("each"):
            raise
        return _put_each(conn, q, bodies, headers, options)  # as that many PRODUCEs
    conn.server.notify(q.name)
    return {"ids": ids}


def _put_each(conn, q, bodies, headers, options):
    """PRODUCE_BATCH with ``each``, which ``put_many`` refused whole: each message put or
    refused on its own (a full queue, a body too large), in order."""
    ids, refused = [], []
    for i, body in enumerate(bodies):
        try:
            with serving():
                ids.append(q.put(body, None if headers is None else headers[i], timeout=0, **options))
        except (QueueFull, MessageTooLarge) as e:
            ids.append(None)
            refused.append([i, status_of(e), reason_of(e)])
    conn.server.notify(q.name)
    return {"ids": ids, "refused": refused}


def consume(conn, f):
    """Lease what is ready now; else, with ``wait_ms``, a Wait (not while stopping)."""
    server = conn.server
    q = server.queue(f["queue"])
    most, vis, max_bytes = consume_args(f)
    budget = reply_budget(server, most)  # the reply must fit in a frame
    args = (q, most, vis, budget if max_bytes is None else min(budget, max_bytes), not f.get("auto_ack"),
            f.get("rows", False))
    in_c = server.plain is not None and vis is None and max_bytes is None and args[4]  # as the C path's CONSUME
    return wait_or_answer(conn, f, server.waiters_of, q, _get, _leased, args, plain_take if in_c else None)


def plain_consume(conn, msg_id, f):
    """``consume`` of a plain CONSUME (``requests.check_plain_consume``: one message, a
    lease, maps): its reply frame, or a Wait as ``consume`` makes it."""
    server = conn.server
    q = server.queues.get(f["queue"])
    args = (q, 1, None, reply_budget(server, 1), True, False)
    got = _get(args)
    if got is None:
        if f["wait_ms"] and not server.stopping:
            take = _get if server.plain is None else plain_take
            return Wait(server.waiters_of(q), take, _leased, args, f["wait_ms"])
        return _CONSUMED.frame(msg_id, [])
    return _CONSUMED.frame(msg_id, conn.leases.lease(q, got))


def consumed_frame(leases, msg_id, q, ds, rows) -> bytes:
    """The reply frame of a CONSUME (``rows``: as rows) that leased ``ds`` of ``q`` to the
    connection of ``leases``: what the C plain path hands back for messages with headers."""
    return _CONSUMED.frame(msg_id, leases.lease(q, ds, None, rows))


def _get(args):
    try:  # (args[5], rows, is the reply's; a waiting CONSUME's own go on: plain_take)
        return args[0].get_many(args[1], timeout=0, visibility_timeout=args[2], max_bytes=args[3], ack=args[4])
    except QueueEmpty:
        return None


def waiting_consume(conn, msg_id, q, most, rows) -> tuple:
    """(take, reply, args) of a CONSUME (a lease, no ``visibility_ms`` nor ``max_bytes``) that
    the plain path in C found nothing for, as ``consume`` has it wait (``Connection.wait_plain``)."""
    return plain_take, _leased, plain_args(conn, (q, most, None, reply_budget(conn.server, most), True, rows), msg_id)


def plain_args(conn, args, msg_id) -> tuple:
    """The ``args`` a waiting CONSUME that the C path may answer (``plain_take``) is tried
    with in its line: ``_get``'s, then what C needs for its reply frame (the C path, the
    connection's leases, the request's id)."""
    return (*args, conn.server.plain, conn.leases, msg_id)


def plain_take(args):
    """A waiting CONSUME tried again in C (``Plain.deliver``): its reply frame made there,
    or None; where C leaves it, ``_get``'s try. ``args``: ``_get``'s, then the C path, the
    connection's leases and the request's id (``plain_args``)."""
    q = args[0]
    got = args[6].deliver(args[7], q.name, q, args[8], args[1], args[5])
    return _get(args) if got is False else got


def _leased(conn, args, ds):
    if not args[4]:  # auto-ack: settled as taken, nothing leased to the connection (tag 0)
        return {"messages": [(delivery_row if args[5] else delivery_fields)(d, 0) for d in ds]}
    return {"messages": conn.leases.lease(args[0], ds, None, args[5])}


def ack(conn, f):
    return {"acked": _acked(conn, f)}


def plain_ack(conn, msg_id, f):
    """``ack`` of a plain ACK (``requests.check_plain_ack``): its reply frame."""
    return _ACKED.frame(msg_id, _acked(conn, f))


def _acked(conn, f) -> int:
    q = conn.server.queues.get(f["queue"])
    tags = f["deliveries"]
    return conn.leases.settle(q, tags, q.ack_many) if tags else 0


def nack(conn, f):
    q = conn.server.queue(f["queue"])
    if not f.get("requeue", True):
        conn.leases.settle(q, f["deliveries"], q.reject_many)
        return {}
    if f.get("unseen"):  # never handed to the application: ready again, no attempt counted
        with serving():
            conn.leases.settle(q, f["deliveries"], functools.partial(maintenance.release_many, q))
        conn.server.notify(q.name)
        return {}
    delay = (f["delay_ms"] / 1000,) if "delay_ms" in f else ()  # none: the queue's retry policy
    with serving():
        conn.leases.settle(q, f["deliveries"], lambda ds: q.nack_many(ds, *delay))
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


def peek(conn, f):
    """Up to ``max`` ready messages, leased to nobody; as many as fit in a frame (the first always)."""
    budget = reply_budget(conn.server, 0)
    out = []
    for m in conn.server.queue(f["queue"]).peek(f["max"]):
        budget -= len(m.body) + RECORD_OVERHEAD + (len(msgpack.packb(m.headers, use_bin_type=True)) if m.headers else 0)
        if out and budget < 0:
            break
        out.append(peeked_fields(m))
    return {"messages": out}


def redrive(conn, f):
    n = conn.server.broker.redrive(f["queue"], to=f.get("to"), max_messages=f.get("max"))
    if "to" in f:
        conn.server.notify(f["to"])  # back to their own queues: the waiters' poller sees them
    return {"redriven": n}


def subscribe(conn, f):
    """A subscription: deliveries pushed while fewer than ``prefetch`` are un-acked
    (``subscriptions``); the pushes start after this reply."""
    q = conn.server.queue(f["queue"])
    vis = f.get("visibility_ms")
    return {"subscription": conn.subs.subscribe(q, f["prefetch"], None if vis is None else vis / 1000,
                                                f.get("rows", False))}


def cancel(conn, f):
    """No more pushes; what was pushed after the first ``delivered`` is ready again."""
    return {"released": conn.subs.cancel(f["subscription"], f["delivered"])}

# The replies of the plain requests, each packed once but for its one value (``shapes.Shape``:
# a reply's status is 0, as a request's; the bytes are ``encode_reply``'s, a test holds them equal).
_PRODUCED = Shape(MsgType.PRODUCE | REPLY_BIT, {}, "id")
_CONSUMED = Shape(MsgType.CONSUME | REPLY_BIT, {}, "messages")
_ACKED = Shape(MsgType.ACK | REPLY_BIT, {}, "acked")
