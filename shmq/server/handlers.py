"""One function per request type, in one table: ``HANDLERS[msg_type](conn, fields)``
returns the reply payload, raises, or (a CONSUME, READ or POLL with nothing there yet)
returns a ``Wait`` (an append that may wait for room: a ``BlockingAppend``).

Strategy: a handler knows nothing of sockets, frames or msg ids. It gets the connection
it serves and the request's checked fields (``validate_request``), calls only the
engine's public API, and returns the payload; the connection turns the payload, an
exception (``status_of``) or a ``Wait`` into frames. Every engine call here is
non-blocking (``put_nowait``, ``get_many(timeout=0)``, settles, ``read(timeout=0)``,
``poll(timeout=0)``), so it holds a lock for microseconds and the loop never waits.
What a handler uses of ``conn``:

- ``conn.server``: ``broker``, ``queue(name)`` / ``stream(name)`` (cached handles;
  ``queues``: the queues' ``AttachedHandles``, read by the plain requests' handlers),
  ``forget(name)``, ``notify(name)``, ``waiters_of(q)``, ``streams`` (``forget``,
  ``notify``, ``line_of``), ``stores`` (``get``, ``line_of``, ``wrote``: server/stores.py),
  ``on_create``, ``token``, ``max_frame_bytes``, ``stopping``;
- ``conn.leases``: the deliveries the connection holds (``leases.Leases``);
- ``conn.members``: the group members it holds (``members.Members``);
- ``conn.authenticated()``: after a HELLO with the right token.
"""

import functools
import hmac
import logging
from dataclasses import dataclass
from typing import Callable

import msgpack

from .. import __version__
from ..engine import maintenance
from ..engine.shm.waits import serving
from ..engine.queues.rpc import Call
from ..errors import (
    MessageTooLarge, QueueEmpty, QueueExists, QueueFull, QueueNotFound, RequestTimeout, SettingsMismatch, ShmqError,
    StreamNotFound, Unauthorized,
)
from ..protocol import REPLY_BIT, MsgType
from ..protocol.compression import CODECS
from ..protocol.requests import PLAIN_CHECKS
from ..protocol.shapes import Shape
from ..protocol.status import reason_of, status_of
from ..protocol.payloads import (
    QUEUE_OPTIONS,
    batch_args,
    consume_args,
    delivery_fields,
    delivery_row,
    create_args,
    from_pairs,
    messages_args,
    metadata_fields,
    pairs,
    peeked_fields,
    put_args,
    record_reply,
    stats_fields,
    stream_create_args,
    stream_info_fields,
    stream_stats_fields,
)
from . import txns
from .anyline import AnyLine
from .waiters import NOTHING

__all__ = ["HANDLERS", "PLAIN", "Wait", "waiting_consume", "plain_take", "BlockingAppend", "OffLoop", "OnLoop",
           "RECORD_OVERHEAD", "fill", "give_back_consumers"]

RECORD_OVERHEAD = 128  # bytes a message or record adds to a reply besides its bytes and headers


@dataclass(frozen=True, slots=True)
class Wait:
    """A request found nothing there yet and may wait ``wait_ms``: the connection puts it
    in ``line`` (or refuses it past its limit), where ``take(args)`` is tried again (None:
    nothing yet), and answers it later with ``reply(conn, args, what it got)``. ``take``
    and ``reply`` are functions of this module, the same for every request of a type,
    so a waiting request costs its ``args`` tuple, not closures of its own."""

    line: object
    take: Callable
    reply: Callable
    args: tuple
    wait_ms: int

    def args_for(self, conn, msg_id) -> tuple:
        """The ``args`` its ``take`` is tried with in the line: a CONSUME the C path may
        answer (``plain_take``) adds what C needs for its reply frame."""
        if self.take is plain_take:
            return (*self.args, conn.server.plain, conn.leases, msg_id)
        return self.args


@dataclass(frozen=True, slots=True)
class OffLoop:
    """A request that takes long (a BACKUP): the connection runs ``run`` in a thread of
    the loop's executor and answers ``reply(what it returned)`` when it is done; the loop
    serves everyone meanwhile."""

    run: Callable
    reply: Callable


