"""The server's request handlers (shmq/server/handlers/), without a socket where they
can be: a fake connection, a real TcpServer that never listens, a real local namespace.

Strategy: a handler takes the connection and the checked fields and returns the reply
payload, so each is called here with fields decoded from real request bytes
(``validate_request``) and its effect read back through a local handle. The ACK that
fails on a full disk is tested twice for real (a small tmpfs of the test's own): at the
handler, and end to end against a ``shmq server`` process over a raw socket.
"""

import ast
import inspect
import os
import time
from pathlib import Path

import pytest

import shmq
from shmq.errors import DeliveryExpired, ProtocolError, QueueNotFound, StorageError, Unauthorized
from shmq.persistence import Snapshotter
from shmq.protocol import REQUEST_FIELDS, FrameDecoder, MsgType, Status, encode_request, validate_request
from shmq.protocol import compression, error_from_reply
from shmq.protocol.payloads import stats_fields
from shmq.server import handlers
from shmq.server.connection import error_frame
from shmq.server.handlers import HANDLERS, Wait
from shmq.server.leases import Leases
from shmq.server.members import Members
from shmq.server.tcp import TcpServer
from tests.test_server_tcp import ServerProcess, _read_frames, _sock
from tests.test_storage_faults import _fill_disk, small_fs  # noqa: F401  (a fixture)

SERVER_DIR = Path(handlers.__file__).parent.parent  # shmq/server (handlers is a package in it)

# Request types the connection answers itself, outside the table: none. It handles only
# what is not a request for a handler: frames sent as replies, requests before HELLO,
# codec errors, and the wait of a CONSUME whose handler returned a Wait.
HANDLED_BY_THE_CONNECTION = set()


class FakeConnection:
    """What a handler may use of a connection (see shmq/server/handlers/)."""

    def __init__(self, server):
        self.server = server
        self.leases = Leases()
        self.members = Members()
        self.authed = server.token is None

    def authenticated(self):
        self.authed = True


@pytest.fixture
def make_server(broker):
    """TcpServers that never listen; the queue handles they cached are closed afterwards."""
    made = []

    def make(**kwargs):
        made.append(TcpServer(broker, port=0, **kwargs))
        return made[-1]

    yield make
    for srv in made:
        for name in broker.list_queues():
            srv.forget(name)
        srv.streams.forget_all()


@pytest.fixture
def server(make_server):
    return make_server()


@pytest.fixture
def conn(server):
    return FakeConnection(server)


def call(conn, msg_type, payload=None):
    """The handler of ``msg_type`` on the checked fields of a real request frame."""
    dec = FrameDecoder()
    dec.feed(encode_request(msg_type, 1, payload or {}))
    return HANDLERS[msg_type](conn, validate_request(dec.next_frame()))


def lease(conn, queue, n):
    """Consume up to n: (message ids, delivery tags)."""
    messages = call(conn, MsgType.CONSUME, {"queue": queue, "max": n})["messages"]
    return [m["id"] for m in messages], [m["delivery"] for m in messages]


# ------------------------------------------------------------------ the table


def test_the_table_covers_every_request_type():
    assert set(HANDLERS) == set(REQUEST_FIELDS) - HANDLED_BY_THE_CONNECTION
    assert HANDLED_BY_THE_CONNECTION == set()
    for msg_type, handler in HANDLERS.items():
        assert list(inspect.signature(handler).parameters) == ["conn", "f"], MsgType(msg_type).name


def _private_uses(path):
    """(line, text) of each use of another object's private name in a module: ``x._y``
    where x is not self or cls, ``getattr(x, "_y")``, ``from m import _y``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):  # (the folder's own C extension, ``from . import _x`` of _x.c, is its own)
            own = node.level == 1 and not node.module
            found += [(node.lineno, f"from {'.' * node.level}{node.module or ''} import {a.name}") for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")
                      and not (own and (path.parent / f"{a.name}.c").exists())]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and str(node.args[1].value).startswith("_")):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_server_uses_only_public_names_of_other_objects():
    """Nothing under shmq/server, its folders included (handlers/, kafka/, transactions/),
    reaches into the engine (``q._settle``, ``q._dead_letter``, ``d._q``...) or into another
    object's privates: only ``self._x``."""
    modules = sorted(SERVER_DIR.rglob("*.py"))
    names = {m.relative_to(SERVER_DIR).as_posix() for m in modules}
    assert names >= {"tcp.py", "connection.py", "handlers/__init__.py", "handlers/queues.py", "limits.py",
                     "waiters.py", "kafka/listener.py"}
    found = {m.relative_to(SERVER_DIR).as_posix(): _private_uses(m) for m in modules}
    assert {name: uses for name, uses in found.items() if uses} == {}


