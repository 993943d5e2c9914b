"""A server's doorbells (``doze.bell``) and the puts of the loop that serves them
(``waits.serving``): such a put owes no post when every sleeper is a doorbell, and owes
the usual one as soon as another sleeper is there; a doorbell is counted in ``bells``
and in its process's slot, so a SIGKILLed server's doorbells are uncounted by the reaper
(issue 28: the server's own puts no longer wake its own doorbell)."""

import multiprocessing as mp
import os
import signal
import time

import pytest

import shmq
from shmq.engine import doze
from shmq.engine.shm import waits
from shmq.engine.queues import housekeeping
from shmq.engine.shm import layout as L
from tests._wait import in_thread, wait_for

SECOND_NS = 10**9


def _bells(q):
    """(bells, cwait) of ``q``; a laned queue's sleepers count in its lane 0."""
    mq = q._lanes[0]._mq if hasattr(q, "_lanes") else q._mq
    return mq[L.I_BELLS], mq[L.I_CWAIT]


def _bell_in_thread(broker, seconds, name="q", attach=None):
    sleeper = (attach or broker.queue)(name)  # a handle of its own, as a doorbell's
    seen = doze.stamp(sleeper)
    t, out = in_thread(lambda: doze.bell(sleeper, seen, time.monotonic_ns() + int(seconds * SECOND_NS)))
    return sleeper, t, out