@dataclass(frozen=True, slots=True)
class OnLoop:
    """A request answered once a coroutine on the loop is done (a transaction's end, whose
    markers may wait for room): the connection runs ``coro`` as a task and answers
    ``reply(what it returned)``; the loop serves everyone meanwhile."""

    coro: object
    reply: Callable


@dataclass(frozen=True, slots=True)
class BlockingAppend:
    """An append to a stream with retention="block", which may wait for room: the
    connection hands ``run`` to the stream's appender thread (``appenders``) and answers
    ``reply(what it returned)`` when it is done."""

    stream: object
    run: Callable
    reply: Callable


def _wait_or_answer(conn, f, line_of, handle, take, reply, args, wait_take=None):
    """``reply(conn, args, take(args))`` if it got something, else a Wait in the line
    ``line_of(handle)`` (with ``wait_ms``, not while stopping; tried there with
    ``wait_take``, else ``take``), else ``reply(conn, args, NOTHING)``. The line is looked
    up only for a request that waits."""
    got = take(args)
    if got is None:
        if f["wait_ms"] and not conn.server.stopping:
            return Wait(line_of(handle), wait_take or take, reply, args, f["wait_ms"])
        got = NOTHING
    return reply(conn, args, got)


def _reply_budget(server, most) -> int:
    """The bytes of bodies and headers a reply of ``most`` items may carry within a frame."""
    return max(server.max_frame_bytes - 1024 - most * RECORD_OVERHEAD, 0)


def hello(conn, f):
    server = conn.server
    if server.token is not None:
        if not hmac.compare_digest(str(f.get("token") or "").encode(), server.token.encode()):
            given, peer = bool(f.get("token")), getattr(conn, "peer", None)
            logging.getLogger("shmq.server").warning(
                "%s: token refused (%s)", peer, "a wrong token" if given else "no token",
                extra={"event": "token_refused", "peer": peer, "token_given": given})
            raise Unauthorized("wrong or missing token")
        conn.authenticated()
    reply = {"server": "shmq", "version": __version__, "max_frame_bytes": server.max_frame_bytes,
             "compression": CODECS, "produce_each": True, "compact": True}
    if "heartbeat_ms" in f:  # the client wants to hear from the server while it only waits
        reply["heartbeat_ms"] = conn.beat_every(f["heartbeat_ms"])
    return reply


def ping(conn, f):
    return {}


def backup(conn, f):
    """BACKUP: every durable queue and stream, the exchanges and the Kafka listener's
    commit metadata copied into the new directory ``dest`` (server/backup.py), in a thread."""
    from .backup import start  # (it loads persistence: only a server asked for a backup needs it)

    return OffLoop(start(conn.server, f["dest"]), _backed_up)


def _backed_up(summary):
    return summary


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
_SETTINGS = ("max_bytes", "max_message_bytes", "max_deliveries", "dead_letter_queue", "durability", *QUEUE_OPTIONS)
_CLEARABLE = ("max_deliveries", "dead_letter_queue", "message_ttl", "retry_delay_max", "priority_aging", "expires")


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
    budget = _reply_budget(server, most)  # the reply must fit in a frame
    args = (q, most, vis, budget if max_bytes is None else min(budget, max_bytes), not f.get("auto_ack"),
            f.get("rows", False))
    in_c = server.plain is not None and vis is None and max_bytes is None and args[4]  # as the C path's CONSUME
    return _wait_or_answer(conn, f, server.waiters_of, q, _get, _leased, args, plain_take if in_c else None)


def plain_consume(conn, msg_id, f):
    """``consume`` of a plain CONSUME (``requests.check_plain_consume``: one message, a
    lease, maps): its reply frame, or a Wait as ``consume`` makes it."""
    server = conn.server
    q = server.queues.get(f["queue"])
    args = (q, 1, None, _reply_budget(server, 1), True, False)
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
    server = conn.server
    return plain_take, _leased, (q, most, None, _reply_budget(server, most), True, rows, server.plain, conn.leases,
                                  msg_id)


