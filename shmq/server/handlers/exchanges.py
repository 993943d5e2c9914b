"""The exchanges (X_CREATE, X_DELETE, X_LIST, X_BIND, X_UNBIND, X_PUBLISH) and REQUEST,
a request that waits on a reply queue of its own."""

from ...engine.shm.waits import serving
from ...engine.queues.rpc import Call
from ...errors import RequestTimeout, StreamNotFound
from ..waiters import NOTHING
from .answers import BlockingAppend, wait_or_answer


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
    return wait_or_answer(conn, {"wait_ms": wait_ms}, server.waiters_of, replies, _reply_of, _replied,
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