def _on_semaphore(t) -> bool:
    """Thread ``t`` is blocked in the kernel on a process-shared futex (a POSIX semaphore
    in shared memory: FUTEX_WAIT_BITSET without FUTEX_PRIVATE_FLAG), not on the GIL or a
    lock of this process (private futexes), nor still running toward its sleep."""
    try:
        with open(f"/proc/self/task/{t.native_id}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return len(fields) > 2 and fields[0] == "202" and not int(fields[2], 16) & 128


def _asleep(t, counts, want):
    """The doze of thread ``t`` is counted (``counts()`` == ``want``) and asleep."""
    wait_for(lambda: counts() == want and _on_semaphore(t), what=f"the sleep counted as {want} and begun")


def test_owed_posts_skips_only_sleepers_that_are_all_doorbells():
    mq = memoryview(bytearray(8 * (L.PROCS_OFF // 8 + 64))).cast("Q")
    mq[L.I_CWAIT], mq[L.I_BELLS] = 1, 1
    assert waits.owed_posts(mq, waits.CONSUMERS, 1) == 1  # not serving: posted as ever
    mq[L.I_CPOSTED] = 0
    with waits.serving():
        assert waits.owed_posts(mq, waits.CONSUMERS, 1) == 0  # the only sleeper is a doorbell
        mq[L.I_CWAIT] = 2  # and now a consumer beside it
        assert waits.owed_posts(mq, waits.CONSUMERS, 1) == 1
        assert waits.owed_posts(mq, waits.PRODUCERS, 1) == 0  # (no producer waits)
    mq[L.I_CWAIT], mq[L.I_CPOSTED] = 1, 0
    assert waits.owed_posts(mq, waits.CONSUMERS, 1) == 1  # the block ended: serving is off again


def test_serving_is_per_thread_and_nests():
    with waits.serving():
        t, out = in_thread(lambda: waits._serving.on)
        t.join(10)
        assert out.get("got") is False
        with waits.serving():
            assert waits._serving.on is True
        assert waits._serving.on is True
    assert waits._serving.on is False


def test_a_doorbell_is_counted_as_one_and_uncounted_after(impl, broker):
    q = broker.create_queue("q")
    _sleeper, t, out = _bell_in_thread(broker, 0.2)
    wait_for(lambda: _bells(q) == (1, 1), what="the doorbell counted in bells and cwait")
    t.join(10)
    assert out.get("got") is False  # its deadline
    assert _bells(q) == (0, 0)


@pytest.mark.parametrize("lanes", [1, 4])
def test_a_put_while_serving_does_not_wake_a_lone_doorbell(impl, broker, lanes):
    q = broker.create_queue("q", lanes=lanes)
    _sleeper, t, out = _bell_in_thread(broker, 0.5)
    _asleep(t, lambda: _bells(q), (1, 1))
    producer = broker.queue("q")  # (laned: a lane of its own, not lane 0, where the sleepers count)
    with waits.serving():
        for i in range(8):
            producer.put(b"served by the loop that made it")
        producer.put_many([b"a", b"b"])
    t.join(10)
    assert out.get("got") is False  # slept to its deadline: no post was owed
    assert _bells(q) == (0, 0) and q.stats().ready == 10


def test_a_put_not_serving_wakes_a_doorbell(impl, broker):
    q = broker.create_queue("q")
    _sleeper, t, out = _bell_in_thread(broker, 30)
    _asleep(t, lambda: _bells(q), (1, 1))
    q.put(b"from a local producer")
    t.join(10)
    assert out.get("got") is True


def test_a_put_while_serving_wakes_a_consumer_beside_a_doorbell(impl, broker):
    q = broker.create_queue("q")
    _sleeper, bt, _ = _bell_in_thread(broker, 2)
    _asleep(bt, lambda: _bells(q), (1, 1))
    consumer = broker.queue("q")
    ct, out = in_thread(lambda: consumer.get(timeout=30).body)
    _asleep(ct, lambda: _bells(q), (1, 2))
    with waits.serving():
        for i in range(2):  # the doorbell may take the first post; the second is the consumer's
            q.put(b"%d" % i)
    ct.join(10)
    assert out.get("got") in (b"0", b"1")
    bt.join(10)


def test_a_nack_while_serving_does_not_wake_a_lone_doorbell(impl, broker):
    q = broker.create_queue("q")
    q.put(b"x")
    d = q.get_nowait()
    _sleeper, t, out = _bell_in_thread(broker, 0.5)
    _asleep(t, lambda: _bells(q), (1, 1))
    with waits.serving():
        q.nack_many([d])
    t.join(10)
    assert out.get("got") is False
    assert q.stats().ready == 1


def _doze_as_bell(namespace, ready):
    b = shmq.connect(namespace=namespace)
    h = b.queue("q")
    ready.set()
    doze.bell(h, doze.stamp(h), time.monotonic_ns() + 60 * SECOND_NS)


def test_a_killed_servers_doorbell_is_uncounted_by_the_reaper(broker):
    q = broker.create_queue("q")
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_doze_as_bell, args=(broker.namespace, ready))
    child.start()
    try:
        assert ready.wait(10)
        wait_for(lambda: _bells(q) == (1, 1), what="the child's doorbell asleep")
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        wait_for(lambda: housekeeping.reap_dead(q, time.monotonic_ns()) >= 0 and _bells(q) == (0, 0),
                 what="the dead doorbell uncounted")
        slot_bells = [q._mq[L.proc_word(i, L.P_BELLS)] for i in range(q._nslots)]
        assert slot_bells == [0] * q._nslots
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)


def _stream_bells(s):
    return s._mq[L.SI_BELLS], s._mq[L.SI_CWAIT]


def test_an_append_while_serving_does_not_wake_a_lone_stream_doorbell(broker):
    s = broker.create_stream("s", partitions=2)
    sleeper = broker.stream("s")
    seen = doze.stamp(sleeper)
    t, out = in_thread(lambda: doze.bell(sleeper, seen, time.monotonic_ns() + SECOND_NS // 2))
    _asleep(t, lambda: _stream_bells(s), (1, 1))
    with waits.serving():
        s.append(b"served by the loop that made it", partition=0)
        s.append_many([b"a", b"b"], partition=1)
    t.join(10)
    assert out.get("got") is False
    assert _stream_bells(s) == (0, 0)
    sleeper.close()


def test_an_append_not_serving_wakes_a_stream_doorbell(broker):
    s = broker.create_stream("s")
    sleeper = broker.stream("s")
    seen = doze.stamp(sleeper)
    t, out = in_thread(lambda: doze.bell(sleeper, seen, time.monotonic_ns() + 30 * SECOND_NS))
    _asleep(t, lambda: _stream_bells(s), (1, 1))
    s.append(b"from a local appender")
    t.join(10)
    assert out.get("got") is True
    assert _stream_bells(s) == (0, 0)
    sleeper.close()