def plain_take(args):
    """A waiting CONSUME tried again in C (``Plain.deliver``): its reply frame made there,
    or None; where C leaves it, ``_get``'s try. ``args``: ``_get``'s, then the C path, the
    connection's leases and the request's id (``Wait.args_for``)."""
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
    budget = _reply_budget(conn.server, 0)
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


# ---------------------------------------------------------------- streams
def stream_create(conn, f):
    server = conn.server
    s = server.broker.create_stream(f["stream"], **stream_create_args(f))
    try:
        if server.on_create is not None:
            server.on_create(s)  # a wal stream's logs are open before the first append
        return stream_info_fields(s)
    finally:
        s.close()


def stream_delete(conn, f):
    conn.server.streams.forget(f["stream"])
    conn.server.broker.delete_stream(f["stream"])
    return {}


def stream_list(conn, f):
    return {"streams": conn.server.broker.list_streams()}


def stream_info(conn, f):
    return stream_info_fields(conn.server.stream(f["stream"]))


def stream_stats(conn, f):
    return stream_stats_fields(conn.server.stream(f["stream"]).stats())


def _appended(conn, s, run, reply):
    """``reply(run())`` of an append, made now, or a BlockingAppend where it may wait for room."""
    if s.retention == "block":
        return BlockingAppend(s, run, reply)
    with serving():
        result = reply(run())
    conn.server.streams.notify(s.name)
    return result


def append(conn, f):
    s = conn.server.stream(f["stream"])
    if "txn" in f:  # (server/txns.py)
        return txns.append_in(conn, s, f["txn"], [f["value"]], [f.get("key")], [f.get("headers")],
                              f.get("partition"), lambda ms: _one_appended(ms[0]))
    return _appended(conn, s, lambda: s.append(f["value"], key=f.get("key"), headers=f.get("headers"),
                                               partition=f.get("partition")), _one_appended)


def _one_appended(m):
    return {"partition": m.partition, "offset": m.offset, "timestamp": m.timestamp}


def append_batch(conn, f):
    s = conn.server.stream(f["stream"])
    values, keys, headers = batch_args(f, conn.server.max_frame_bytes)
    if "txn" in f:
        return txns.append_in(conn, s, f["txn"], values, keys or [None] * len(values), headers, f.get("partition"),
                              _batch_appended)
    return _appended(conn, s, lambda: s.append_many(values, keys=keys, headers=headers, partition=f.get("partition")),
                     _batch_appended)


def _batch_appended(metas):
    return {"records": [metadata_fields(m) for m in metas]}


