"""SIGKILL at random points: producers, consumers, a process holding the lock.
Afterwards the queue works at once and nothing whose put returned is lost."""

import os
import random
import signal
import time

import pytest

import shmq
from shmq.engine.shm.layout import I_REPAIRS
from tests import _workers as w
from tests._processes import WORKERS


def _kill(p):
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL


def _drain(q, timeout=5.0):
    """Everything left in the queue, acked; leases of dead processes must come back."""
    got = []
    while True:
        try:
            ds = q.get_many(256, timeout=timeout)
        except shmq.QueueEmpty:
            return got
        got += [bytes(d.body).rstrip(b".").decode() for d in ds]
        q.ack_many(ds)


def _lines(path):
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    return lines[:-1]  # a partial last line was cut by the kill: that put/ack never logged


def test_dead_consumers_leases_come_back_promptly(broker):
    q = broker.create_queue("q", visibility_timeout=300.0)
    q.put_many([b"%d" % i for i in range(10)])
    ready = WORKERS.Event()
    p = WORKERS.Process(target=w.hold_leases, args=(broker.namespace, "q", 10, ready))
    p.start()
    assert ready.wait(30)
    assert q.stats().in_flight == 10
    _kill(p)
    start = time.monotonic()
    ds = []
    while len(ds) < 10:
        ds += q.get_many(10, timeout=5.0)  # far less than the 300 s visibility timeout
    elapsed = time.monotonic() - start
    assert sorted(d.body for d in ds) == sorted(b"%d" % i for i in range(10))
    assert all(d.attempt == 2 for d in ds)
    q.ack_many(ds)
    assert elapsed < 5.0


@pytest.mark.parametrize("half_written", [False, True])
def test_lock_holder_killed_inside_the_lock(broker, half_written):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])
    ready = WORKERS.Event()
    p = WORKERS.Process(target=w.hold_lock, args=(broker.namespace, "q", ready, half_written))
    p.start()
    assert ready.wait(30)
    _kill(p)
    repairs = q._mq[I_REPAIRS]
    q.put(b"c")  # takes the lock at once: EOWNERDEAD, repair, go on
    assert q._mq[I_REPAIRS] == repairs + 1
    s = q.stats()
    assert (s.ready, s.in_flight) == (3, 0)
    assert [d.body for d in q.get_many(10, timeout=0)] == [b"a", b"b", b"c"]


def test_killed_waiters_do_not_leak_waiting_counts(broker):
    q = broker.create_queue("q", visibility_timeout=300.0)
    ready = WORKERS.Event()
    p = WORKERS.Process(target=w.hold_leases, args=(broker.namespace, "q", 1, ready))
    p.start()
    deadline = time.monotonic() + 30
    while q.stats().consumers_waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert q.stats().consumers_waiting == 1
    _kill(p)
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=1.2)  # our own waits run the liveness check
    assert q.stats().consumers_waiting == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "options", "laned", "memory"])
