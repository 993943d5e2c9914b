"""Large bodies (``layout.FILL_MIN``, ``layout.WINDOW_MIN``): a put or reserve copies its body
with the lock let go (a fill), and a ring of large records keeps to its window while the
consumers keep up (an early wrap) yet holds all of ``max_bytes`` when they stall (a spill).
Each test runs on the C paths and the pure-Python ones (``impl``); the state machines run
both too."""

import functools
import os
import signal
import threading
import time

import hypothesis.strategies as st
import pytest
from hypothesis import event, settings
from hypothesis.stateful import invariant, precondition, rule

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.queues import produce
from shmq.engine.shm import layout as L
from shmq.engine.shm import ring, waits
from shmq.engine.shm.mutex import unlock
from tests._processes import WORKERS
from tests._wait import exited, wait_for
from tests.engine._clock import set_clock
from tests.engine.test_memory import held_as_marked
from tests.engine.test_model import Msg, PurePython, QueueModel

MiB = 2**20
REC = MiB + L.REC_SIZE  # a record of a 1 MiB body


def body(i, size=MiB):
    return i.to_bytes(4, "little") * (size // 4)


def number(b):
    return int.from_bytes(b[:4], "little")


def _positions(q):
    mq = q._mq
    return mq[L.I_HEAD], mq[L.I_TAIL], mq[L.I_WRAP], mq[L.I_FILL]


def _drain_in_order(q, first):
    """Take and ack everything, checking each body is the next number from ``first``;
    returns how many."""
    n = 0
    while True:
        try:
            ds = q.get_many(16, timeout=0)
        except shmq.QueueEmpty:
            return n
        for d in ds:
            assert (number(d.body), d.body) == (first + n, body(first + n, len(d.body)))
            n += 1
        q.ack_many(ds)


def _shallow_until_a_wrap(q):
    """Put and take, one delivery held while the next is put, until a put wraps early (its
    pad then lies ahead of the held delivery, the head); returns that delivery, still held,
    and how many were put."""
    held, n = None, 0
    while True:
        q.put(body(n))
        n += 1
        head, tail, wrap, _fill = _positions(q)
        if held is not None and wrap and head <= wrap < tail:
            return held, n
        assert n < 1000, "no early wrap"
        d = q.get(timeout=0)
        if held is not None:
            held.ack()
        held = d


# ---------------------------------------------------------------- the window
@pytest.mark.parametrize("size", [MiB, 4 * MiB])
def test_a_consumer_that_keeps_up_keeps_the_ring_in_its_window(impl, broker, size):
    """One delivery held while the next is put (a consumer copying the last one): the tail
    never goes past the window (plus a record), an early wrap's pad is skipped by the head
    and by bytes_used, and every message comes in order. The window is 4 MiB or two
    records, whichever is more: 4 MiB bodies (a loader's arrays) keep to 8 MiB of the ring."""
    cap = 64 * MiB
    rec = size + L.REC_SIZE
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=size)
    window = ring.window(rec, cap)
    assert window == (4 * MiB if size == MiB else 2 * rec)
    far = 0
    held = None
    for i in range(200):
        q.put(body(i, size))
        far = max(far, _positions(q)[1] % cap)
        d = q.get(timeout=0)
        assert number(d.body) == i
        if held is not None:
            held.ack()
        held = d
        assert q.stats().bytes_used <= 2 * rec
    assert far <= (-(-window // rec) + 1) * rec  # (200 puts walked a window of records and one, not 64 MiB)
    head, tail, wrap, _fill = _positions(q)
    assert 0 < wrap and wrap % cap >= window  # early wraps happened
    held.ack()
    assert q.stats().bytes_used == 0
    q.close()


def test_no_early_wrap_into_less_than_a_window_freed_before_the_head(impl, broker):
    """A queue a window deep whose two oldest records are acked: the freed records at the
    lap's start are no room to wrap into (the producers would chase the head a record at a time),
    so puts go on past the window; once a whole window is free there, the next put wraps."""
    cap = 64 * MiB
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=MiB)
    for i in range(5):
        q.put(body(i))
    ds = q.get_many(5, timeout=0)
    q.ack_many(ds[:2])
    q.put(body(5))
    head, tail, wrap, _fill = _positions(q)
    assert (head, tail % cap, wrap) == (2 * REC, 6 * REC, 0)
    q.ack_many(ds[2:4])
    q.put(body(6))
    head, tail, wrap, _fill = _positions(q)
    assert head == 4 * REC and wrap == 6 * REC and tail == cap + REC  # wrapped: the window before the head
    assert [number(d.body) for d in q.get_many(3, timeout=0)] == [5, 6] and number(ds[4].body) == 4
    q.close()


def test_a_stall_after_early_wraps_still_fills_all_of_max_bytes_in_order(impl, broker):
    """The consumer stops holding the oldest message just after an early wrap: puts spill
    past the wrap's pad instead of stopping at the window, so the queue takes what fits in
    max_bytes, and all of it comes back in order."""
    cap = 32 * MiB
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=MiB)
    held, n = _shallow_until_a_wrap(q)
    first_put = n
    while True:
        try:
            q.put(body(n), timeout=0)
        except shmq.QueueFull:
            break
        n += 1
    stalled = n - first_put
    head, tail, wrap, _fill = _positions(q)
    assert tail - head > cap  # spilt: past the pad, more than a lap of positions ahead
    assert stalled >= cap // REC - 3  # all but a few records' room of max_bytes
    s = q.stats()
    assert (s.ready, s.in_flight) == (stalled + 1, 1) and cap - 3 * REC <= s.bytes_used <= cap
    with pytest.raises(shmq.QueueFull):
        q.put(body(0), timeout=0.01)
    first = number(held.body) + 1
    held.ack()
    assert _drain_in_order(q, first) == n - first
    assert q.stats().bytes_used == 0
    q.close()


