"""The one-exchange settle over TCP (issue 28): an ack sent without waiting leaves in the
same write as the next get, puts sent without waiting go as one PRODUCE_BATCH, and a
consumer SIGKILLed between its acks and its next get loses nothing."""

import multiprocessing as mp
import os
import signal
import time

import shmq
from shmq.client import remote
from shmq.protocol import FrameDecoder, MsgType
from tests._wait import wait_for


class _Writes:
    """The connection's socket, with the request types of each write it made noted."""

    def __init__(self, sock):
        self._sock = sock
        self.writes = []

    def sendall(self, data):
        dec = FrameDecoder(1 << 30)
        dec.feed(data)
        self.writes.append([MsgType(f.type) for f in dec.frames()])
        return self._sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _watched(b):
    link = b._link
    link.sock = _Writes(link.sock)
    return link.sock


def test_an_ack_without_waiting_leaves_with_the_next_get(tcp_server, broker, monkeypatch):
    monkeypatch.setattr(remote, "LINGER_S", 5.0)  # the flusher is not what this looks at
    q = broker.create_queue("q")
    q.put_many([b"a", b"b", b"c"])
    with shmq.connect(tcp_server.url) as b:
        rq = b.queue("q")
        socket = _watched(b)
        d = rq.get(timeout=5)
        d.ack(wait=False)
        d2 = rq.get(timeout=5)
        rq.ack_many([d2], wait=False)
        d3 = rq.get(timeout=5)
        d3.ack()
        assert socket.writes == [[MsgType.CONSUME], [MsgType.ACK, MsgType.CONSUME], [MsgType.ACK, MsgType.CONSUME],
                                 [MsgType.ACK]]
        assert [d.body, d2.body, d3.body] == [b"a", b"b", b"c"]
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


def test_an_ack_without_waiting_is_written_within_a_linger_when_no_call_follows(tcp_server, broker):
    q = broker.create_queue("q")
    q.put(b"a")
    with shmq.connect(tcp_server.url) as b:
        b.queue("q").get(timeout=5).ack(wait=False)
        wait_for(lambda: q.stats().acked_total == 1, timeout=5, what="the ack, written by the flusher")
        assert q.stats().in_flight == 0


def test_puts_without_waiting_go_as_one_batch_in_order(tcp_server, broker, monkeypatch):
    monkeypatch.setattr(remote, "LINGER_S", 5.0)
    q = broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        rq = b.queue("q")
        socket = _watched(b)
        for i in range(100):
            rq.put(b"%d" % i, wait=False)
        rq.put(b"p", wait=False, priority=0, delay=0.5)  # other options: a batch of its own
        rq.flush()
        assert socket.writes == [[MsgType.PRODUCE_BATCH, MsgType.PRODUCE, MsgType.PING]]
    assert [d.body for d in q.get_many(200, timeout=0)] == [b"%d" % i for i in range(100)]


def test_puts_without_waiting_are_written_before_the_handle_closes(tcp_server, broker):
    q = broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        for i in range(10):
            b.queue("q").put(b"%d" % i, wait=False)
    wait_for(lambda: q.stats().ready == 10, timeout=5, what="the ten puts")


def _consume_and_ack(url, acked):
    """Get and ack (without waiting) for ever, saying each body acked."""
    with shmq.connect(url) as b:
        q = b.queue("q")
        while True:
            d = q.get(timeout=30)
            d.ack(wait=False)
            acked.send(d.body)


def test_a_consumer_killed_between_its_acks_and_its_next_get_loses_nothing(servers, broker):
    """SIGKILL lands wherever it lands: what the server saw acked is gone, every other
    message is ready again (the killed connection's leases given back), none twice."""
    srv = servers(broker.namespace, "--no-persist")
    q = broker.create_queue("q", visibility_timeout=300)
    n = 2000
    q.put_many([b"%d" % i for i in range(n)])
    ctx = mp.get_context("fork")
    for_parent, for_child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_consume_and_ack, args=(srv.url, for_child), daemon=True)
    p.start()
    try:
        acked = []
        while len(acked) < n // 2:  # halfway, mid-stream
            acked.append(for_parent.recv())
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        while for_parent.poll(0):
            acked.append(for_parent.recv())
    finally:
        if p.is_alive():
            p.kill()
            p.join(5)
    wait_for(lambda: q.stats().in_flight == 0, timeout=10, what="the killed connection's leases back")
    left = []
    while True:
        ds = q.get_many(500, timeout=0) if q.stats().ready else []
        if not ds:
            break
        left += [d.body for d in ds]
        q.ack_many(ds)
    s = q.stats()
    assert len(left) == len(set(left)), "a message ready twice"
    assert set(left) | set(acked) == {b"%d" % i for i in range(n)}, "a message lost"
    assert s.acked_total == n  # each acked once: by the child (as the server saw it) or here
    assert n - len(left) <= len(acked)  # what the server saw acked, the child had acked
    srv.proc.terminate()
    srv.proc.wait(10)


def test_the_asyncio_client_sends_an_ack_without_waiting_with_the_next_get(tcp_server, broker):
    import asyncio

    from shmq.client import aio

    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])

    async def main():
        async with await aio.connect(tcp_server.url) as b:
            rq = await b.queue("q")
            writes = []
            writer = b._link.writer
            write = writer.write

            def noted(data):
                dec = FrameDecoder(1 << 30)
                dec.feed(data)
                writes.append([MsgType(f.type) for f in dec.frames()])
                write(data)

            writer.write = noted
            d = await rq.get(timeout=5)
            await d.ack(wait=False)
            d2 = await rq.get(timeout=5)
            await d2.ack()
            for i in range(50):
                await rq.put(b"%d" % i, wait=False)
            await rq.flush()
            return writes

    writes = asyncio.run(main())
    assert writes == [[MsgType.CONSUME], [MsgType.ACK, MsgType.CONSUME], [MsgType.ACK],
                      [MsgType.PRODUCE_BATCH, MsgType.PING]]
    assert (q.stats().acked_total, q.stats().ready) == (2, 50)


def test_acks_taken_along_by_the_next_gets_leave_the_flusher_asleep(tcp_server, broker, monkeypatch):
    """While posts keep coming (an ack after each get, taken along by the next), the flusher
    looks once a linger and is not woken again: a post wakes it only when it went idle."""
    monkeypatch.setattr(remote, "LINGER_S", 0.2)
    q = broker.create_queue("q")
    q.put_many([b"x"] * 100_000)
    with shmq.connect(tcp_server.url) as b:
        rq = b.queue("q")
        rq.get(timeout=5).ack(wait=False)  # the first post starts the flusher and wakes it
        flusher = b._link.flusher
        wakes, wake = [], flusher.due.set
        flusher.due.set = lambda: wakes.append(1) or wake()
        end, n = time.monotonic() + 1.0, 1
        while time.monotonic() < end:  # five lingers' worth of posts
            rq.get(timeout=5).ack(wait=False)
            n += 1
        rq.get(timeout=5).ack()
    assert len(wakes) <= 1, len(wakes)  # (one: a get that stalled a whole linger, on a busy machine)
    assert q.stats().acked_total == n + 1
