"""shmq.mp's queues against multiprocessing's own: the same tests run on both, then
what shmq.mp does where the stdlib's fails."""

import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time

import pytest

from shmq import mp
from shmq.engine.shm import cpaths
from shmq.engine.shm.segment import namespace_entries
from tests.mp import _workers as workers
from tests._wait import Alarm, alarm_in, wait_for

FORK = multiprocessing.get_context("fork")
METHODS = ["fork", "spawn"]
BIG = 200_000  # over mp.INLINE_MAX: an object in a segment of its own


@pytest.fixture(params=["stdlib", "shmq"])
def impl(request):
    """``make(kind, *args, method="fork")``: a multiprocessing queue (of that start
    method's context) or the shmq.mp one."""
    made = []

    def make(kind, *args, method="fork"):
        if request.param == "stdlib":
            q = getattr(multiprocessing.get_context(method), kind)(*args)
        else:
            q = getattr(mp, kind)(*args)
        made.append(q)
        return q

    make.shmq = request.param == "shmq"
    yield make
    for q in made:
        if hasattr(q, "cancel_join_thread"):
            q.cancel_join_thread()
        q.close()


def _segments(q):
    """The entries of the objects ``q`` keeps in segments of their own."""
    return [e for e in namespace_entries(q._ns) if e.startswith(f"shmq.{q._ns}.b.")]


# ---------------------------------------------------------------- the same tests on both
def test_objects_round_trip_in_order(impl):
    q = impl("Queue")
    objs = [0, "text", None, {"k": [1, 2.5, (3, "x")]}, b"bytes", bytearray(range(256)) * 1000,
            list(range(1000)), b"\x07" * BIG]
    for obj in objs:
        q.put(obj)
    assert [q.get(timeout=10) for _ in objs] == objs


def test_get_of_an_empty_queue_raises_empty(impl):
    q = impl("Queue")
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get(block=False)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(True, -1)  # a negative timeout does not wait
    with pytest.raises(TypeError):
        q.get(True, "1")


def test_maxsize_counts_items(impl):
    q = impl("Queue", 2)
    q.put(1)
    q.put(b"\x07" * BIG)
    assert q.full() and q.qsize() == 2
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.05)
    with pytest.raises(queue.Full):
        q.put(3, block=False)
    with pytest.raises(queue.Full):
        q.put(3, True, -1)
    assert q.get(timeout=10) == 1
    assert not q.full()
    q.put(3, timeout=10)
    assert [q.get(timeout=10), q.get(timeout=10)] == [b"\x07" * BIG, 3]
    with pytest.raises(TypeError):
        q.put(4, True, "1")
    with pytest.raises(TypeError):
        impl("Queue", 1.5)


def test_qsize_and_empty(impl):
    q = impl("Queue")
    assert q.empty() and q.qsize() == 0 and not q.full()
    for i in range(3):
        q.put(i)
    wait_for(lambda: not q.empty(), what="the stdlib's feeder thread to flush")  # at once for shmq.mp
    assert q.qsize() == 3
    for _ in range(3):
        q.get(timeout=10)
    assert q.empty() and q.qsize() == 0


def test_close_then_put_or_get_raises(impl):
    q = impl("Queue")
    q.put(1)
    with pytest.raises(AssertionError, match="not closed"):
        q.join_thread()
    q.close()
    q.join_thread()
    q.cancel_join_thread()
    with pytest.raises(ValueError, match="is closed"):
        q.put(2)
    with pytest.raises(ValueError, match="is closed"):
        q.get(timeout=1)


def test_simple_queue(impl):
    q = impl("SimpleQueue")
    assert q.empty()
    q.put({"a": 1})
    q.put(b"\x07" * 1000)  # (the stdlib's put writes to a pipe: more than 64 KiB waits for a reader)
    wait_for(lambda: not q.empty())
    assert q.get() == {"a": 1}
    assert q.get() == b"\x07" * 1000
    assert q.empty()
    q.close()
    with pytest.raises(OSError, match="closed"):
        q.put(1)


@pytest.mark.parametrize("method", METHODS)
def test_passed_to_a_process(impl, method):
    q_in, q_out = impl("Queue", method=method), impl("Queue", method=method)
    p = multiprocessing.get_context(method).Process(target=workers.echo, args=(q_in, q_out, 3))
    p.start()
    try:
        for x in (1, "ab", b"\x07" * BIG):
            q_in.put(x)
        assert [q_out.get(timeout=30) for _ in range(3)] == [2, "abab", b"\x07" * BIG * 2]
    finally:
        p.join(30)
    assert p.exitcode == 0


