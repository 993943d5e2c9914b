"""The waiter accounting on a plain word array: sleepers count themselves, wakers post
at most one per sleeper not yet posted, and a sleeper that took a post gives it back."""

import contextlib
import threading
import time

import pytest

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm import layout as L
from shmq.engine.shm import waits
from shmq.engine.shm.segment import create_semaphore, open_semaphore, unlink_semaphore
from tests._processes import WORKERS
from tests._wait import Alarm, alarm_in, drain, in_thread, wait_for


def _words():
    return memoryview(bytearray(L.PROCS_OFF + 4 * L.PROC_SIZE)).cast("Q")


def _slot(mq, slot, side):
    return mq[((L.PROCS_OFF + slot * L.PROC_SIZE) >> 3) + side[2]]


def test_posts_owed_never_exceed_the_sleepers_not_yet_posted():
    mq = _words()
    assert waits.owed_posts(mq, waits.CONSUMERS, 5) == 0  # nobody sleeps
    waits.register(mq, 0, waits.CONSUMERS)
    waits.register(mq, 1, waits.CONSUMERS)
    assert (mq[L.I_CWAIT], _slot(mq, 0, waits.CONSUMERS), _slot(mq, 1, waits.CONSUMERS)) == (2, 1, 1)
    assert waits.owed_posts(mq, waits.CONSUMERS, 1) == 1
    assert waits.owed_posts(mq, waits.CONSUMERS, 5) == 1  # one sleeper left to post
    assert waits.owed_posts(mq, waits.CONSUMERS, 5) == 0
    assert mq[L.I_CPOSTED] == 2
    assert waits.owed_posts(mq, waits.PRODUCERS, 5) == 0  # the other side is counted apart


def test_a_woken_sleeper_takes_its_post_back_and_the_last_one_clears_them():
    mq = _words()
    for slot in (0, 1):
        waits.register(mq, slot, waits.PRODUCERS)
    waits.owed_posts(mq, waits.PRODUCERS, 2)
    waits.unregister(mq, 0, waits.PRODUCERS, 2)  # woken by a post
    assert (mq[L.I_PWAIT], mq[L.I_PPOSTED], _slot(mq, 0, waits.PRODUCERS)) == (1, 1, 0)
    waits.unregister(mq, 1, waits.PRODUCERS, 1)  # timed out; the last sleeper: stale posts are cleared
    assert (mq[L.I_PWAIT], mq[L.I_PPOSTED]) == (0, 0)


def test_a_sleep_slice_ends_by_the_deadline_or_the_queues_next_deadline(namespace):
    name = f"/shmq.{namespace}.test"
    create_semaphore(name).close()
    sem = open_semaphore(name)
    try:
        assert waits.sleep_slice(sem, 0, 0) == 1  # the deadline is now: no wait
        assert waits.sleep_slice(sem, None, 0, next_due=0) == 1  # housekeeping is due: at once too
        sem.release()
        assert waits.sleep_slice(sem, None, 0) == 2  # a post ends it
    finally:
        unlink_semaphore(name)
        sem.close()


@pytest.mark.skipif(cpaths.Sem is None, reason="posix_ipc's wait (the pure-Python build) loses a handler's exception")
def test_a_signal_handlers_exception_ends_a_blocking_wait_and_leaves_no_sleeper(broker):
    """An alarm's exception (Celery's soft time limit, a signal-based timeout) raises out of
    a blocking get, a put into a full queue and a stream's poll at once, not when the
    wait's timeout passes; the waiter is uncounted."""
    q = broker.create_queue("q", max_bytes=4096)
    consumer = broker.create_stream("s", partitions=1).consumer("g")
    try:
        for wait in (lambda: q.get(timeout=30), lambda: consumer.poll(timeout=30), "fill",
                     lambda: q.put(b"x" * 500, timeout=30)):
            if wait == "fill":
                while True:
                    try:
                        q.put_nowait(b"x" * 500)
                    except shmq.QueueFull:
                        break
                continue
            started = time.monotonic()
            with pytest.raises(Alarm), alarm_in(0.1):
                wait()
            assert time.monotonic() - started < 10  # the alarm ended it, not the 30 s
        assert (q._mq[L.I_CWAIT], q._mq[L.I_PWAIT]) == (0, 0)
    finally:
        consumer.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_seconds_are_checked(bad):
    with pytest.raises((TypeError, ValueError)):
        waits.seconds_ns(bad, "timeout")


