"""consume(prefetch=N) over TCP: deliveries pushed by the server (SUBSCRIBE / DELIVER /
CANCEL), the cap on un-acked pushes, what a cancel or a dead consumer gives back,
pipelined acks (ack(wait=False)), and bad input."""

import asyncio
import os
import signal
import socket
import time

import pytest

import shmq
from shmq.client.aio import connect as aio_connect
from shmq.protocol import REPLY_BIT, FrameDecoder, MsgType, PushType, Status, encode_request
from tests._processes import WORKERS
from tests._wait import exited, wait_for

N = 400


# ------------------------------------------------------------------ processes (tests._processes)
def _producer(url, qname, count):
    with shmq.connect(url) as b:
        q = b.queue(qname)
        for i in range(count):
            q.put(b"m%d" % i)
        q.put(b"stop")
        q.put(b"stop")


def _consumer(url, qname, prefetch, out_path, pipelined):
    """Ack everything it gets; log each body once acked; stop at the first b"stop"."""
    with shmq.connect(url) as b, open(out_path, "w") as out:
        q = b.queue(qname)
        with q.consume(prefetch=prefetch) as it:
            for d in it:
                if pipelined:
                    d.ack(wait=False)
                else:
                    d.ack()
                out.write(d.body.decode() + "\n")
                out.flush()
                if d.body == b"stop":
                    break
        b.ping()  # the acks and the CANCEL were sent before it: handled before its reply


def _holder(url, qname, prefetch, ready):
    """Subscribe, take one delivery, say so, then wait to be killed."""
    b = shmq.connect(url)
    it = b.queue(qname).consume(prefetch=prefetch)
    next(it)
    ready.set()
    time.sleep(600)  # killed long before


# ------------------------------------------------------------------ tests
def test_every_message_acked_exactly_once_by_two_consumer_processes(broker, tcp_server, tmp_path):
    broker.create_queue("jobs")
    ctx = WORKERS
    outs = [tmp_path / "c0.txt", tmp_path / "c1.txt"]
    procs = [ctx.Process(target=_consumer, args=(tcp_server.url, "jobs", 16, str(outs[0]), True)),
             ctx.Process(target=_consumer, args=(tcp_server.url, "jobs", 5, str(outs[1]), False)),
             ctx.Process(target=_producer, args=(tcp_server.url, "jobs", N))]
    with exited(procs):
        for p in procs:
            p.start()
    got = [line for o in outs for line in o.read_text().split()]
    assert sorted(x for x in got if x != "stop") == sorted(f"m{i}" for i in range(N))  # each once, none lost
    assert got.count("stop") == 2
    s = broker.queue("jobs").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, N + 2)


def test_never_more_than_prefetch_unacked(broker, tcp_server):
    broker.create_queue("jobs")
    local = broker.queue("jobs")
    local.put_many([b"x"] * 50)
    with shmq.connect(tcp_server.url) as b:
        it = b.queue("jobs").consume(prefetch=7)
        first = next(it)
        wait_for(lambda: local.stats().in_flight == 7, what="7 pushed")
        b.ping()  # a round trip later, still 7: the server waits for acks
        assert local.stats().in_flight == 7
        seen = [first]
        for _ in range(20):
            d = next(it)
            seen.append(d)
            assert local.stats().in_flight <= 7
            seen[-2].ack()
            assert local.stats().in_flight <= 7
        it.close()
        assert len({d.id for d in seen}) == len(seen)


def test_cancel_gives_back_what_was_pushed_and_not_handed_out(broker, tcp_server):
    broker.create_queue("jobs")
    local = broker.queue("jobs")
    local.put_many([b"m%d" % i for i in range(20)])
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("jobs")
        it = q.consume(prefetch=10)
        d1, d2 = next(it), next(it)
        d1.ack()
        wait_for(lambda: local.stats().in_flight == 10, what="the refill")
        it.close()
        s = q.stats()  # after the CANCEL on the same connection
        assert (s.in_flight, s.ready) == (1, 18)  # only d2, handed out and not acked, stays leased
        d2.ack()  # still ours after the cancel
        assert q.stats().in_flight == 0
        rest = q.get_many(64, timeout=5)
        assert sorted(d.body for d in rest) == sorted(b"m%d" % i for i in range(2, 20))
        assert {d.attempt for d in rest} == {1}  # a push never handed out was no attempt
        q.ack_many(rest)