def test_the_scan_finds_private_uses(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from ..engine.mutex import _trylock\nq._settle_acks(ds)\ngetattr(d, '_q')\n"
                      "self._ok = 1\nq.__class__\n")
    assert sorted(_private_uses(sample)) == [
        (1, "from ..engine.mutex import _trylock"), (2, "q._settle_acks"), (3, "getattr(d, '_q')")]


def test_error_replies_log_only_bugs(caplog):
    """Every exception becomes an error reply of its status (protocol.status); only one
    that is no shmq error and has no status of its own — a bug — is logged, with its
    traceback, once."""
    cases = [
        (RuntimeError("boom"), Status.INTERNAL, True),
        (KeyError("k"), Status.INTERNAL, True),
        (shmq.ShmqError("odd"), Status.INTERNAL, False),
        (ValueError("bad value\nsecond line"), Status.BAD_REQUEST, False),
        (StorageError("disk full"), Status.STORAGE, False),
        (DeliveryExpired("gone"), Status.UNKNOWN_DELIVERY, False),
        (shmq.LockTimeout("held"), Status.LOCK_TIMEOUT, False),
        (ProtocolError("CONSUME: field 'max' must be ...", Status.BAD_REQUEST, 7), Status.BAD_REQUEST, False),
    ]
    for exc, status, logged in cases:
        caplog.clear()
        dec = FrameDecoder()
        dec.feed(error_frame(MsgType.ACK, 7, exc))
        f = dec.next_frame()
        assert (f.type, f.msg_id, f.status) == (MsgType.ACK | 0x80, 7, status), exc
        assert f.payload == {"error": str(exc).splitlines()[0]}
        assert [(r.message, r.exc_info[1]) for r in caplog.records] == ([("internal error", exc)] if logged else [])


# ------------------------------------------------------------------ each handler


def test_hello_with_and_without_a_token(conn, make_server):
    reply = call(conn, MsgType.HELLO, {"token": "ignored"})
    assert reply == {"server": "shmq", "version": shmq.__version__, "max_frame_bytes": 16 * 2**20,
                     "compression": compression.CODECS, "produce_each": True, "compact": True}
    guarded = FakeConnection(make_server(token="s3cret"))
    with pytest.raises(Unauthorized, match="wrong or missing token"):
        call(guarded, MsgType.HELLO, {"token": "wrong"})
    with pytest.raises(Unauthorized, match="wrong or missing token"):
        call(guarded, MsgType.HELLO)
    assert not guarded.authed
    assert call(guarded, MsgType.HELLO, {"token": "s3cret"})["server"] == "shmq"
    assert guarded.authed