def test_gets_and_puts_that_time_out_leave_no_sleeper_counted(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    for timeout in (0, 0.05):
        with pytest.raises(shmq.QueueEmpty):
            q.get(timeout=timeout)
    while True:
        try:
            q.put_nowait(b"x" * 500)
        except shmq.QueueFull:
            break
    for timeout in (0, 0.05):
        with pytest.raises(shmq.QueueFull):
            q.put(b"x" * 500, timeout=timeout)
    s = q.stats()
    assert (s.consumers_waiting, s.producers_waiting) == (0, 0)
    assert _slot(q._mq, q._slot, waits.CONSUMERS) == _slot(q._mq, q._slot, waits.PRODUCERS) == 0


# ---------------------------------------------------------------- a wait that ends at a lock held elsewhere
REC = 512  # what a record of BODY bytes takes: eight fill the 4 KiB ring
BODY = REC - L.REC_SIZE


def _lock_on_cue(ns, name, up, cue, inside, go):
    """Attach, say so; on ``cue`` take the queue's lock and append a record of BODY bytes
    past the tail (from then on this live process holds the lock), say so, and publish it
    once told to ``go``."""
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        up.set()
        assert cue.wait(60)
        rec = (L.REC_SIZE + 7 + BODY) & -8
        pos, a = q._until_room(q._try_reserve, ((BODY, b"", rec),), None)  # (the lock kept)
        q._mm[a + L.REC_SIZE:a + L.REC_SIZE + BODY] = b"r" * BODY
        inside.set()
        assert go.wait(60)
        q._publish(pos, a)


@contextlib.contextmanager
def _lock_holder(broker):
    """A process that takes the queue's lock when cued (``_lock_on_cue``); yields its
    (up, cue, inside, go) events and the process, which publishes and ends on ``go``."""
    ctx = WORKERS
    events = [ctx.Event() for _ in range(4)]
    p = ctx.Process(target=_lock_on_cue, args=(broker.namespace, "q", *events))
    p.start()
    try:
        assert events[0].wait(60), "the holder never attached"
        yield (*events, p)
    finally:
        events[3].set()
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()


def _full_but_one_record(broker):
    """A 4 KiB queue with this process's slot taken (the C paths want one) and room left
    for one record of BODY bytes: the holder's, not the 1 KiB a test's put brings."""
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    q.put(b"w" * BODY)
    q.get_nowait().ack()
    fill = [bytes([i]) * BODY for i in range(7)]
    q.put_many(fill)
    return q, fill


@pytest.mark.parametrize("timeout", [None, 60.0])
@pytest.mark.parametrize("many", [True, False])
def test_a_put_woken_for_room_into_a_lock_held_by_another_process_waits_for_it(impl, broker, monkeypatch, many,
                                                                               timeout):
    """Issue 27: a put_many asleep on a full queue, its sleep over, found the lock held by a
    live process past the C path's own wait (100 ms); the Python append it went on with was
    handed headers=None (TypeError), and its sleep stayed counted. Here another process
    holds the lock (``_lock_on_cue``) until the put waits for it in Python (``_lock_contended``)."""
    q, fill = _full_but_one_record(broker)
    bodies = [b"a" * BODY, b"b" * BODY] if many else [b"c" * (2 * REC - L.REC_SIZE)]  # 1 KiB either way
    in_python = threading.Event()
    contended = q._lock_contended

    def lock_contended(*args):
        in_python.set()
        return contended(*args)

    with _lock_holder(broker) as (_up, cue, inside, go, holder):
        t, out = in_thread(lambda: q.put_many(bodies, timeout=timeout) if many
                            else [q.put(bodies[0], timeout=timeout)])
        wait_for(lambda: q.stats().producers_waiting == 1, what="the put to sleep for room")
        monkeypatch.setattr(q, "_lock_contended", lock_contended)  # (from here only the put locks q in this process)
        cue.set()
        assert inside.wait(60), "the holder never took the lock"
        wait_for(lambda: in_python.is_set() or not t.is_alive(), what="the put to find the lock held")
        go.set()
        holder.join(30)
        assert holder.exitcode == 0
        got = drain(q)  # (the acks make room: the put goes in)
        t.join(30)
    assert not t.is_alive() and "error" not in out, out
    got += drain(q)
    assert got == fill + [b"r" * BODY] + bodies
    assert len(out["got"]) == len(bodies)
    s = q.stats()
    assert (s.ready, s.in_flight, s.producers_waiting, s.consumers_waiting) == (0, 0, 0, 0)
    assert s.enqueued_total == 1 + len(fill) + 1 + len(bodies)  # (the warm-up, the holder's)


@pytest.mark.parametrize("side", ["put_many", "put", "get"])
def test_a_wait_whose_deadline_passes_while_another_process_holds_the_lock_leaves_no_waiter(impl, broker, side):
    """A sleep is uncounted under the lock; when a live holder keeps that lock past the
    caller's deadline, the caller still raises at its deadline, and the sleep is uncounted
    at the handle's next lock hold (here its ``stats``), not left counted for ever."""
    q, fill = _full_but_one_record(broker)
    if side == "get":
        fill = drain(q)
    call = {"put_many": lambda: q.put_many([b"a" * BODY, b"b" * BODY], timeout=3.0),
            "put": lambda: q.put(b"c" * (2 * REC - L.REC_SIZE), timeout=3.0),
            "get": lambda: q.get(timeout=3.0)}[side]
    counted = "consumers_waiting" if side == "get" else "producers_waiting"
    with _lock_holder(broker) as (_up, cue, inside, go, holder):
        t, out = in_thread(call)
        wait_for(lambda: getattr(q.stats(), counted) == 1, what="the call to sleep")
        cue.set()
        assert inside.wait(60), "the holder never took the lock"
        t.join(30)  # at its deadline: the holder keeps the lock past it
        assert not t.is_alive()
        go.set()
        holder.join(30)
        assert holder.exitcode == 0
    error = out.get("error")
    assert isinstance(error, shmq.QueueEmpty if side == "get" else shmq.QueueFull), out
    assert "its lock stayed held by a live process" in str(error)
    s = q.stats()
    assert (s.consumers_waiting, s.producers_waiting) == (0, 0)
    assert _slot(q._mq, q._slot, waits.CONSUMERS) == _slot(q._mq, q._slot, waits.PRODUCERS) == 0
    assert drain(q) == (fill if side != "get" else []) + [b"r" * BODY]


@pytest.mark.parametrize("filling, polls", [(False, waits.SPIN_NS), (True, waits.FILL_SPIN_NS)])
def test_a_consumer_polls_on_while_a_fill_is_under_way(monkeypatch, filling, polls):
    """Nothing ready: the poll before a sleep lasts SPIN_NS, or FILL_SPIN_NS while a fill
    is under way past the tail (its records come once its producer has a core again);
    a record that becomes ready ends it at once."""
    monkeypatch.setattr(waits, "_sched_yield", lambda: None)
    words = {L.I_READY: 0, L.I_DELETED: 0, L.I_TAIL: 4096, L.I_FILL: 8192 if filling else 0}
    ticks = []

    def clock():  # 1 us a look
        ticks.append(None)
        return 1000 * len(ticks)

    waits.spin(words, None, clock)
    assert polls <= 1000 * len(ticks) <= polls + 2000
    ticks.clear()
    ready_at = 20

    def clock_then_ready():
        ticks.append(None)
        if len(ticks) == ready_at:
            words[L.I_READY] = 1
        return 1000 * len(ticks)

    waits.spin(words, None, clock_then_ready)
    assert len(ticks) == ready_at
    words[L.I_READY] = 0
    ticks.clear()
    waits.spin(words, 1000 * 30, clock)  # a deadline sooner than either
    assert len(ticks) <= 31