def test_random_sigkills_lose_nothing(broker, tmp_path, kind):
    """Producers and consumers SIGKILLed at random instants; with "options", on a queue
    with priority levels, and puts with priorities, groups and TTLs (the general take,
    the leveled one, and their repair); "laned", on a queue of 2 lanes (a producer and a
    consumer killed in each); "memory", with bodies of up to 100 KB in a ring of 32 chunks
    and a housekeeper giving memory back as fast as it can, killed too, so that processes
    die growing the ring and giving it back."""
    rnd = random.Random(1234)
    options = kind == "options"
    lanes = 2 if kind == "laned" else 1
    padded = kind == "memory"
    q = broker.create_queue("q", max_bytes=lanes * (2 << 20 if padded else 64 * 1024), visibility_timeout=300.0,
                            priorities=3 if options else 1, lanes=lanes)
    stop = w.StopFlag(WORKERS)  # (the producers polling it are killed at random)
    procs = {}
    counter = [0]

    def start(kind):
        counter[0] += 1
        tag = f"{kind}{counter[0]}"
        if kind == "p":
            p = WORKERS.Process(target=w.chaos_producer,
                              args=(broker.namespace, "q", tag, str(tmp_path / tag), stop, options, padded))
        elif kind == "h":
            p = WORKERS.Process(target=w.chaos_housekeeper, args=(broker.namespace, "q"))
        else:
            p = WORKERS.Process(target=w.chaos_consumer, args=(broker.namespace, "q", str(tmp_path / tag)))
        p.start()
        procs[tag] = p

    for kind in "ppcc" + ("h" if padded else ""):
        start(kind)
    for _ in range(40):
        before, deadline = q.stats().enqueued_total, time.monotonic() + 20
        while q.stats().enqueued_total < before + 25 and time.monotonic() < deadline:
            time.sleep(0.005)  # under load: real progress before each kill (polling it, with a bound)
        time.sleep(rnd.uniform(0.0, 0.15))  # the kill instant is random on purpose; nothing waits on it
        tag = rnd.choice(sorted(procs))
        _kill(procs.pop(tag))
        start(tag[0])
    stop.set()
    for tag, p in list(procs.items()):
        if tag[0] == "p":
            p.join(30)
            assert p.exitcode == 0
        else:
            _kill(p)
    produced, tried, acked = [], set(), []
    for path in tmp_path.iterdir():
        if path.name[0] == "h":
            continue
        if path.name[0] == "p":
            produced += _lines(path)
        else:
            for line in _lines(path):
                verb, body = line.split(" ")
                if verb == "try":
                    tried.add(body)
                else:
                    acked.append(body)
    drained = _drain(q)
    assert len(acked) == len(set(acked)), "a message was acked twice"
    assert not set(drained) & set(acked), "an acked message came back"
    missing = set(produced) - tried - set(drained)
    assert not missing, f"{len(missing)} messages whose put returned were lost"
    s = q.stats()
    assert (s.ready, s.in_flight, s.delayed, s.consumers_waiting, s.producers_waiting) == (0, 0, 0, 0, 0)
    assert len(produced) > (300 if padded else 1000)
    if padded:  # what a drained queue holds, a round or two later: its header
        q._housekeep()
        q._housekeep()
        assert q.stats().bytes_held == 128 * 1024
    # and the queue works at once
    q.put(b"after")
    assert q.get_nowait().body == b"after"


def test_a_lock_holder_killed_while_others_spin_and_sleep_on_the_lock(broker, tmp_path):
    """Processes whose C puts and gets find the lock held wait for it (a spin, then a sleep
    in the kernel); the holder is SIGKILLed; one waiter repairs (EOWNERDEAD) and every one
    finishes its work: nothing lost, nothing twice."""
    import psutil

    q = broker.create_queue("q")
    n, count = 3, 50
    ready = [WORKERS.Event() for _ in range(n)]
    go = WORKERS.Event()
    waiters = [WORKERS.Process(target=w.lock_waiter, args=(broker.namespace, "q", count, str(tmp_path / f"w{i}"),
                                                        ready[i], go)) for i in range(n)]
    for p in waiters:
        p.start()
    assert all(e.wait(30) for e in ready)
    held = WORKERS.Event()
    holder = WORKERS.Process(target=w.hold_lock, args=(broker.namespace, "q", held, False))
    holder.start()
    assert held.wait(30)
    go.set()
    deadline = time.monotonic() + 20  # every waiter blocked on the lock (asleep in the kernel)
    while not all(psutil.Process(p.pid).status() in (psutil.STATUS_SLEEPING, psutil.STATUS_DISK_SLEEP)
                  for p in waiters):
        assert time.monotonic() < deadline, "the waiters never went to sleep on the lock"
        time.sleep(0.005)  # polling a real condition, with a bound
    repairs = q._mq[I_REPAIRS]
    _kill(holder)
    for p in waiters:
        p.join(60)
        assert p.exitcode == 0
    assert q._mq[I_REPAIRS] == repairs + 1
    got = [line for i in range(n) for line in _lines(tmp_path / f"w{i}")]
    left = _drain(q, timeout=0)
    puts = {f"{p.pid}:{k}" for p in waiters for k in range(count)}
    assert sorted(got + left) == sorted(puts)  # every message once (the warm-ups were each taken at once)
    s = q.stats()
    assert (s.ready, s.in_flight, s.consumers_waiting, s.producers_waiting) == (0, 0, 0, 0)