def _keep_up(ns, name, count, hold_s, out):
    """Take ``count`` messages, each held ``hold_s`` before its ack; say the numbers seen."""
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        seen = []
        for _ in range(count):
            d = q.get(timeout=30)
            seen.append(number(d.body))
            time.sleep(hold_s)
            d.ack()
        out.put(seen)


@pytest.mark.parametrize("hold_s", [0.0, 0.01])
def test_a_producer_that_catches_up_waits_for_the_consumer_a_while_then_spills(impl, broker, hold_s):
    """A producer faster than its consumer: with a consumer that keeps up it waits for it
    in the window (the ring stays within a few records); with one that holds each message
    longer than ``SPILL_WAIT_NS`` it spills, and the queue fills max_bytes. Either way every
    message arrives once, in order."""
    cap = 16 * MiB
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=MiB)
    count = 60
    ctx = WORKERS
    out = ctx.Queue()
    child = ctx.Process(target=_keep_up, args=(broker.namespace, "q", count, hold_s, out))
    child.start()
    try:
        most = 0
        for i in range(count):
            q.put(body(i), timeout=30)
            most = max(most, q.stats().ready)
        assert out.get(timeout=60) == list(range(count))
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    if hold_s:
        assert most >= cap // REC - 4  # spilt: the backlog took the whole ring
    q.close()


@pytest.mark.parametrize("option", ["delay", "ttl", "headers"])
def test_a_put_with_options_wraps_early_too_and_keeps_its_bookkeeping(impl, broker, option):
    """The general append (options, headers) wraps early as a plain put does: a delayed
    message counts as delayed and comes once due, in order with the rest."""
    cap = 32 * MiB
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=MiB)
    held, n = _shallow_until_a_wrap(q)
    while _positions(q)[1] % cap < 5 * REC:  # the same, until the head is a window (4 records) into the lap
        d = q.get(timeout=0)
        held.ack()
        held = d
        q.put(body(n))
        n += 1
    d = q.get(timeout=0)
    held.ack()
    held = d  # (the head, in the tail's lap)
    kwargs = {"delay": {"delay": 0.2}, "ttl": {"ttl": 60.0}, "headers": {"headers": {"k": "v"}}}[option]
    q.put(body(n, MiB - 4096), **kwargs)  # (a record under REC with its extension: past its window too)
    head, tail, wrap, _fill = _positions(q)
    assert wrap and head <= wrap < tail and tail % cap < 2 * REC  # (placed at the lap's start)
    s = q.stats()
    assert (s.delayed, s.ready) == ((1, 0) if option == "delay" else (0, 1))
    held.ack()
    d = q.get(timeout=5)
    assert number(d.body) == n and (d.headers == {"k": "v"}) == (option == "headers")
    d.ack()
    assert q.stats().bytes_used == 0
    q.close()