def fill(take, most, budget, per_record) -> list:
    """Records from ``take(n, got)`` (a non-blocking read or poll of up to n records, after
    the records ``got`` so far) until ``most`` of them, or until the next could overrun
    ``budget`` bytes: each round asks only for as many as surely fit, every record being
    at most ``per_record`` bytes on the wire. The first record always comes, as a
    CONSUME's first message does."""
    out = []
    while len(out) < most:
        n = min(most - len(out), max(budget, 0) // per_record) or (0 if out else 1)
        if n == 0:
            break
        got = take(n, out)
        out += got
        if len(got) < n:
            break
        budget -= sum(map(_record_bytes, got))
    return out


def _record_bytes(r) -> int:
    """What a record read takes of a reply's budget."""
    n = len(r.value or b"") + len(r.key or b"") + RECORD_OVERHEAD
    return n + len(msgpack.packb(r.headers, use_bin_type=True)) if r.headers else n


def _records(conn, s, f, take, *what):
    """A READ's or POLL's reply: what ``take`` gives now, else a Wait on the stream's line.
    ``what``: the request's own args (a READ's stream, partition and offset, a POLL's
    member), then the most records, the reply's budget and the most a record may take."""
    args = (*what, f["max"], _reply_budget(conn.server, 0), s.max_message_bytes + RECORD_OVERHEAD)
    return _wait_or_answer(conn, f, conn.server.streams.line_of, s, take, _records_reply, args)


def _read(args):
    s, p, offset, *limits = args
    return fill(lambda n, got: s.read(p, got[-1].offset + 1 if got else offset, n), *limits) or None


def _poll(args):
    c, *limits = args
    got = fill(lambda n, got: c.poll(max_records=n, timeout=0), *limits)
    return got if got or c.told != ({}, []) else None  # the assignment's changes are answered at once


def _poll_reply(conn, args, rs):
    """A POLL's records, and the assignment's changes its member found (``HeldConsumer``)."""
    return {"records": [record_reply(r) for r in rs], **args[0].take_told()}


def _records_reply(conn, args, rs):
    return {"records": [record_reply(r) for r in rs]}


def read(conn, f):
    s = conn.server.stream(f["stream"])
    return _records(conn, s, f, _read, s, f["partition"], f["offset"])


def offsets(conn, f):
    s = conn.server.stream(f["stream"])
    earliest, end = s.offsets(f["partition"])
    return {"earliest": earliest, "end": end, "stable": s.stable(f["partition"])}


def publish(conn, f):
    ranges = {}
    for p, sp, first, end in f["ranges"]:
        ranges.setdefault(p, []).append((sp, first, end))
    s, staging = conn.server.stream(f["stream"]), conn.server.stream(f["staging"])
    return _appended(conn, s, lambda: s.publish(staging, ranges, f["txn"], f["batch"]),
                     lambda first: {"first": pairs(first)})


def published(conn, f):
    return {"published": pairs(conn.server.stream(f["stream"]).published(f["txn"]))}


def delete_records(conn, f):
    return {"deleted": conn.server.stream(f["stream"]).delete_records(from_pairs(f["offsets"]))}


def join(conn, f):
    s = conn.server.stream(f["stream"])  # StreamNotFound before anything is made
    options = {}
    if "max_poll_interval_ms" in f:
        options["max_poll_interval"] = f["max_poll_interval_ms"] / 1000 or None
    tag, c = conn.members.join(conn.server.broker, s.name, f["group"], f["auto_offset_reset"], **options)
    conn.server.streams.notify(s.name)  # the group's waiting POLLs rebalance
    return {"member": tag, "partitions": c.assignment()}


def poll(conn, f):
    s = conn.server.stream(f["stream"])
    c = conn.members.get(s.name, f["member"])
    c.polling(f["wait_ms"] / 1000)  # max_poll_interval counts from the end of the wait
    args = (c, f["max"], _reply_budget(conn.server, 0), s.max_message_bytes + RECORD_OVERHEAD)
    return _wait_or_answer(conn, f, conn.server.streams.line_of, s, _poll, _poll_reply, args)


def poll_many(conn, f):
    """One POLL of several members of this connection (a consumer of several streams),
    in the order named; it waits in all their streams' lines at once (``AnyLine``)."""
    members = [conn.members.get(name, tag) for name, tag in f["members"]]
    for c in members:
        c.polling(f["wait_ms"] / 1000)
    args = (members, f["max"], _reply_budget(conn.server, 0))
    return _wait_or_answer(conn, f, lambda _: _any_line(conn, members), None, _poll_many, _poll_many_reply, args)


def _any_line(conn, members):
    streams = conn.server.streams
    return AnyLine(conn.server.loop, [streams.line_of(conn.server.stream(c.stream.name)) for c in members])


def _poll_many(args):
    """Each member's records (None: its stream is gone), the most and the reply's budget
    shared in order; None when none has records, changes to tell, or is gone."""
    members, left, budget = args
    polls, answer = [], False
    for c in members:
        per_record = c.stream.max_message_bytes + RECORD_OVERHEAD
        try:
            got = []
            if left and (not answer or budget >= per_record):  # only the first record may overrun the frame
                got = fill(lambda n, got: c.poll(max_records=n, timeout=0), left, budget, per_record)
        except StreamNotFound:
            polls.append(None)
            answer = True
            continue
        polls.append(got)
        left -= len(got)
        budget -= sum(map(_record_bytes, got))
        answer = answer or bool(got) or c.told != ({}, [])
    return polls if answer else None


def _poll_many_reply(conn, args, polls):
    members = args[0]
    out = []
    for c, got in zip(members, polls or [()] * len(members)):
        if got is None:
            out.append({"records": [], "gone": True, "revoked": pairs(c.positions())})
        else:
            out.append({"records": [record_reply(r) for r in got], **c.take_told()})
    return {"polls": out}


def commit(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    c.commit_for_client(from_pairs(f["offsets"]) if "offsets" in f else None, f["revoked"])
    return {}


def seek(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    to, ps = f.get("to"), f["partitions"]
    if "offset" in f and len(ps) == 1:
        c.seek(ps[0], f["offset"])
    elif to in ("beginning", "end") and "offset" not in f:
        (c.seek_to_beginning if to == "beginning" else c.seek_to_end)(*ps)
    else:
        raise ValueError(f"a SEEK takes one partition and an offset, or partitions and to: 'beginning' or 'end', "
                         f"not {ps!r}, {f.get('offset')!r}, {to!r}")
    return {}


def pause(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    if f.get("paused") is not None:
        (c.pause if f["paused"] else c.resume)(*f["partitions"])
    return {"paused": c.paused()}


def leave(conn, f):
    conn.members.leave(f["stream"], f["member"])
    conn.server.streams.notify(f["stream"])
    return {}


def assignment(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    owned = c.assignment()
    return {"partitions": owned, "positions": pairs({p: c.position(p) for p in owned})}


def groups(conn, f):
    return {"groups": conn.server.stream(f["stream"]).groups()}


def committed(conn, f):
    return {"committed": pairs(conn.server.stream(f["stream"]).committed(f["group"]))}


def lag(conn, f):
    return {"lag": pairs(conn.server.stream(f["stream"]).lag(f["group"]))}


def reset(conn, f):
    to = from_pairs(f["offsets"]) if "offsets" in f else f.get("to", "earliest")
    conn.server.stream(f["stream"]).reset(f["group"], to=to)
    return {}


# ---------------------------------------------------------------- exchanges, request/reply
SERVER_LOCK_TIMEOUT_S = 0.25  # as the cached handles' (tcp.LOCK_TIMEOUT_S)
FOREVER_MS = 10**12  # a REQUEST without timeout_ms waits this long (for ever)


def _exchanges(server):
    x = server.broker.exchange_table()
    x.lock_timeout = SERVER_LOCK_TIMEOUT_S
    return x


def x_create(conn, f):
    conn.server.broker.create_exchange(f["exchange"], f["type"], f["exist_ok"])
    return {}


def x_delete(conn, f):
    conn.server.broker.delete_exchange(f["exchange"])
    return {}


def x_list(conn, f):
    if "exchange" in f:
        return conn.server.broker.exchange_info(f["exchange"])
    return {"exchanges": conn.server.broker.list_exchanges()}


def x_bind(conn, f):
    conn.server.broker.bind(f["exchange"], f["target"], f["pattern"])
    return {}


def x_unbind(conn, f):
    return {"unbound": conn.server.broker.unbind(f["exchange"], f["target"], f.get("pattern"))}


def x_publish(conn, f):
    """Put into each target now (a full queue: QUEUE_FULL, the targets before it have the
    message); with a stream of retention="block" among them, in that stream's appender,
    as an append to it is."""
    server = conn.server
    x = _exchanges(server)
    key = f.get("routing_key", "")
    run = lambda: x.publish(f["exchange"], f["body"], key, f.get("headers"), f.get("dedup_id"), 0)  # noqa: E731
    for kind, target in x.routes(f["exchange"], key):
        if kind == "s":
            try:
                s = server.stream(target)
            except StreamNotFound:
                continue
            if s.retention == "block":
                return BlockingAppend(s, run, lambda done: _published(server, done))
    with serving():
        done = run()
    return _published(server, done)


def _published(server, done):
    for kind, target in done:
        (server.notify if kind == "q" else server.streams.notify)(target)
    return {"targets": len(done)}


def request(conn, f):
    """Put the request with a reply queue of its own (``rpc.Call``, owned by this server
    for the connection) and wait on that queue for the reply."""
    server = conn.server
    call = Call(server.broker, f["queue"], f["body"], f.get("headers"), put_timeout=0,
                lock_timeout=SERVER_LOCK_TIMEOUT_S)
    conn.calls.add(call)
    server.notify(f["queue"])
    try:
        replies = server.queue(call.reply_queue)
    except BaseException:
        _end_call(conn, call)
        raise
    wait_ms = f.get("timeout_ms", FOREVER_MS)
    return _wait_or_answer(conn, {"wait_ms": wait_ms}, server.waiters_of, replies, _reply_of, _replied,
                           (call, replies, wait_ms))


def _reply_of(args):
    return args[0].poll(args[1])


def _replied(conn, args, got):
    call, _replies, wait_ms = args
    conn.server.loop.call_soon(_end_call, conn, call)  # not while its line is being served
    if got is NOTHING:
        raise RequestTimeout(f"no reply to the request on queue {call.queue!r} within {wait_ms / 1000}s")
    body, headers = got
    return {"body": body, "headers": headers} if headers else {"body": body}


def _end_call(conn, call):
    """The request is over: its reply queue goes (a late reply is dropped)."""
    conn.calls.discard(call)
    conn.server.forget(call.reply_queue)
    call.close()


# ---------------------------------------------------------------- keyed stores (engine/store.py, server/stores.py)
def _store(conn, f):
    return conn.server.stores.get(f["store"])


def _fits(conn, size: int, what: str) -> None:
    """MessageTooLarge unless a reply of about ``size`` bytes fits in a frame of this server."""
    most = conn.server.max_frame_bytes - 1024
    if size > most:
        raise MessageTooLarge(f"{what} takes {size} bytes, more than a reply of this server holds ({most}; "
                              "--max-frame-bytes): ask for less at a time")


def _kv_wrote(conn, f, result):
    conn.server.stores.wrote(f["store"])  # its waiting GETs look now
    return result


def kv_open(conn, f):
    _store(conn, f)
    return {}


def kv_list(conn, f):
    return {"stores": conn.server.broker.list_stores()}


def kv_drop(conn, f):
    return {"deleted": conn.server.broker.delete_store(f["store"])}


def kv_set(conn, f):
    return _kv_wrote(conn, f, {"set": _store(conn, f).set(f["key"], f["value"], f.get("ttl"), f["only_new"])})


def kv_get(conn, f):
    """GET: the value, or (``wait_ms``) a wait in the store's line for the key to be there."""
    kv = _store(conn, f)
    return _wait_or_answer(conn, f, conn.server.stores.line_of, kv, _kv_take, _kv_got, (kv, f["key"]))


def _kv_take(args):
    kv, key = args
    return kv.get(key)


def _kv_got(conn, args, got):
    if got is NOTHING:
        return {"value": None}
    _fits(conn, len(got), f"the value of key {args[1]!r:.80}")
    return {"value": got}


def kv_get_many(conn, f):
    values = _store(conn, f).get_many(f["keys"])
    _fits(conn, sum(8 + len(v or b"") for v in values), f"the values of {len(values)} keys")
    return {"values": values}


def kv_delete(conn, f):
    return {"deleted": _store(conn, f).delete(*f["keys"])}


def kv_incr(conn, f):
    return _kv_wrote(conn, f, {"value": _store(conn, f).incr(f["key"], f["by"], f.get("ttl"))})


def kv_add(conn, f):
    return _kv_wrote(conn, f, {"size": _store(conn, f).add(f["key"], f["member"], f.get("ttl"))})


def kv_members(conn, f):
    members = sorted(_store(conn, f).members(f["key"]))
    _fits(conn, sum(8 + len(m.encode()) for m in members), f"the {len(members)} members of key {f['key']!r:.80}")
    return {"members": members}


def kv_expire(conn, f):
    return {"found": _store(conn, f).expire(f["key"], f["ttl"])}


def kv_ttl(conn, f):
    return {"ttl": _store(conn, f).ttl(f["key"])}


def kv_keys(conn, f):
    keys = _store(conn, f).keys(f["prefix"])
    _fits(conn, sum(8 + len(k.encode()) for k in keys), f"{len(keys)} keys")
    return {"keys": keys}


def kv_clear(conn, f):
    return {"cleared": _store(conn, f).clear()}


def kv_sweep(conn, f):
    return {"swept": _store(conn, f).sweep()}


# request type -> its handler: every type of protocol.requests.REQUEST_FIELDS
HANDLERS = {
    MsgType.HELLO: hello,
    MsgType.CREATE: create,
    MsgType.DELETE: delete,
    MsgType.LIST: list_queues,
    MsgType.STATS: stats,
    MsgType.PURGE: purge,
    MsgType.PING: ping,
    MsgType.BACKUP: backup,
    MsgType.CONSUMER_ADD: consumer_add,
    MsgType.CONSUMER_REMOVE: consumer_remove,
    MsgType.PRODUCE: produce,
    MsgType.PRODUCE_BATCH: produce_batch,
    MsgType.CONSUME: consume,
    MsgType.ACK: ack,
    MsgType.NACK: nack,
    MsgType.EXTEND: extend,
    MsgType.REJECT: reject,
    MsgType.PEEK: peek,
    MsgType.REDRIVE: redrive,
    MsgType.SUBSCRIBE: subscribe,
    MsgType.CANCEL: cancel,
    MsgType.STREAM_CREATE: stream_create,
    MsgType.STREAM_DELETE: stream_delete,
    MsgType.STREAM_LIST: stream_list,
    MsgType.STREAM_INFO: stream_info,
    MsgType.STREAM_STATS: stream_stats,
    MsgType.APPEND: append,
    MsgType.APPEND_BATCH: append_batch,
    MsgType.READ: read,
    MsgType.OFFSETS: offsets,
    MsgType.PUBLISH: publish,
    MsgType.PUBLISHED: published,
    MsgType.DELETE_RECORDS: delete_records,
    MsgType.JOIN: join,
    MsgType.POLL: poll,
    MsgType.POLL_MANY: poll_many,
    MsgType.COMMIT: commit,
    MsgType.SEEK: seek,
    MsgType.PAUSE: pause,
    MsgType.LEAVE: leave,
    MsgType.ASSIGNMENT: assignment,
    MsgType.GROUPS: groups,
    MsgType.COMMITTED: committed,
    MsgType.LAG: lag,
    MsgType.RESET: reset,
    MsgType.TXN_INIT: txns.txn_init,
    MsgType.TXN_OFFSETS: txns.txn_offsets,
    MsgType.TXN_END: txns.txn_end,
    MsgType.X_CREATE: x_create,
    MsgType.X_DELETE: x_delete,
    MsgType.X_LIST: x_list,
    MsgType.X_BIND: x_bind,
    MsgType.X_UNBIND: x_unbind,
    MsgType.X_PUBLISH: x_publish,
    MsgType.REQUEST: request,
    MsgType.KV_OPEN: kv_open,
    MsgType.KV_LIST: kv_list,
    MsgType.KV_DROP: kv_drop,
    MsgType.KV_SET: kv_set,
    MsgType.KV_GET: kv_get,
    MsgType.KV_GET_MANY: kv_get_many,
    MsgType.KV_DELETE: kv_delete,
    MsgType.KV_INCR: kv_incr,
    MsgType.KV_ADD: kv_add,
    MsgType.KV_MEMBERS: kv_members,
    MsgType.KV_EXPIRE: kv_expire,
    MsgType.KV_TTL: kv_ttl,
    MsgType.KV_KEYS: kv_keys,
    MsgType.KV_CLEAR: kv_clear,
    MsgType.KV_SWEEP: kv_sweep,
}

# The replies of the plain requests, each packed once but for its one value (``shapes.Shape``:
# a reply's status is 0, as a request's; the bytes are ``encode_reply``'s, a test holds them equal).
_PRODUCED = Shape(MsgType.PRODUCE | REPLY_BIT, {}, "id")
_CONSUMED = Shape(MsgType.CONSUME | REPLY_BIT, {}, "messages")
_ACKED = Shape(MsgType.ACK | REPLY_BIT, {}, "acked")

# request type -> (check, handler) of its plain shape (``requests.PLAIN_CHECKS``): the check
# returns the fields or None (then ``check_request`` and ``HANDLERS``), the handler returns
# the reply frame (or a Wait) for ``(conn, msg_id, fields)``
PLAIN = {MsgType.PRODUCE: (PLAIN_CHECKS[MsgType.PRODUCE], plain_produce),
         MsgType.CONSUME: (PLAIN_CHECKS[MsgType.CONSUME], plain_consume),
         MsgType.ACK: (PLAIN_CHECKS[MsgType.ACK], plain_ack)}
