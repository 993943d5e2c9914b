"""The work a ``Connection`` (shmq/server/connection.py) does per request on the hot
path: PING, PRODUCE, PRODUCE_BATCH, an immediate CONSUME, ACK, NACK (issue 28, item 3).

Strategy: speed figures belong in the bench (``python -m bench.tcp_one`` reports the
server's CPU per message); what a test can hold exactly is the work itself. A request
is read by a real ``Connection`` of a real ``TcpServer`` (never listening) on the test's
namespace, its bytes handed over as the event loop hands them (``get_buffer``,
``buffer_updated``) and its replies taken from a transport that keeps what is written.
``sys.setprofile`` counts the Python calls made in the server's own per-request modules
(the connection, the handlers, the leases, the limits, the metrics hook, the protocol
package): the engine's, the loop's and the waiters' calls are not counted. Each bound
is what the request takes now; before issue 28 the same requests took 27 (PING) to 39
(CONSUME) calls, plus a Frame dataclass made per request.
"""

import asyncio
import sys
from collections import Counter
from pathlib import Path

import pytest

from shmq import protocol
from shmq.protocol import REPLY_BIT, FrameDecoder, MsgType, Status, encode_request
from shmq.server import connection, handlers, leases, limits, metrics
from shmq.server.connection import Connection
from shmq.server.tcp import TcpServer

COUNTED = {m.__file__ for m in (connection, handlers, leases, limits, metrics)} | {
    str(p) for p in Path(protocol.__file__).parent.glob("*.py")}

# the most Python calls one request may take, in one read of its own
MOST_CALLS = {"PING": 18, "PRODUCE": 20, "PRODUCE_BATCH": 23, "CONSUME": 27, "ACK": 23, "NACK": 24}
MOST_CALLS_PIPELINED = 8  # per PING, 16 in one read: the read's own work shared out


class Transport:
    """What the event loop's transport is to a connection; it keeps what is written."""

    def __init__(self):
        self.written = []

    def write(self, data):
        self.written.append(bytes(data))

    def is_closing(self):
        return False

    def get_extra_info(self, name):
        return ("127.0.0.1", 40000) if name == "peername" else None

    def pause_reading(self):
        raise AssertionError("a connection reading small frames never pauses")

    def resume_reading(self):
        raise AssertionError("a connection reading small frames never pauses")


@pytest.fixture
def wired(broker):
    """(a Connection of a TcpServer on the test's namespace, its transport)."""
    broker.create_queue("q")
    loop = asyncio.new_event_loop()
    server = TcpServer(broker, port=0)
    server.loop = loop
    conn = Connection(server)
    transport = Transport()
    conn.connection_made(transport)
    yield conn, transport
    conn.connection_lost(None)
    server.queues.forget_all()
    loop.close()


def read(conn, data):
    """``data`` received in one read, as the loop hands it over."""
    buf = conn.get_buffer(-1)
    buf[: len(data)] = data
    conn.buffer_updated(len(data))


def counted_calls(conn, data) -> Counter:
    calls = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in COUNTED:
            calls[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        read(conn, data)
    finally:
        sys.setprofile(None)
    return calls


def replies(transport) -> list:
    dec = FrameDecoder()
    for data in transport.written:
        dec.feed(data)
    transport.written.clear()
    return list(dec.frames())


def exchange(conn, transport, msg_type, payload, msg_id):
    """(the calls the request took, its reply's payload); the reply must be OK."""
    calls = counted_calls(conn, encode_request(msg_type, msg_id, payload))
    (reply,) = replies(transport)
    assert (reply.type, reply.msg_id, reply.status) == (msg_type | REPLY_BIT, msg_id, Status.OK), reply.payload
    return calls, reply.payload


def test_each_hot_request_takes_at_most_its_calls(wired):
    conn, transport = wired
    q = conn.server.queue("q")
    took = {}
    for i in (1, 2):  # the first of each: handles attached, packers made; the second is counted
        took["PING"], _ = exchange(conn, transport, MsgType.PING, None, i)
        took["PRODUCE"], produced = exchange(conn, transport, MsgType.PRODUCE, {"queue": "q", "body": b"m%d" % i}, i)
        took["PRODUCE_BATCH"], batch = exchange(conn, transport, MsgType.PRODUCE_BATCH,
                                                {"queue": "q", "messages": [{"body": b"b"}] * 4}, i)
        assert len(batch["ids"]) == 4 and q.stats().ready == 5
        took["CONSUME"], got = exchange(conn, transport, MsgType.CONSUME, {"queue": "q", "max": 1}, i)
        (delivery,) = got["messages"]
        assert (delivery["id"], delivery["body"]) == (produced["id"], b"m%d" % i)
        took["ACK"], acked = exchange(conn, transport, MsgType.ACK, {"queue": "q", "deliveries": [delivery["delivery"]]},
                                      i)
        assert acked == {"acked": 1}
        _, got = exchange(conn, transport, MsgType.CONSUME, {"queue": "q", "max": 1}, i)
        took["NACK"], _ = exchange(conn, transport, MsgType.NACK,
                                   {"queue": "q", "deliveries": [got["messages"][0]["delivery"]]}, i)
        q.purge()
    assert q.stats().acked_total == 2 and len(conn.leases) == 0
    over = {name: (sum(calls.values()), MOST_CALLS[name], dict(calls)) for name, calls in took.items()
            if sum(calls.values()) > MOST_CALLS[name]}
    assert over == {}


def test_pipelined_pings_share_the_reads_work(wired):
    conn, transport = wired
    data = b"".join(encode_request(MsgType.PING, i) for i in range(1, 17))
    read(conn, data)  # warm
    replies(transport)
    calls = counted_calls(conn, data)
    assert [r.msg_id for r in replies(transport)] == list(range(1, 17))
    assert sum(calls.values()) <= 16 * MOST_CALLS_PIPELINED, dict(calls)


def test_a_pipelined_read_is_answered_in_one_write(wired):
    conn, transport = wired
    read(conn, b"".join(encode_request(MsgType.PING, i) for i in range(1, 17)))
    assert len(transport.written) == 1
    assert [r.msg_id for r in replies(transport)] == list(range(1, 17))