def test_small_records_never_wrap_early_and_a_small_ring_has_no_window(impl, broker):
    q = broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=MiB)
    assert ring.window(L.LARGE - 8, 64 * MiB) == 0 and ring.window(REC, 7 * MiB) == 0
    for i in range(3000):
        q.put(b"s" * 30_000)
        q.get(timeout=0).ack()
    assert _positions(q)[2] == 0  # no early wrap
    q.close()


def test_a_snapshot_of_a_spilt_ring_restores_every_message_in_order(impl, broker):
    """``_export_messages`` (what a snapshot holds) reads a ring whose positions span more
    than a lap (a spill) as the records it holds, oldest first."""
    cap = 16 * MiB
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=MiB)
    held, n = _shallow_until_a_wrap(q)
    while True:
        try:
            q.put(body(n), timeout=0)
            n += 1
        except shmq.QueueFull:
            break
    head, tail, _wrap, _fill = _positions(q)
    assert tail - head > cap
    exported = q._export_messages()
    assert [number(m[4]) for m in exported] == list(range(number(held.body), n))
    assert all(m[4] == body(number(m[4])) for m in exported)
    copy = broker.create_queue("copy", max_bytes=cap, max_message_bytes=MiB)
    assert copy._import_messages(exported) == len(exported)
    held.ack()
    assert _drain_in_order(copy, number(exported[0][4])) == len(exported)
    q.close()
    copy.close()


