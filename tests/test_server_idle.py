"""The server's idle timeout (docs/PROTOCOL.md, Limits): a connection that holds nothing
is closed once quiet that long; one that holds deliveries or group members is not idle,
however quiet, so a live worker never loses its lease to it.

Strategy: a real ``shmq server`` with ``--idle-timeout 0.5`` and, beside the quiet
holder, a raw connection that holds nothing, opened after the holder's last request.
The server closing that one (EOF, waited on with a bound) is the proof that the holder
has been quiet past the timeout too; then the holder's next call must work on the same
connection, its lease and its membership intact.
"""

import time

import pytest

import shmq
from shmq.protocol import MsgType, Status, encode_request
from tests._wait import wait_for
from tests.test_server_limits import TOKEN, _closed_after, _read_frames, _sock, start_server  # noqa: F401 (a fixture)

IDLE_S = 0.5


def _idle_closes(srv) -> int:
    """How many connections the server has logged closing as idle."""
    return sum(f"idle for {IDLE_S:g}s; closing" in line for line in srv.log)


def _outlive_an_idle_one(srv):
    """Open a connection that holds nothing and wait until the idle timeout closes it (and
    the server has logged that)."""
    before = _idle_closes(srv)
    connecting = time.monotonic()
    idle = _sock(srv.port)
    took = _closed_after(idle, 10, since=connecting)
    idle.close()
    assert took is not None and IDLE_S <= took < IDLE_S + 2.0
    wait_for(lambda: _idle_closes(srv) > before, what="the idle close logged")


def test_a_quiet_worker_keeps_its_lease_past_the_idle_timeout(start_server, broker):
    q = broker.create_queue("jobs", visibility_timeout=30)
    q.put(b"long job")
    srv = start_server("--idle-timeout", str(IDLE_S))
    with shmq.connect(srv.url, token=TOKEN) as worker:
        d = worker.queue("jobs").get(timeout=5)
        d.extend(60)  # the worker's last request until its ack
        quiet_since = time.monotonic()
        _outlive_an_idle_one(srv)
        assert time.monotonic() - quiet_since > IDLE_S
        with shmq.connect(srv.url, token=TOKEN) as other, pytest.raises(shmq.QueueEmpty, match="'jobs' is empty"):
            other.queue("jobs").get(timeout=0)  # still leased: no one else takes it
        d.ack()  # before: DeliveryExpired, the connection closed and the message ready again
        stats = q.stats()
        assert (stats.ready, stats.in_flight, stats.acked_total, stats.redelivered_total) == (0, 0, 1, 0)
    assert _idle_closes(srv) == 1  # the connection that held nothing, and only it
    assert not any("closed holding" in line for line in srv.log)


def test_a_quiet_group_member_stays_in_its_group(start_server, broker):
    broker.create_stream("events", partitions=2)
    srv = start_server("--idle-timeout", str(IDLE_S))
    with shmq.connect(srv.url, token=TOKEN) as b:
        c = b.stream("events").consumer("g")
        assert sorted(c.assignment()) == [0, 1]
        _outlive_an_idle_one(srv)
        assert sorted(c.assignment()) == [0, 1]  # before: BrokerUnavailable, it left with its connection
        assert b.stream("events").groups() == ["g"]
    assert _idle_closes(srv) == 1


def test_a_connection_is_idle_again_once_it_holds_nothing(start_server, broker):
    """Holding a lease stops the idle clock; settling it (a request) starts it again, and a
    connection that holds nothing is closed as before, nothing sent."""
    q = broker.create_queue("jobs", visibility_timeout=30)
    q.put(b"job")
    srv = start_server("--idle-timeout", str(IDLE_S))
    s = _sock(srv.port)
    s.sendall(encode_request(MsgType.CONSUME, 1, {"queue": "jobs", "max": 1}))
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status, len(f.payload["messages"])) == (1, Status.OK, 1)
    _outlive_an_idle_one(srv)
    acking = time.monotonic()
    s.sendall(encode_request(MsgType.ACK, 2, {"queue": "jobs", "deliveries": [f.payload["messages"][0]["delivery"]]}))
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status, f.payload) == (2, Status.OK, {"acked": 1})
    took = _closed_after(s, 10, since=acking)  # nothing held now: idle, closed, no frame sent
    s.close()
    assert took is not None and IDLE_S <= took < IDLE_S + 2.0
    wait_for(lambda: _idle_closes(srv) == 2, what="the second idle close logged")
    assert (q.stats().ready, q.stats().acked_total) == (0, 1)