def test_create_list_stats_purge_delete(conn, broker):
    assert call(conn, MsgType.PING) == {}
    assert call(conn, MsgType.CREATE, {"queue": "q", "max_bytes": 1 << 20, "visibility_timeout_ms": 1500,
                                       "max_deliveries": 3, "durability": "memory"}) == {}
    assert broker.queue("q").settings() == {
        "max_bytes": 1 << 20, "max_message_bytes": broker.queue("q").max_message_bytes, "visibility_timeout": 1.5,
        "max_deliveries": 3, "dead_letter_queue": None, "durability": "memory", "priorities": 1,
        "priority_aging": 60.0, "message_ttl": None, "dedup_window": 300.0, "retry_delay": 0.0, "retry_backoff": 1.0,
        "retry_delay_max": None, "lanes": 1, "auto_delete": False, "expires": None}  # the work-queue options:
    # the engine's defaults; one lane
    with pytest.raises(shmq.QueueExists):
        call(conn, MsgType.CREATE, {"queue": "q"})
    assert call(conn, MsgType.CREATE, {"queue": "q", "exist_ok": True}) == {}
    assert call(conn, MsgType.LIST) == {"queues": ["q"]}
    broker.queue("q").put_many([b"a", b"b"])
    stats = call(conn, MsgType.STATS, {"queue": "q"})
    local = stats_fields(broker.queue("q").stats())  # read a moment later: its oldest message a ms older, maybe
    assert local["oldest_ready_age_ms"] - 50 <= stats["oldest_ready_age_ms"] <= local["oldest_ready_age_ms"]
    assert stats == {**local, "oldest_ready_age_ms": stats["oldest_ready_age_ms"],
                     "settings": broker.queue("q").settings()}
    assert list(stats) == [  # the order of the bytes on the wire, as before the table
        "ready", "in_flight", "oldest_ready_age_ms", "bytes_used", "max_bytes", "enqueued_total", "acked_total",
        "redelivered_total", "dead_lettered_total", "consumers_waiting", "producers_waiting", "delayed",
        "purged_total", "expired_total", "ready_by_priority", "groups_in_flight", "dead_letter_depth", "bytes_held",
        "consumers", "settings"]
    assert (stats["ready"], stats["enqueued_total"]) == (2, 2)
    assert call(conn, MsgType.PURGE, {"queue": "q"}) == {"purged": 2}
    assert call(conn, MsgType.DELETE, {"queue": "q"}) == {}
    assert broker.list_queues() == []
    with pytest.raises(QueueNotFound):
        call(conn, MsgType.STATS, {"queue": "q"})


def test_create_calls_on_create_with_the_new_queue(make_server):
    made = []
    conn = FakeConnection(make_server(on_create=lambda q: made.append((q.name, q.durability))))
    call(conn, MsgType.CREATE, {"queue": "q"})
    assert made == [("q", "snapshot")]


def test_produce_consume_ack(conn, broker):
    call(conn, MsgType.CREATE, {"queue": "q"})
    assert call(conn, MsgType.PRODUCE, {"queue": "q", "body": b"one", "headers": {"k": 1}}) == {"id": 1}
    assert call(conn, MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [{"body": b"two"}, {"body": b"three"}]}) \
        == {"ids": [2, 3]}
    messages = call(conn, MsgType.CONSUME, {"queue": "q", "max": 2})["messages"]
    assert [(m["id"], m["body"], m["headers"], m["attempt"]) for m in messages] == [
        (1, b"one", {"k": 1}, 1), (2, b"two", {}, 1)]
    tags = [m["delivery"] for m in messages]
    assert len(conn.leases) == 2
    assert call(conn, MsgType.ACK, {"queue": "q", "deliveries": tags + tags[:1]}) == {"acked": 2}  # named twice: once
    assert len(conn.leases) == 0
    assert call(conn, MsgType.ACK, {"queue": "q", "deliveries": []}) == {"acked": 0}
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (1, 0, 2)


def test_a_settle_naming_an_unknown_delivery_touches_none(conn, broker):
    call(conn, MsgType.CREATE, {"queue": "q"})
    call(conn, MsgType.CREATE, {"queue": "other"})
    broker.queue("q").put_many([b"a", b"b"])
    _ids, tags = lease(conn, "q", 2)
    for msg_type in (MsgType.ACK, MsgType.NACK, MsgType.REJECT):
        with pytest.raises(DeliveryExpired, match=r"unknown deliveries on this connection: \[999\]"):
            call(conn, msg_type, {"queue": "q", "deliveries": [tags[0], 999]})
        with pytest.raises(DeliveryExpired, match="unknown deliveries"):  # held, but of another queue
            call(conn, msg_type, {"queue": "other", "deliveries": tags})
    with pytest.raises(DeliveryExpired):
        call(conn, MsgType.EXTEND, {"queue": "q", "deliveries": [999], "visibility_ms": 1000})
    assert len(conn.leases) == 2
    assert broker.queue("q").stats().in_flight == 2