def _wraps_of_a_shallow_queue(q, size, rounds):
    """Two records ahead, then a put, a get and an ack a round: the positions after each put
    and the Python placements (``_room``) of the last half of the rounds."""
    placed, seen = [], []
    python_room = type(q)._room

    def room(self, *a, **k):
        placed.append(len(seen))
        return python_room(self, *a, **k)

    type(q)._room = room
    try:
        for i in range(2):
            q.put(body(i, size))
        for i in range(2, rounds + 2):
            if i % 3:
                q.put(body(i, size))
            else:
                with q.reserve(size) as buf:
                    buf[:] = body(i, size)
            seen.append(_positions(q)[:3])
            d = q.get(timeout=0)
            assert (number(d.body), d.body) == (i - 2, body(i - 2, size))
            d.ack()
    finally:
        type(q)._room = python_room
    assert _drain_in_order(q, rounds) == 2
    return seen, [k for k in placed if k >= rounds // 2]


@pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
@pytest.mark.parametrize("size, cap", [(64 * 1024, MiB), (MiB, 16 * MiB)], ids=["lap-end", "early-wrap"])
def test_a_large_body_at_its_laps_end_or_early_wrap_or_past_its_room_stays_in_c(broker, size, cap):
    """A queue two records deep, puts and reserves of large bodies: where a record goes to the
    next lap (an early wrap, or the lap's end: a pad first) or past the room (more allocated
    memory ahead), the C put and reserve place it themselves, where the Python path places it
    (the same head, tail and wrap word after each put), once the ring's memory is allocated:
    no Python placement after the first laps."""
    rounds = 8 * cap // size
    cpaths.set_enabled(False)
    try:
        python = broker.create_queue("python", max_bytes=cap, max_message_bytes=size)
    finally:
        cpaths.set_enabled(True)
    c = broker.create_queue("c", max_bytes=cap, max_message_bytes=size)
    assert type(python._fast_put) is not type(c._fast_put)  # (python's None: the Python paths)
    in_python, _ = _wraps_of_a_shallow_queue(python, size, rounds)
    in_c, placed = _wraps_of_a_shallow_queue(c, size, rounds)
    assert in_c == in_python
    wraps = [wrap for _head, _tail, wrap in in_c[rounds // 2:]]
    assert len(set(wraps)) > 1 if size == MiB else wraps[-1] == 0  # (early wraps, or lap ends only)
    assert placed == []
    python.close()
    c.close()


# ---------------------------------------------------------------- pacing
@pytest.mark.parametrize("way", ["put", "reserve"])
def test_a_producer_a_window_ahead_waits_while_the_consumer_drains_it(impl, broker, monkeypatch, way):
    """A large put (or reserve) that finds a window of records ahead of the consumer yields
    its core while the consumer takes and acks, until less than a window is ahead: what the
    consumer reads stays within a window (in the caches), and every message comes once, in
    order. (The consumer here runs whenever the producer yields.)"""
    cap = 64 * MiB
    q = broker.create_queue("q", max_bytes=cap, max_message_bytes=MiB)
    consumer = broker.queue("q")
    got = []

    def consume_one():
        d = consumer.get(timeout=0)
        got.append(number(d.body))
        d.ack()

    monkeypatch.setattr(produce, "_sched_yield", consume_one)
    deepest = 0
    for i in range(40):
        if way == "put":
            q.put(body(i))
        else:
            with q.reserve(MiB) as buf:
                buf[:] = body(i)
        s = q.stats()
        deepest = max(deepest, s.ready + s.in_flight)
    assert deepest == -(-ring.window(REC, cap) // REC)  # (it waits before the put that would make it deeper)
    assert got == list(range(40 - deepest))
    assert _drain_in_order(q, len(got)) == deepest
    q.close()
    consumer.close()


@pytest.fixture
def pace_clock(monkeypatch):
    """A fake clock for ``Producing._pace``: a tenth of a millisecond passes each time the
    producer yields its core; the list of the times it yielded at."""
    now = [0]
    yields = []

    def a_yield():
        yields.append(now[0])
        now[0] += 100_000

    monkeypatch.setattr(produce, "_sched_yield", a_yield)
    restore = set_clock(lambda: now[0])
    yield yields
    restore()


def test_with_no_consumer_a_pacing_put_waits_once_then_puts_at_once(impl, broker, pace_clock):
    """With nobody taking, the first large put past the window waits until the head has
    stood still ``PACE_IDLE_NS``, and no later put waits until the head moves; a put with
    ``timeout=0`` never waits, nor does a small body."""
    yields = pace_clock
    q = broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=MiB)
    for i in range(30):
        q.put(body(i))
    assert len(yields) == produce.PACE_IDLE_NS // 100_000
    q.get(timeout=0).ack()  # the head moves: the next large put waits again, once
    q.put(body(30))
    q.put(body(31))
    assert len(yields) == 2 * produce.PACE_IDLE_NS // 100_000
    q.get(timeout=0).ack()
    q.put(body(32), timeout=0)
    q.put(b"small" * 1000)
    assert len(yields) == 2 * produce.PACE_IDLE_NS // 100_000
    ds = q.get_many(64, timeout=0)
    assert [number(d.body) for d in ds[:-1]] == list(range(2, 33)) and ds[-1].body == b"small" * 1000
    q.ack_many(ds)
    q.close()


def test_a_thread_that_takes_between_its_own_puts_waits_less_and_less(impl, broker, pace_clock):
    """One thread putting and taking in turn, a window of records behind: the head never
    moves while it waits, so each wait ends idle, and the waits back off (after one, the next
    put goes at once; after two in a row, the next three; ...): 64 rounds wait 6 times, not 64."""
    yields = pace_clock
    q = broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=MiB)
    for i in range(4):
        q.put(body(i))
    assert yields == []
    for i in range(4, 68):
        q.put(body(i))
        d = q.get(timeout=0)
        assert number(d.body) == i - 4
        d.ack()
    assert len(yields) == 6 * produce.PACE_IDLE_NS // 100_000  # (at puts 1, 3, 7, 15, 31 and 63 of the 64)
    assert _drain_in_order(q, 64) == 4
    q.close()


@pytest.mark.parametrize("way", ["put", "reserve"])
def test_a_put_that_finds_less_than_a_window_ahead_ends_the_backoff(impl, broker, pace_clock, way):
    """Waits that ended idle leave the next puts (or reserves) going at once (the backoff);
    one that then finds less than a window ahead (the consumers caught up) ends that: the
    next one a window ahead waits again. (The C reservation calls the pacing only when a
    window is ahead or a backoff is to end.)"""
    yields = pace_clock
    wait = produce.PACE_IDLE_NS // 100_000
    q = broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=MiB)

    def put(i):
        if way == "put":
            q.put(body(i))
        else:
            with q.reserve(MiB) as buf:
                buf[:] = body(i)

    ahead = -(-ring.window(REC, 64 * MiB) // REC)
    for i in range(ahead):
        put(i)
    for i in range(ahead, ahead + 3):  # waits, goes at once, waits (the next three would go at once)
        put(i)
        q.get(timeout=0).ack()
    assert len(yields) == 2 * wait
    assert _drain_in_order(q, 3) == ahead
    n = ahead + 3
    for i in range(n, n + ahead + 1):  # from an empty queue to a window ahead, and one past it
        put(i)
    assert len(yields) == 3 * wait
    assert _drain_in_order(q, n) == ahead + 1
    q.close()


# ---------------------------------------------------------------- fills
def test_a_get_goes_on_while_a_large_put_copies_its_body(impl, broker, monkeypatch):
    """A fill lets go of the lock while it copies (the C put of the GIL too): a get made
    meanwhile takes what is there, and the filled message follows it once done."""
    big = 4 * MiB
    q = broker.create_queue("q", max_bytes=16 * big, max_message_bytes=big)
    other = broker.queue("q")
    seen = []
    data = memoryview(bytearray(body(7, big)))
    if impl == "pure":  # the Python fill: a look between its copy and its end
        real = q._finish_fill

        def finish(pos, abandon=False):
            seen.append((q._mq[L.I_FILL] > q._mq[L.I_TAIL], other.get(timeout=0).body))
            return real(pos, abandon)

        monkeypatch.setattr(q, "_finish_fill", finish)
        q.put(b"before")
        q.put(data)
    else:  # the C fill: a thread that looks while the put copies 4 MiB
        q._fill_slot()
        for _ in range(200):  # (the thread must run during the copy, which most large puts here leave to Python)
            q.put(b"before")
            done = threading.Event()

            def look():
                while not done.is_set():
                    if q._mq[L.I_FILL] > q._mq[L.I_TAIL]:
                        seen.append((True, other.get(timeout=5).body))
                        return

            t = threading.Thread(target=look)
            t.start()
            q.put(data)
            done.set()
            t.join(10)
            if seen:
                break
            other.ack_many(other.get_many(2, timeout=0))
    assert seen and seen[0] == (True, b"before")
    assert number(other.get(timeout=0).body) == 7
    q.close()
    other.close()


def _take_one(ns, name, out):
    """Take a message and say its number; its sleeps last the call's whole timeout (a
    missed post is then no half-second delay but a test that fails)."""
    waits.sleep_slice = functools.partial(waits.sleep_slice, slice_s=60.0)
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        d = q.get(timeout=60)
        out.put(number(d.body))
        d.ack()


def test_a_fills_end_wakes_every_consumer_whose_message_it_makes_ready(impl, broker):
    """Three consumers asleep while a reservation fills and two puts wait behind it: its
    end makes three messages ready at once and posts all three consumers (the C publish
    once said one of three: the other two slept on with messages there)."""
    q = broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=MiB)
    ctx = WORKERS
    out = ctx.Queue()
    kids = [ctx.Process(target=_take_one, args=(broker.namespace, "q", out)) for _ in range(3)]
    with exited(kids, 30):
        with q.reserve(L.FILL_MIN) as buf:
            buf[:] = body(0, L.FILL_MIN)
            for k in kids:
                k.start()
            wait_for(lambda: q._mq[L.I_CWAIT] == 3, what="three consumers asleep")
            q.put(body(1, 64))
            q.put(body(2, 64))
            assert q.stats().ready == 0
        assert sorted(out.get(timeout=10) for _ in kids) == [0, 1, 2]
    q.close()


def test_a_large_puts_end_posts_a_consumer_for_each_message_it_makes_ready(impl, broker):
    """Three consumers counted asleep; two small puts made while a large put copies its
    body (the C put lets go of the GIL then) wait behind it; its end makes the three
    ready and posts three times, each post counted."""
    big = 4 * MiB
    q = broker.create_queue("q", max_bytes=16 * big, max_message_bytes=big)
    q._fill_slot()
    data = memoryview(bytearray(body(7, big)))
    mq = q._mq
    if impl == "pure":  # the Python fill: the puts between its copy and its end
        real = q._finish_fill

        def finish(pos, abandon=False):
            q.put(b"a")
            q.put(b"b")
            return real(pos, abandon)

        q._finish_fill = finish
    # (the C fill: a thread must put during the copy; about one large put in five here takes the C
    # path, the others the Python placement -- a new lap, memory to allocate -- which holds the GIL)
    for _ in range(200):
        q.put(b"0")  # (an empty queue's put would start a new lap: the Python append, which holds the GIL)
        q._acquire()
        for _ in range(3):
            waits.register(mq, q._slot, waits.CONSUMERS)
        unlock(q._lockp)
        before = q._ne.value
        done, behind = threading.Event(), []

        def put_behind():
            while not done.is_set():
                if mq[L.I_FILL] > mq[L.I_TAIL]:
                    q.put(b"a")
                    q.put(b"b")
                    behind.append(mq[L.I_FILL] > mq[L.I_TAIL])
                    return

        t = threading.Thread(target=put_behind, daemon=True)
        if impl == "fast":
            t.start()
        q.put(data)
        done.set()
        if impl == "fast":
            t.join(10)
        posted = q._ne.value - before
        q._acquire()
        for _ in range(3):
            waits.unregister(mq, q._slot, waits.CONSUMERS, 1)
        unlock(q._lockp)
        for _ in range(posted):
            assert q._ne.wait(0)
        ds = q.get_many(10, timeout=0)
        q.ack_many(ds)
        if impl == "pure" or (behind and behind[0]):
            assert posted == 3 and [d.body[:1] for d in ds] == [b"0", b"\x07", b"a", b"b"]
            break
    else:
        pytest.fail("no put ever went behind the large put's copy")
    q.close()


def _fill_and_hang(ns, name, inside):
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        with q.reserve(MiB) as buf:
            buf[:] = body(99)
            inside.set()
            signal.pause()  # killed here


def test_a_producer_killed_mid_fill_holds_back_nothing_for_long(impl, broker):
    """A fill whose process dies: what was put after it is seen once its holder is found
    dead (the next put looks at once: the process is gone), its id is counted voided, and
    every other message arrives."""
    q = broker.create_queue("q", max_bytes=16 * MiB, max_message_bytes=MiB)
    q.put(body(1))
    ctx = WORKERS
    inside = ctx.Event()
    child = ctx.Process(target=_fill_and_hang, args=(broker.namespace, "q", inside))
    child.start()
    try:
        assert inside.wait(30)
        q.put(body(2))  # placed after the live fill: not seen yet
        assert [number(d.body) for d in q.get_many(10, timeout=0)] == [1]
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    q.put(body(3))  # finds the fill's holder gone: a PAD, its id voided
    got = [number(d.body) for d in q.get_many(10, timeout=0)]
    assert got == [2, 3]
    s = q.stats()
    assert (s.enqueued_total, q._mq[L.I_VOIDED], q._mq[L.I_FILL]) == (3, 1, 0)
    q.close()


# ---------------------------------------------------------------- the state machine
LARGE = [L.LARGE, 300_000, MiB - L.REC_SIZE]


class WindowQueueModel(QueueModel):
    """The queue model on a ring with a window: large records (fills, early wraps, spills)
    among small ones, and a reservation held open across steps, whose id comes before the
    puts made meanwhile, which are not seen until it ends (published, or abandoned: its id
    taken back when nothing followed it, else voided). After every step the segment holds
    exactly what its bitmap says."""

    CAPACITY, MAX_MESSAGE = 12 * MiB, MiB

    def __init__(self):
        super().__init__()
        self.next_id = 1
        self.voided = 0
        self.open = None  # (reservation, its body, its id, the ids put while it is open)

    def teardown(self):
        if self.open is not None:
            self.open[0].__exit__(ValueError, ValueError("teardown"), None)
        super().teardown()

    def _new_id(self, msg_id):
        assert msg_id == self.next_id and msg_id not in self.msgs
        self.next_id += 1

    def _new_ids(self, ids):
        assert ids == list(range(self.next_id, self.next_id + len(ids)))
        self.next_id += len(ids)

    def _made(self, body, headers=None):
        m = Msg(body, headers)
        if self.open is not None:
            m.state = "hidden"
        return m

    def _live(self):
        return [m for m in self.msgs.values() if m.state != "gone"] + ([self.open] if self.open else [])

    @rule(size=st.sampled_from(LARGE))
    def put_large(self, size):
        QueueModel.put(self, size)

    @precondition(lambda self: self.open is None)
    @rule(size=st.sampled_from([0] + LARGE))
    def open_reservation(self, size):
        data = bytes([self.next_id % 256]) * size
        r = self.q.reserve(size, timeout=0)
        try:
            buf = r.__enter__()
        except shmq.QueueFull:
            assert self._live(), "an empty queue refused a message that fits"
            return
        buf[:] = data
        del buf
        self.open = (r, data, self.next_id)
        self.next_id += 1

    @precondition(lambda self: self.open is not None)
    @rule(abort=st.booleans())
    def end_reservation(self, abort):
        r, data, rid = self.open
        self.open = None
        if abort:
            assert r.__exit__(ValueError, ValueError("abandoned"), None) is False and r.id is None
            if self.next_id == rid + 1:
                self.next_id = rid  # taken back whole
            else:
                self.voided += 1
        else:
            r.__exit__(None, None, None)
            assert r.id == rid
            self.msgs[rid] = Msg(data)
        for m in self.msgs.values():
            if m.state == "hidden":
                m.state = "ready"

    @rule(k=st.integers(1, 12), size=st.sampled_from(LARGE))
    def flow(self, k, size):
        """A consumer that keeps up: ``k`` times a put, a get, and the ack of the delivery
        before (the way early wraps come)."""
        for _ in range(k):
            QueueModel.put(self, size)
            self.get_one("lease")
            if len(self.held) > 1:
                self.ack(len(self.held) - 2)

    @rule()
    def fill_up(self):
        """Put 1 MiB bodies until the queue is full: it is full only when its ring is, from
        the head on (settled records behind a held one included, as in any ring), less the
        stretch an early wrap skips: a window never costs capacity."""
        while True:
            before = self.next_id
            QueueModel.put(self, MiB - L.REC_SIZE)
            if self.next_id == before:
                break
        s = self.q.stats()
        assert s.bytes_used + 2 * REC > self.CAPACITY or self.open, (s, _positions(self.q))

    @rule()
    def counts_match(self):
        self._lapse()
        self.q._housekeep()
        s = self.q.stats()
        assert (s.ready, s.in_flight, s.delayed) == (self._count("ready"), self._count("leased"), self._count("delayed"))
        assert s.enqueued_total == len(self.msgs) + (self.open is not None)
        assert self.q._mq[L.I_VOIDED] == self.voided
        assert s.bytes_used <= self.CAPACITY
        if not self._live():
            assert s.bytes_used == 0

    @invariant()
    def holds_what_its_bitmap_says(self):
        held_as_marked(self.q._memory)
        head, tail, wrap, fill = _positions(self.q)
        if wrap:
            event("an early wrap")
        if tail - head > self.CAPACITY:
            event("a spill")
        if fill:
            event("a fill past the tail")


TestWindowQueueModel = WindowQueueModel.TestCase
TestWindowQueueModel.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)


class PurePythonWindowQueueModel(PurePython, WindowQueueModel):
    """The same on the pure-Python paths."""


TestPurePythonWindowQueueModel = PurePythonWindowQueueModel.TestCase
TestPurePythonWindowQueueModel.settings = settings(max_examples=40, stateful_step_count=50, deadline=None)
