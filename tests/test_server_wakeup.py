"""A waiting request over TCP is answered as soon as its data comes, whoever made it: a
local process writing shared memory, another TCP client, an append to a stream, a
lapsed lease (issue 28). A bound on the slow end of many tries, not a speed figure: the
speed is the bench's (python -m bench.tcp).

Each try: a TCP consumer in a child process waits (its request already at the server
for a few milliseconds, so a poller would have backed off), the parent makes the data
and notes the time, the child notes when its call returned; CLOCK_MONOTONIC is one clock
for both processes. The time runs from the return of the call that made the data.

The bound follows the machine: every try is paired with one of the same call made when
its data is already there, after the same idle wait (``ready``), which costs what the
waiting call costs but its wake-up. A woken request is one hop more (the doorbell's
thread hands the look to the loop): here ~0.1 ms of a 0.9-1.0 ms median. A poller
backing off to 2 ms adds half its step to the median, ~1 ms, and nearly all of it to
the slow tenth, on any machine; a doze slice (no doorbell at all) adds up to 0.5 s.
"""

import multiprocessing as mp
import statistics
import time

import pytest

import shmq

pytestmark = pytest.mark.timing  # latency bounds: run with the machine to itself (README, not under -n)

TRIES = 60
WAITED_S = 0.01  # how long each request waits at the server before its data comes
# Over the same call with its data there (medians, and the slowest tenth's edges): below
# the ~1 ms a 2 ms poller adds to the median, and the ~1.8 ms it adds at the slow tenth.
# A wake-up chains three wake-ups of idle CPUs (the doorbell, the loop, the client), one
# more than the paired call; the margin is that hop's on a slow, busy 2-core VM.
MEDIAN_OVER_S = 0.0005
P90_OVER_S = 0.001


def _consumer(url, kind, name, ready, go, out):
    """TRIES times, over TCP: wait for data and send when the call returned; then, once
    told the data is there, idle as long, call, and send how long the call took."""
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
            go.get(timeout=20)  # the data is there
            time.sleep(WAITED_S)  # not a synchronization: idle as long as a waiting call
            began = time.monotonic()
            take()
            out.put(time.monotonic() - began)


def _latencies(url, kind, name, make):
    """(the woken calls' times, the paired calls' with their data there), each sorted;
    ``make(i)`` makes one datum, i from 0 to 2 * TRIES."""
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_consumer, args=(url, kind, name, ready, go, out), daemon=True)
    child.start()
    lat, paired = [], []
    try:
        for i in range(TRIES):
            ready.get(timeout=20)
            time.sleep(WAITED_S)  # not a synchronization: the request must have waited this long
            make(2 * i)
            t0 = time.monotonic()  # the data is there (a reply may have come first: then 0)
            lat.append(max(out.get(timeout=20) - t0, 0.0))
            make(2 * i + 1)
            go.put(None)
            paired.append(out.get(timeout=20))
        child.join(20)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
    return sorted(lat), sorted(paired)


def _check(times):
    lat, paired = times
    (med, p90), (base_med, base_p90) = ((statistics.median(t), t[int(len(t) * 0.9) - 1]) for t in (lat, paired))
    assert med < base_med + MEDIAN_OVER_S and p90 < base_p90 + P90_OVER_S, (
        f"woken: median {med * 1e6:.0f} us, p90 {p90 * 1e6:.0f} us; with the data there: median "
        f"{base_med * 1e6:.0f} us, p90 {base_p90 * 1e6:.0f} us: {[round(x * 1e6) for x in lat]}")


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

    for i in range(2 * TRIES):
        q.put(b"%d" % i)
    held = [q.get(timeout=0) for _ in range(2 * TRIES)][::-1]  # the server's consumer finds nothing ready
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