def test_nack_reject_extend(conn, broker):
    call(conn, MsgType.CREATE, {"queue": "dlq"})
    call(conn, MsgType.CREATE, {"queue": "q", "dead_letter_queue": "dlq", "visibility_timeout_ms": 100})
    broker.queue("q").put_many([b"a", b"b", b"c"])
    ids, tags = lease(conn, "q", 3)
    assert call(conn, MsgType.EXTEND, {"queue": "q", "deliveries": tags, "visibility_ms": 60_000}) == {}
    assert len(conn.leases) == 3  # an extended lease stays held
    assert call(conn, MsgType.NACK, {"queue": "q", "deliveries": tags[:1]}) == {}
    assert call(conn, MsgType.NACK, {"queue": "q", "deliveries": tags[1:2], "requeue": False}) == {}
    assert call(conn, MsgType.REJECT, {"queue": "q", "deliveries": tags[2:]}) == {}
    assert len(conn.leases) == 0
    again = broker.queue("q").get_nowait()
    assert (again.id, again.attempt) == (ids[0], 2)
    again.ack()
    dlq = broker.queue("dlq")
    dead = dlq.get_many(5, timeout=0)
    assert [d.body for d in dead] == [b"b", b"c"]
    assert [d.headers["x-death-reason"] for d in dead] == ["rejected", "rejected"]
    dlq.ack_many(dead)


def test_nack_with_a_delay(conn, broker):
    call(conn, MsgType.CREATE, {"queue": "q"})
    broker.queue("q").put(b"a")
    _ids, tags = lease(conn, "q", 1)
    call(conn, MsgType.NACK, {"queue": "q", "deliveries": tags, "delay_ms": 60_000})
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.delayed) == (0, 0, 1)


def test_consume_with_nothing_ready_waits_or_answers_empty(conn, server, broker):
    call(conn, MsgType.CREATE, {"queue": "q"})
    assert call(conn, MsgType.CONSUME, {"queue": "q"}) == {"messages": []}
    wait = call(conn, MsgType.CONSUME, {"queue": "q", "max": 4, "wait_ms": 500, "visibility_ms": 60_000})
    assert type(wait) is Wait and wait.wait_ms == 500 and wait.line is server.waiters_of(server.queue("q"))
    assert wait.take(wait.args) is None  # nothing yet
    assert wait.reply(conn, wait.args, ()) == {"messages": []}  # the answer at the deadline
    broker.queue("q").put_many([b"a"] * 4)
    ds = wait.take(wait.args)  # what the line tries when it serves: the CONSUME's own get
    assert len(ds) == 4 and [m["body"] for m in wait.reply(conn, wait.args, ds)["messages"]] == [b"a"] * 4
    assert broker.queue("q").stats().in_flight == 4
    server.stopping = True  # a stopping server does not start a wait
    assert call(conn, MsgType.CONSUME, {"queue": "q", "wait_ms": 500}) == {"messages": []}


def test_release_makes_held_deliveries_ready_again(conn, server, broker):
    call(conn, MsgType.CREATE, {"queue": "q", "visibility_timeout_ms": 60_000})
    broker.queue("q").put_many([b"a", b"b"])
    lease(conn, "q", 2)
    told = []
    conn.leases.release(told.append, "peer")
    assert told == ["q"] and len(conn.leases) == 0
    assert [d.attempt for d in broker.queue("q").get_many(5, timeout=0)] == [2, 2]


def test_deliveries_of_a_deleted_queue_are_let_go_quietly(conn, server, broker, caplog):
    call(conn, MsgType.CREATE, {"queue": "q"})
    broker.queue("q").put(b"a")
    _ids, tags = lease(conn, "q", 1)
    call(conn, MsgType.DELETE, {"queue": "q"})
    call(conn, MsgType.CREATE, {"queue": "q"})  # a new queue of the same name: not the lease's
    with pytest.raises(DeliveryExpired, match="unknown deliveries"):
        call(conn, MsgType.ACK, {"queue": "q", "deliveries": tags})
    told = []
    conn.leases.release(told.append, "peer")
    assert told == [] and "could not release" not in caplog.text


# ------------------------------------------------------------------ streams


def test_a_read_reply_fits_its_frame_and_goes_on_from_where_it_stopped(make_server, broker):
    conn = FakeConnection(make_server(max_frame_bytes=64 * 1024))
    call(conn, MsgType.STREAM_CREATE, {"stream": "s", "partitions": 1, "max_bytes": 1 << 20,
                                       "max_message_bytes": 4096})
    broker.stream("s").append_many([b"%04d" % i + b"x" * 2996 for i in range(100)], headers=[{"i": 1}] * 100)
    reply = call(conn, MsgType.READ, {"stream": "s", "partition": 0, "offset": 3, "max": 100})
    n = len(reply["records"])
    assert 14 < n < 22  # as many as fit, in rounds that surely fit (64 KiB / 3 KB)
    assert [r["offset"] for r in reply["records"]] == list(range(3, 3 + n))
    assert len(encode_request(MsgType.READ, 1, reply)) <= 64 * 1024
    small = call(conn, MsgType.READ, {"stream": "s", "partition": 0, "offset": 3, "max": 5})
    assert small["records"] == reply["records"][:5]


