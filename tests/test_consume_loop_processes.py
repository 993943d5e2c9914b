"""The consume loop (``q.messages()``) in real processes: consumers in children ack every
message exactly once, except those the application rejects or nacks itself, while a
producer waits for the room their acks make; and a consumer
SIGKILLed with a delivery in hand loses nothing (the liveness check gives it back). On the
C paths and the pure-Python ones."""

import os
import signal

import pytest

from shmq.engine.shm import cpaths
from tests import _loop_workers as w
from tests._processes import WORKERS


@pytest.fixture(params=["fast", "pure"])
def impl(request):
    if request.param == "fast" and not cpaths.FAST:
        pytest.skip("the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
    return request.param


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


@pytest.mark.parametrize("consumers", [1, 2])
def test_loops_in_children_ack_every_message_exactly_once(broker, tmp_path, impl, consumers):
    n = 3000
    q = broker.create_queue("q", max_bytes=4096, visibility_timeout=120)  # ~40 messages: the producer waits
    outs = [tmp_path / f"c{i}" for i in range(consumers)]
    procs = [WORKERS.Process(target=w.loop_consumer, args=(broker.namespace, "q", impl, str(o))) for o in outs]
    for p in procs:
        p.start()
    try:
        for i in range(n):
            q.put(b"m%d" % i, timeout=60)  # room comes from the loops' acks, which wake this producer
        for _ in procs:
            q.put(b"stop", timeout=60)
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * consumers
    finally:
        _stop(procs)
    handled = [o.read_text().split() for o in outs]
    rejected = [i for i in range(n) if w.settled_by_app(i, 1) == "reject"]
    nacked = [i for i in range(n) if w.settled_by_app(i, 1) == "nack"]  # handled twice: nacked, then acked
    want = [f"m{i}" for i in range(n) for _ in range(2 if i in nacked else 1)]
    if consumers == 1:
        assert handled[0] == want  # in order, a nacked message again at once
    assert sorted(sum(handled, [])) == sorted(want)
    s = q.stats()
    assert (s.ready, s.in_flight, s.bytes_used) == (0, 0, 0)
    # every message acked once by a loop, but those the application rejected; the stops too
    assert (s.acked_total, s.dead_lettered_total, s.redelivered_total) == (
        n - len(rejected) + consumers, len(rejected), len(nacked))
    q.close()


def test_a_consumer_killed_in_the_loop_loses_nothing(broker, tmp_path, impl):
    n = 200
    q = broker.create_queue("q", max_bytes=64 * 1024, visibility_timeout=120)  # no lapse: the holder's death
    q.put_many([b"m%d" % i for i in range(n)])
    assert w.settled_by_app(100, 1) is None
    rejected = [i for i in range(100) if w.settled_by_app(i, 1) == "reject"]
    nacked = [i for i in range(100) if w.settled_by_app(i, 1) == "nack"]
    held = WORKERS.Event()
    out = tmp_path / "c"
    p = WORKERS.Process(target=w.loop_consumer, args=(broker.namespace, "q", impl, str(out), held, b"m100"))
    p.start()
    try:
        assert held.wait(60)
        s = q.stats()
        # m0..m99 acked by the loop's steps, but those the application rejected; m100 in hand
        assert (s.in_flight, s.acked_total, s.dead_lettered_total, s.redelivered_total) == (
            1, 100 - len(rejected), len(rejected), len(nacked))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
    finally:
        _stop([p])
    assert out.read_text().split() == [f"m{i}" for i in range(101) for _ in range(2 if i in nacked else 1)]
    got = []
    with q.messages(timeout=30) as loop:  # the dead holder's delivery comes back at a liveness check
        for d in loop:
            got.append((d.body, d.attempt))
            if len(got) == n - 100:
                break
    assert sorted(got) == sorted([(b"m100", 2)] + [(b"m%d" % i, 1) for i in range(101, n)])
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, n - len(rejected), len(nacked) + 1)
    q.close()
