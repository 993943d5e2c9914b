"""Request/reply (engine/queues/rpc.py, the REQUEST handler): a worker process answers, a
timeout raises RequestTimeout and leaves no reply queue, a late reply is dropped, and
the reply queue of a requester killed while it waited is removed (by the next request,
the housekeeper, or, over TCP, when its connection closes)."""

import os
import signal
import time

import pytest

import shmq
from shmq.engine.queues.rpc import REPLY_PREFIX, owner_of, reply_queue_name
from shmq.server.housekeeper import Housekeeper
from tests import _exchange_workers as workers
from tests._processes import WORKERS
from tests._wait import wait_for as _until


def _reply_queues(b):
    return [n for n in b.list_queues() if n.startswith(REPLY_PREFIX)]


def test_request_reply_with_a_worker_process(any_broker, broker):
    any_broker.create_queue("rpc")
    w = WORKERS.Process(target=workers.worker, args=(broker.namespace, "rpc", 3))
    w.start()
    try:
        assert [any_broker.request("rpc", f"job {i}".encode(), timeout=30) for i in range(3)] == \
            [b"JOB 0", b"JOB 1", b"JOB 2"]
    finally:
        w.join(30)
    assert w.exitcode == 0
    assert any_broker.list_queues() == ["rpc"]  # every reply queue went


def test_a_remote_worker_answers(tcp_server, broker):
    broker.create_queue("rpc")
    w = WORKERS.Process(target=workers.worker, args=(tcp_server.url, "rpc", 1))
    w.start()
    try:
        assert broker.request("rpc", b"over tcp", timeout=30) == b"OVER TCP"
    finally:
        w.join(30)
    assert w.exitcode == 0


def test_the_request_carries_where_to_answer(broker):
    q = broker.create_queue("rpc")
    with pytest.raises(shmq.RequestTimeout):
        broker.request("rpc", b"x", headers={"user": "u"}, timeout=0)
    d = q.get(timeout=0)
    assert d.headers["user"] == "u"
    assert d.headers["x-reply-to"].startswith(REPLY_PREFIX)
    assert len(d.headers["x-correlation-id"]) == 32
    assert d.reply(b"too late") in (None, False)  # its requester gave up: dropped (no queue to pile up in)
    assert broker.list_queues() == ["rpc"]
    d.ack()


def test_timeout_raises_request_timeout_and_leaves_no_queue(any_broker):
    any_broker.create_queue("rpc")
    t0 = time.monotonic()
    with pytest.raises(shmq.RequestTimeout, match="no reply to the request on queue 'rpc' within 0.2s") as e:
        any_broker.request("rpc", b"nobody listens", timeout=0.2)
    assert time.monotonic() - t0 >= 0.2
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, shmq.ShmqError)
    assert any_broker.list_queues() == ["rpc"]
    d = any_broker.queue("rpc").get(timeout=0)  # the request itself stays for a worker
    assert not d.reply(b"late")  # dropped: its reply queue is gone
    d.ack()
    assert any_broker.list_queues() == ["rpc"]


def test_errors(any_broker):
    with pytest.raises(shmq.QueueNotFound):
        any_broker.request("nope", b"x", timeout=1)
    assert any_broker.list_queues() == []
    q = any_broker.create_queue("plain")
    q.put(b"no reply wanted")
    d = q.get(timeout=1)
    with pytest.raises(ValueError, match="asked for no reply"):
        d.reply(b"x")
    d.ack()


def test_reply_queue_names_say_their_owner():
    name = reply_queue_name()
    pid, start = owner_of(name)
    assert pid == os.getpid() and start > 0
    assert owner_of("orders") is None and owner_of("_rpc.x.1.2") is None


def test_a_killed_requesters_reply_queue_goes_at_the_next_request(broker):
    broker.create_queue("rpc")
    p = WORKERS.Process(target=workers.requester, args=(broker.namespace, "rpc"))
    p.start()
    _until(lambda: _reply_queues(broker), what="the requester's reply queue")
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert len(_reply_queues(broker)) == 1  # still there: nobody looked yet
    with pytest.raises(shmq.RequestTimeout):
        broker.request("rpc", b"next", timeout=0)
    assert _reply_queues(broker) == []


def test_the_housekeeper_removes_a_dead_requesters_reply_queue(broker):
    broker.create_queue("rpc")
    p = WORKERS.Process(target=workers.requester, args=(broker.namespace, "rpc"))
    p.start()
    _until(lambda: _reply_queues(broker), what="the requester's reply queue")
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    hk = Housekeeper(broker)
    try:
        hk.run_once()
    finally:
        hk.close()
    assert _reply_queues(broker) == []


def test_over_tcp_the_reply_queue_goes_with_the_connection(tcp_server, broker):
    broker.create_queue("rpc")
    p = WORKERS.Process(target=workers.requester, args=(tcp_server.url, "rpc"))
    p.start()
    _until(lambda: _reply_queues(broker), what="the server's reply queue for the request")
    (name,) = _reply_queues(broker)
    assert owner_of(name)[0] == os.getpid()  # the server's (here, a thread of this process)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    _until(lambda: not _reply_queues(broker), what="the reply queue removed when the connection closed")
