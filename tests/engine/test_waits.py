"""The waiter accounting on a plain word array: sleepers count themselves, wakers post
at most one per sleeper not yet posted, and a sleeper that took a post gives it back."""

import posix_ipc
import pytest

import shmq
from shmq.engine import layout as L
from shmq.engine import waits


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
    sem = posix_ipc.Semaphore(f"/shmq.{namespace}.test", posix_ipc.O_CREX, 0o600, 0)
    try:
        assert waits.sleep_slice(sem, 0, 0) == 1  # the deadline is now: no wait
        assert waits.sleep_slice(sem, None, 0, next_due=0) == 1  # housekeeping is due: at once too
        sem.release()
        assert waits.sleep_slice(sem, None, 0) == 2  # a post ends it
    finally:
        sem.unlink()
        sem.close()


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