def test_what_a_cancel_gives_back_is_ready_at_once_whatever_the_retry_policy(broker, tcp_server):
    broker.create_queue("jobs", retry_delay=3600)
    local = broker.queue("jobs")
    local.put_many([b"m%d" % i for i in range(5)])
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("jobs")
        it = q.consume(prefetch=5)
        next(it).ack()
        wait_for(lambda: local.stats().in_flight == 4, what="the pushes")
        it.close()
        s = q.stats()
        assert (s.ready, s.delayed, s.in_flight) == (4, 0, 0)


def test_breaking_out_of_the_loop_cancels(broker, tcp_server):
    broker.create_queue("jobs")
    local = broker.queue("jobs")
    local.put_many([b"x"] * 30)
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("jobs")
        for d in q.consume(prefetch=8):
            d.ack()
            break
        assert d.body == b"x"  # the delivery kept does not keep the iteration open
        s = q.stats()
        assert (s.ready, s.in_flight) == (29, 0)


def test_a_killed_consumers_pushed_messages_come_back(broker, tcp_server):
    broker.create_queue("jobs")
    local = broker.queue("jobs")
    local.put_many([b"x"] * 12)
    ctx = WORKERS
    ready = ctx.Event()
    p = ctx.Process(target=_holder, args=(tcp_server.url, "jobs", 10, ready))
    p.start()
    try:
        assert ready.wait(30)
        wait_for(lambda: local.stats().in_flight == 10, what="10 pushed")
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    finally:
        if p.is_alive():
            p.kill()
            p.join()
    wait_for(lambda: local.stats().ready == 12, what="the killed consumer's deliveries ready again")
    assert local.stats().in_flight == 0


def test_pipelined_acks_drain_the_queue(broker, tcp_server):
    broker.create_queue("jobs")
    broker.queue("jobs").put_many([b"m%d" % i for i in range(300)])
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("jobs")
        bodies = []
        with q.consume(prefetch=50) as it:
            for d in it:
                bodies.append(d.body)
                d.ack(wait=False)
                if len(bodies) == 300:
                    break
        s = q.stats()  # the acks and the CANCEL went out before this request
        assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 300)
        assert bodies == [b"m%d" % i for i in range(300)]


def test_a_failed_pipelined_ack_is_raised_by_a_later_call(broker, tcp_server):
    broker.create_queue("jobs", visibility_timeout=30)
    local = broker.queue("jobs")
    local.put(b"x")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("jobs")
        d = q.get(timeout=5, visibility_timeout=0.05)
        wait_for(lambda: local._housekeep() >= 0 and local.stats().ready == 1, what="the lease to lapse")
        d.ack(wait=False)  # returns at once; the server will refuse it
        with pytest.raises(shmq.DeliveryExpired, match="jobs#1 attempt 1 is no longer leased"):
            d.ack(wait=False)  # settled as far as this side knows
        b.ping()  # reads the ack's error reply
        with pytest.raises(shmq.DeliveryExpired):
            q.stats()  # the next call raises it (once), sending nothing
        assert q.stats().ready == 1


def test_the_server_ends_a_subscription_when_its_queue_is_deleted(broker, tcp_server):
    broker.create_queue("jobs")
    broker.queue("jobs").put(b"x")
    with shmq.connect(tcp_server.url) as b:
        it = b.queue("jobs").consume(prefetch=4)
        assert next(it).body == b"x"
        broker.delete_queue("jobs")
        with pytest.raises(shmq.QueueNotFound):
            next(it)
        with pytest.raises(StopIteration):
            next(it)
        b.ping()