@pytest.mark.parametrize("method", METHODS)
def test_passed_to_a_pool_initializer(impl, method):
    q = impl("Queue", method=method)
    pool = multiprocessing.get_context(method).Pool(2, initializer=workers.pool_init, initargs=(q,))
    try:
        assert pool.map(workers.pool_put_square, range(10)) == list(range(10))
    finally:
        pool.close()
        pool.join()
    assert sorted(q.get(timeout=10) for _ in range(10)) == [x * x for x in range(10)]


@pytest.mark.parametrize("method", METHODS)
def test_join_returns_once_a_child_marked_every_task_done(impl, method):
    ctx = multiprocessing.get_context(method)
    jq = impl("JoinableQueue", method=method)
    taken, go = ctx.Event(), ctx.Event()
    for i in range(3):
        jq.put(i)
    p = ctx.Process(target=workers.take_then_finish, args=(jq, 3, taken, go))
    p.start()
    joined = threading.Event()
    t = threading.Thread(target=lambda: (jq.join(), joined.set()), daemon=True)
    try:
        assert taken.wait(30)
        t.start()
        assert not joined.wait(0.3)  # got, not done: join waits
        go.set()
        assert joined.wait(30)
    finally:
        go.set()
        p.join(30)
    assert p.exitcode == 0
    with pytest.raises(ValueError, match=r"task_done\(\) called too many times"):
        jq.task_done()


def test_task_done_too_many_times(impl):
    jq = impl("JoinableQueue")
    with pytest.raises(ValueError, match=r"task_done\(\) called too many times"):
        jq.task_done()
    jq.put(1)
    assert jq.get(timeout=10) == 1
    jq.task_done()
    jq.join()
    with pytest.raises(ValueError, match=r"task_done\(\) called too many times"):
        jq.task_done()


# ---------------------------------------------------------------- where shmq.mp does better
def test_an_unpicklable_object_raises_in_the_caller_and_the_queue_keeps_working():
    q = mp.JoinableQueue(1)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        q.put(lambda: 0, timeout=5)
    with pytest.raises(TypeError, match="cannot pickle"):
        q.put_nowait([bytearray(BIG), threading.Lock()])  # fails after its big buffer was set aside
    assert q.qsize() == 0 and not q.full() and _segments(q) == []
    q.put_nowait("ok")  # the failed puts took no slot
    assert q.full()
    assert q.get(timeout=10) == "ok"
    q.task_done()
    q.join()  # ... and counted no task
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()


def test_a_child_that_put_10_mb_exits_before_the_queue_is_drained():
    q = mp.Queue()
    p = FORK.Process(target=workers.put_big, args=(q, 10 * 2**20))
    p.start()
    p.join(30)  # the stdlib's child never exits here: its feeder thread waits for a reader
    assert p.exitcode == 0
    assert q.get(timeout=10) == b"\x01" * (10 * 2**20)
    got = q.get(timeout=10)
    assert type(got) is bytearray and got == bytearray(b"\x02") * (10 * 2**20)
    assert _segments(q) == []


def test_a_full_ring_raises_full_and_leaves_no_trace():
    # 8 KiB of ring fill up with ~146 ints (56-byte records) before maxsize=200 does
    q = mp.JoinableQueue(200, max_bytes=8192)
    n = 0
    while True:
        try:
            q.put_nowait(n)
        except queue.Full:
            break
        n += 1
    assert 100 < n < 200
    with pytest.raises(queue.Full):
        q.put(n, timeout=0.01)
    for _ in range(200 - n):
        with pytest.raises(queue.Full):
            q.put_nowait(b"\x07" * BIG)  # its segment is made, then its name finds no room
    assert not q.full() and _segments(q) == []  # no slot taken, no segment left
    assert [q.get(timeout=10) for _ in range(n)] == list(range(n))
    for _ in range(n):
        q.task_done()
    with pytest.raises(ValueError, match="too many times"):  # no task counted
        q.task_done()


