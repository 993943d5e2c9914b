"""A waiting request over TCP is answered as soon as its data comes, whoever made it: a
local process writing shared memory, another TCP client, an append to a stream, a
lapsed lease (issue 28). A bound on the slow end of many tries, not a speed figure: the
speed is the bench's (python -m bench.tcp).

Each try: a TCP consumer in a child process waits (its request already at the server
for a few milliseconds, so a poller would have backed off), the parent makes the data
and notes the time, the child notes when its call returned; CLOCK_MONOTONIC is one clock
for both processes. The time runs from the return of the call that made the data.
"""

import multiprocessing as mp
import statistics
import time

import pytest

import shmq

pytestmark = pytest.mark.timing  # latency bounds: run with the machine to itself (README, not under -n)

TRIES = 60
WAITED_S = 0.01  # how long each request waits at the server before its data comes
# Below what a poller backing off to 2 ms gives (its median ~1.5 ms here): the median, and
# 9 of 10 tries. On this VM each wake-up of an idle CPU costs ~0.1 ms and a wake-up here
# chains three (the doorbell, the loop, the client): ~0.3-0.5 ms, more on a busy machine,
# whence the margin. (The slowest tenth are left to a busy 2-core machine's scheduler.)
MEDIAN_S = 0.001
P90_S = 0.002


def _consumer(url, kind, name, ready, out):
    """Wait TRIES times, over TCP, for data; send when each call returned."""
    with shmq.connect(url) as b:
        if kind == "queue":
            q = b.queue(name)
            take = lambda: q.get(timeout=10).ack()  # noqa: E731
        elif kind == "stream":
            s = b.stream(name)
            offset = [0]

            def take():
                rs = s.read(0, offset[0], timeout=10)
                assert rs
                offset[0] = rs[-1].offset + 1
        else:
            c = b.stream(name).consumer("g")
            c.poll(timeout=0)  # joined: it owns the partition

            def take():
                assert c.poll(timeout=10)
                c.commit()
        for _ in range(TRIES):
            ready.put(time.monotonic())
            take()
            out.put(time.monotonic())


def _latencies(url, kind, name, make):
    ctx = mp.get_context("fork")
    ready, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_consumer, args=(url, kind, name, ready, out), daemon=True)
    child.start()
    lat = []
    try:
        for i in range(TRIES):
            ready.get(timeout=20)
            time.sleep(WAITED_S)  # not a synchronization: the request must have waited this long
            make(i)
            t0 = time.monotonic()  # the data is there (a reply may have come first: then 0)
            lat.append(max(out.get(timeout=20) - t0, 0.0))
        child.join(20)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
    return sorted(lat)


def _check(lat):
    med, p90 = statistics.median(lat), lat[int(len(lat) * 0.9) - 1]
    assert med < MEDIAN_S and p90 < P90_S, f"median {med * 1e6:.0f} us, p90 {p90 * 1e6:.0f} us: {lat}"


@pytest.fixture
def srv(servers, broker):
    s = servers(broker.namespace, "--no-persist")
    yield s
    s.proc.terminate()
    s.proc.wait(10)


@pytest.mark.parametrize("lanes", [1, 4])
def test_a_local_put_wakes_a_waiting_tcp_get(srv, broker, lanes):
    q = broker.create_queue("q", lanes=lanes)
    _check(_latencies(srv.url, "queue", "q", lambda i: q.put(b"%d" % i)))
    assert q.stats().ready == q.stats().in_flight == 0


def test_a_tcp_put_wakes_a_waiting_tcp_get(srv, broker):
    broker.create_queue("q")
    with shmq.connect(srv.url) as b:
        q = b.queue("q")
        _check(_latencies(srv.url, "queue", "q", lambda i: q.put(b"%d" % i)))


def test_a_local_nack_wakes_a_waiting_tcp_get(srv, broker):
    q = broker.create_queue("q")
    held = []

    def make(i):
        held.pop().nack()

    for i in range(TRIES):
        q.put(b"%d" % i)
    held = [q.get(timeout=0) for _ in range(TRIES)][::-1]  # the server's consumer finds nothing ready
    _check(_latencies(srv.url, "queue", "q", make))


def test_a_local_append_wakes_a_waiting_tcp_read_and_poll(srv, broker):
    s = broker.create_stream("s", partitions=1)
    _check(_latencies(srv.url, "stream", "s", lambda i: s.append(b"%d" % i)))
    _check(_latencies(srv.url, "member", "s", lambda i: s.append(b"%d" % i)))


def test_a_lapsed_lease_wakes_a_waiting_tcp_get_when_it_lapses(srv, broker):
    """A lease that lapses (visibility timeout) is delivered again then, not a slice later."""
    q = broker.create_queue("q", visibility_timeout=0.2)
    q.put(b"x")
    with shmq.connect(srv.url) as b:
        rq = b.queue("q")
        leased = time.monotonic()
        q.get(timeout=0)  # leased here, never settled
        got = rq.get(timeout=5)
        lapsed = time.monotonic() - leased
    assert got.body == b"x" and got.attempt == 2
    # a lapse nothing rings for is found by the line's next look, up to a doze slice (0.5 s)
    # later; 0.1 s leaves a busy 2-core VM's scheduler room (it took 0.23 s once after the -n 2 run)
    assert 0.2 <= lapsed < 0.2 + 0.1, lapsed


def test_a_local_rebalance_wakes_a_waiting_tcp_poll(srv, broker):
    """A TCP member waits on its empty partition; the local member that owns the other one
    leaves: the waiting POLL gets that partition's record at once, not a slice later."""
    import threading

    s = broker.create_stream("s", partitions=2)
    local = s.consumer("g")
    local.poll(timeout=0)  # joined first: rank 0, partition 0 once another joins
    s.append(b"x", partition=0)
    got = []
    with shmq.connect(srv.url) as b:
        remote = b.stream("s").consumer("g")
        remote.poll(timeout=0)  # joined: partition 1, empty
        assert remote.assignment() == [1]
        t = threading.Thread(target=lambda: got.append((remote.poll(timeout=10), time.monotonic())))
        t.start()
        time.sleep(WAITED_S * 5)  # not a synchronization: the POLL must have waited this long
        local.close()
        left = time.monotonic()
        t.join(15)
        assert not t.is_alive()
    (records, when), = got
    assert [r.value for r in records] == [b"x"]
    assert when - left < 0.05, when - left


def test_a_kafka_produce_wakes_a_waiting_tcp_read(servers, broker):
    """The Kafka port's appends owe no post to the server's doorbells (``waits.serving``):
    the DEADBEEF port's waiting READs are served by the same loop (``AttachedHandles.join``)."""
    import re

    from kafka import KafkaProducer

    srv = servers(broker.namespace, "--no-persist", "--no-auth", "--kafka-port", "0")
    port = int(re.search(r"kafka listener on \S+:(\d+)", next(x for x in srv.log if "kafka listener on" in x))
               .group(1))
    broker.create_stream("s", partitions=1)
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", linger_ms=0)
    try:
        _check(_latencies(srv.url, "stream", "s", lambda i: producer.send("s", b"%d" % i, partition=0).get(10)))
    finally:
        producer.close(5)
        srv.proc.terminate()
        srv.proc.wait(10)