def test_asyncio_consume_with_prefetch(broker, tcp_server):
    broker.create_queue("jobs")
    local = broker.queue("jobs")
    local.put_many([b"m%d" % i for i in range(100)])

    async def main():
        b = await aio_connect(tcp_server.url)
        try:
            q = await b.queue("jobs")
            got = []
            async with q.consume(prefetch=10) as it:
                async for d in it:
                    got.append(d.body)
                    await d.ack(wait=False)
                    if len(got) == 60:
                        break
            s = await q.stats()
            assert (s.ready, s.in_flight) == (40, 0)
            return got
        finally:
            await b.close()

    assert asyncio.run(main()) == [b"m%d" % i for i in range(60)]


# ------------------------------------------------------------------ bad input
def test_bad_prefetch_is_refused_before_sending(any_broker):
    any_broker.create_queue("jobs")
    q = any_broker.queue("jobs")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="prefetch must be a positive int"):
            q.consume(prefetch=bad)


def _raw(url):
    """A bare socket and ``call(type, payload, msg_id)`` -> its reply frame; pushes that
    come meanwhile are kept in ``call.pushes``."""
    host, port = url[len("tcp://"):].split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    dec = FrameDecoder()

    def next_frame():
        while (frame := dec.next_frame()) is None:
            dec.feed(s.recv(65536))
        return frame

    def call(msg_type, payload, msg_id=1):
        s.sendall(encode_request(msg_type, msg_id, payload))
        while (frame := next_frame()).msg_id != msg_id:
            call.pushes.append(frame)
        return frame

    call.pushes = []
    call.next_frame = next_frame
    return s, call


def test_bad_subscribe_and_cancel_get_error_replies(broker, tcp_server):
    broker.create_queue("jobs")
    s, call = _raw(tcp_server.url)
    with s:
        for prefetch in (0, -5):
            r = call(MsgType.SUBSCRIBE, {"queue": "jobs", "prefetch": prefetch})
            assert r.status == Status.BAD_REQUEST and "positive integer" in r.payload["error"]
        r = call(MsgType.SUBSCRIBE, {"queue": "jobs", "prefetch": 10**9})
        assert r.status == Status.BAD_REQUEST
        assert r.payload["error"] == ("SUBSCRIBE: prefetch must be at most 10000 (the server's --max-prefetch), "
                                      "not 1000000000")
        r = call(MsgType.SUBSCRIBE, {"queue": "nope", "prefetch": 1})
        assert r.status == Status.NO_SUCH_QUEUE
        r = call(MsgType.CANCEL, {"subscription": 123456})
        assert r.status == Status.BAD_REQUEST and "no subscription 123456" in r.payload["error"]
        ids = []
        for i in range(64):
            r = call(MsgType.SUBSCRIBE, {"queue": "jobs", "prefetch": 1}, msg_id=100 + i)
            assert r.status == Status.OK
            ids.append(r.payload["subscription"])
        r = call(MsgType.SUBSCRIBE, {"queue": "jobs", "prefetch": 1}, msg_id=999)
        assert r.status == Status.LIMIT_EXCEEDED and "too many subscriptions" in r.payload["error"]
        r = call(MsgType.CANCEL, {"subscription": ids[0], "delivered": 0}, msg_id=1000)
        assert r.status == Status.OK and r.payload == {"released": 0}


def test_a_push_is_a_deliver_frame_with_msg_id_0(broker, tcp_server):
    broker.create_queue("jobs")
    broker.queue("jobs").put(b"hello")
    s, call = _raw(tcp_server.url)
    with s:
        r = call(MsgType.SUBSCRIBE, {"queue": "jobs", "prefetch": 2})
        sid = r.payload["subscription"]
        frame = call.pushes.pop() if call.pushes else call.next_frame()
        assert (frame.type, frame.msg_id, frame.status) == (PushType.DELIVER | REPLY_BIT, 0, 0)
        assert frame.payload["subscription"] == sid
        (m,) = frame.payload["messages"]
        assert (m["body"], m["attempt"]) == (b"hello", 1)
        r = call(MsgType.ACK, {"queue": "jobs", "deliveries": [m["delivery"]]}, msg_id=2)
        assert r.payload == {"acked": 1}