def test_fill_asks_only_for_what_surely_fits():
    asked = []

    def take(n, got):
        asked.append(n)
        start = got[-1].offset + 1 if got else 0
        return [shmq.Record("s", 0, o, None, b"v", {}, 0.0) for o in range(start, min(start + n, 50))]

    got = handlers.fill(take, 40, budget=10 * 300, per_record=300)  # each costs 1 + RECORD_OVERHEAD
    assert [r.offset for r in got] == list(range(len(got))) and asked[:3] == [10, 5, 3]
    assert 3000 - 300 < len(got) * (1 + handlers.RECORD_OVERHEAD) <= 3000
    asked.clear()
    assert len(handlers.fill(take, 40, budget=100, per_record=300)) == 1 and asked == [1]  # the first always comes
    asked.clear()
    assert [r.offset for r in handlers.fill(take, 100, budget=10**6, per_record=300)] == list(range(50))


def test_members_belong_to_their_connection_and_leave_with_it(conn, server, broker):
    call(conn, MsgType.STREAM_CREATE, {"stream": "s", "partitions": 2, "max_bytes": 1 << 16})
    joined = call(conn, MsgType.JOIN, {"stream": "s", "group": "g"})
    assert joined["partitions"] == [0, 1]
    other = FakeConnection(server)
    with pytest.raises(ValueError, match=f"no member {joined['member']} of stream 's' on this connection"):
        call(other, MsgType.POLL, {"stream": "s", "member": joined["member"]})
    call(conn, MsgType.STREAM_CREATE, {"stream": "t", "partitions": 1, "max_bytes": 1 << 16})
    with pytest.raises(ValueError, match="no member"):
        call(conn, MsgType.COMMIT, {"stream": "t", "member": joined["member"]})
    second = call(other, MsgType.JOIN, {"stream": "s", "group": "g"})
    assert call(other, MsgType.ASSIGNMENT, {"stream": "s", "member": second["member"]})["partitions"] == [1]
    told = []
    conn.members.release(told.append, "peer")
    assert told == ["s"] and len(conn.members) == 0
    assert call(other, MsgType.ASSIGNMENT, {"stream": "s", "member": second["member"]}) == {
        "partitions": [0, 1], "positions": [[0, 0], [1, 0]]}
    assert broker.stream("s").stats()["groups"]["g"]["members"] == 1
    call(other, MsgType.LEAVE, {"stream": "s", "member": second["member"]})
    assert len(other.members) == 0 and broker.stream("s").stats()["groups"]["g"]["members"] == 0


def test_offset_out_of_range_travels_with_earliest_and_end(conn, broker):
    call(conn, MsgType.STREAM_CREATE, {"stream": "s", "partitions": 1, "max_bytes": 1 << 16})
    broker.stream("s").append_many([b"a", b"b"])
    with pytest.raises(shmq.OffsetOutOfRange) as e:
        call(conn, MsgType.READ, {"stream": "s", "partition": 0, "offset": 5})
    frame = _decoded(error_frame(MsgType.READ, 9, e.value))
    assert (frame.status, frame.payload) == (Status.OFFSET_OUT_OF_RANGE, {
        "error": "stream 's' partition 0: offset 5 is outside [0, 2]", "earliest": 0, "end": 2})
    again = error_from_reply(frame, "here")
    assert (type(again), str(again), again.earliest, again.end) == (shmq.OffsetOutOfRange, str(e.value), 0, 2)


def _decoded(data):
    dec = FrameDecoder()
    dec.feed(data)
    return dec.next_frame()


# ------------------------------------------------------------------ a full disk under an ACK