def test_numpy_arrays_travel_out_of_band_and_come_back_writable():
    np = pytest.importorskip("numpy")
    q = mp.Queue()
    a = np.arange(100_000, dtype=np.int64).reshape(1000, 100)
    q.put(a)
    q.put(a[:, ::2])  # not contiguous: in the pickle
    b, c = q.get(timeout=10), q.get(timeout=10)
    assert (b == a).all() and (c == a[:, ::2]).all()
    b[0, 0] = -1
    assert b.flags.writeable


def test_a_getter_killed_while_it_waits_does_not_wedge_the_queue():
    # the stdlib's getter holds the queue's read lock while it waits: killed, it wedges every get
    q = mp.Queue()
    p = FORK.Process(target=q.get)
    p.start()
    try:
        wait_for(lambda: q._q.stats().consumers_waiting == 1, what="the child to wait in get")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    q.put("after")
    assert q.get(timeout=10) == "after"


def test_a_lease_held_by_a_killed_process_goes_to_another_get():
    q = mp.Queue(1)
    payload = bytearray(b"\x03") * BIG
    q.put(payload)
    here, there = FORK.Pipe()
    p = FORK.Process(target=workers.lease_and_wait, args=(q, there))
    p.start()
    try:
        assert here.poll(30) and here.recv() == BIG
        assert q.qsize() == 0 and q.full()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    assert q.get(timeout=10) == payload  # its lease returned within about a second
    assert not q.full() and _segments(q) == []


def test_lease_ack_and_nack():
    q = mp.Queue(1)
    q.put("a")
    lease = q.lease(timeout=10)
    assert lease.value == "a" and q.qsize() == 0 and q.full()
    lease.nack()
    assert q.qsize() == 1
    lease = q.lease(timeout=10)
    assert lease.value == "a"
    lease.ack()
    assert not q.full()
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put(b"\x07" * BIG)
    lease = q.lease(timeout=10)
    assert lease.value == b"\x07" * BIG and len(_segments(q)) == 1
    lease.ack()
    assert _segments(q) == []


def test_many_producers_and_consumers_get_every_object_once():
    jq, out = mp.JoinableQueue(4), mp.Queue()
    producers = [FORK.Process(target=workers.produce, args=(jq, tag, 200)) for tag in "abc"]
    consumers = [FORK.Process(target=workers.consume, args=(jq, out)) for _ in range(2)]
    for p in producers + consumers:
        p.start()
    try:
        got = [out.get(timeout=30) for _ in range(600)]
        jq.join()
    finally:
        for _ in consumers:
            jq.put(None, timeout=30)
        for p in producers + consumers:
            p.join(30)
    assert sorted(got) == sorted((tag, i) for tag in "abc" for i in range(200))
    assert [p.exitcode for p in producers + consumers] == [0] * 5
    assert out.empty() and jq.empty()


def test_it_pickles_anywhere_and_attaches_by_name():
    # the stdlib's raises RuntimeError outside a process start (a Pool task's arguments, say)
    q = mp.Queue(3)
    twin = pickle.loads(pickle.dumps(q))
    twin.put("via the twin")
    assert q.get(timeout=10) == "via the twin"
    assert repr(twin) == repr(q)


def test_bad_arguments():
    with pytest.raises(TypeError):
        mp.Queue("3")
    with pytest.raises(ValueError, match="maxsize must be at most"):
        mp.Queue(2**40)
    q = mp.Queue()
    with pytest.raises(ValueError, match="nan"):
        q.get(timeout=float("nan"))
    with pytest.raises(TypeError):
        q.put(1, timeout=[1])
    assert q.qsize() == 0


@pytest.mark.skipif(cpaths.Sem is None, reason="posix_ipc's wait (the pure-Python build) loses a handler's exception")
def test_a_signal_handlers_exception_ends_a_blocking_put_or_get():
    """As the stdlib's queues: what a signal handler raises (a signal-based timeout) ends a
    blocked put or get at once; the queue is as it was."""
    q = mp.Queue(1)
    q.put(1)
    for wait in (lambda: q.put(2, timeout=30), lambda: (q.get(timeout=10), q.get(timeout=30))):
        started = time.monotonic()
        with pytest.raises(Alarm), alarm_in(0.1):
            wait()
        assert time.monotonic() - started < 10
    q.put(3, timeout=10)
    assert q.get(timeout=10) == 3 and q.empty()
    q.close()