@pytest.fixture
def wal_conn(broker, small_fs, make_server):
    """A connection of a server whose wal queues log into a 4 MiB tmpfs; its queue "w"."""
    snap = Snapshotter(broker, str(small_fs / "data"))
    conn = FakeConnection(make_server(on_create=snap.open_wal))
    call(conn, MsgType.CREATE, {"queue": "w", "durability": "wal", "visibility_timeout_ms": 60_000})
    yield conn
    snap.close()


def test_an_ack_that_fails_on_a_full_disk_keeps_its_deliveries(wal_conn, broker, small_fs):
    conn = wal_conn
    call(conn, MsgType.PRODUCE_BATCH, {"queue": "w", "messages": [{"body": b"m%d" % i} for i in range(300)]})
    _ids, tags = lease(conn, "w", 300)
    filler = _fill_disk(small_fs, reserve=False)
    acked = 0
    with pytest.raises(StorageError, match="No space left on device"):
        for tag in tags:  # the log's last page takes a few more entries, then none
            assert call(conn, MsgType.ACK, {"queue": "w", "deliveries": [tag]}) == {"acked": 1}
            acked += 1
    assert acked < len(tags)
    failed = tags[acked]
    assert len(conn.leases) == len(tags) - acked  # the failed one is still held
    assert broker.queue("w").stats().in_flight == len(tags) - acked  # and still leased
    os.unlink(filler)
    assert call(conn, MsgType.ACK, {"queue": "w", "deliveries": [failed]}) == {"acked": 1}  # the retry works
    assert len(conn.leases) == len(tags) - acked - 1


def test_over_tcp_a_failed_ack_can_be_retried_and_a_close_releases(broker, small_fs):
    """End to end: ``shmq server --data-dir`` on a full tmpfs answers STORAGE to an ACK;
    the retry on the same connection succeeds once there is room, and the delivery of a
    failed ACK is ready again at once when its connection closes."""
    srv = ServerProcess(broker.namespace, "--data-dir", str(small_fs / "data"), "--snapshot-interval", "3600")
    try:
        s = _sock(srv.port)

        def request(msg_id, msg_type, payload):
            s.sendall(encode_request(msg_type, msg_id, payload))
            (f,) = _read_frames(s)
            assert f.msg_id == msg_id
            return f

        request(1, MsgType.CREATE, {"queue": "w", "durability": "wal", "visibility_timeout_ms": 60_000})
        request(2, MsgType.PRODUCE_BATCH, {"queue": "w", "messages": [{"body": b"m%d" % i} for i in range(300)]})
        messages = request(3, MsgType.CONSUME, {"queue": "w", "max": 300}).payload["messages"]
        assert len(messages) == 300
        filler = _fill_disk(small_fs, reserve=False)  # (the data dir's reserve too)
        for i, m in enumerate(messages):
            f = request(10 + i, MsgType.ACK, {"queue": "w", "deliveries": [m["delivery"]]})
            if f.status != Status.OK:
                break
        assert f.status == Status.STORAGE and "No space left on device" in f.payload["error"]
        first = messages[i]
        f = request(1000, MsgType.ACK, {"queue": "w", "deliveries": [first["delivery"]]})  # still full
        assert f.status == Status.STORAGE
        os.unlink(filler)
        f = request(1001, MsgType.ACK, {"queue": "w", "deliveries": [first["delivery"]]})
        assert (f.status, f.payload) == (Status.OK, {"acked": 1})

        filler = _fill_disk(small_fs, reserve=False)
        rest = messages[i + 1:]
        for j, m in enumerate(rest):
            f = request(2000 + j, MsgType.ACK, {"queue": "w", "deliveries": [m["delivery"]]})
            if f.status != Status.OK:
                break
        assert f.status == Status.STORAGE
        left = {m["id"] for m in rest[j:]}  # the failed one among them
        s.close()  # every one still held is ready again at once, the failed one too
        q = broker.queue("w")
        got = []
        deadline = time.monotonic() + 10  # far less than the 60 s visibility timeout
        while len(got) < len(left) and time.monotonic() < deadline:
            try:
                got += q.get_many(len(left), timeout=max(deadline - time.monotonic(), 0), visibility_timeout=60)
            except shmq.QueueEmpty:
                break
        assert {d.id for d in got} == left and {d.attempt for d in got} == {2}
        os.unlink(filler)
        q.ack_many(got)
        q.close()
    finally:
        assert srv.stop() == 0
