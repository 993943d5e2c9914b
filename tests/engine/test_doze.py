"""Dozing for room (``doze.doze_room``): counted as a producer waiting while it sleeps,
woken by the post an ack owes it, at once when the head moved since its stamp, False
at its deadline; uncounted whatever happens."""

import time

import pytest

import shmq
from shmq.engine import doze
from tests._wait import in_thread, wait_for

SECOND_NS = 10**9


def _full(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=976)
    q.put_many([b"x" * 976] * 4)
    return q


def test_a_doze_for_room_ends_at_its_deadline_uncounted(broker):
    q = _full(broker)
    assert doze.doze_room(q, doze.room_stamp(q), time.monotonic_ns() + SECOND_NS // 20) is False
    assert q.stats().producers_waiting == 0


def test_a_doze_for_room_returns_at_once_when_the_head_moved(broker):
    q = _full(broker)
    seen = doze.room_stamp(q)
    q.get_nowait().ack()
    assert doze.room_stamp(q) != seen
    assert doze.doze_room(q, seen, time.monotonic_ns() + 30 * SECOND_NS) is True
    assert q.stats().producers_waiting == 0


def test_an_ack_wakes_a_doze_for_room(broker):
    q = _full(broker)
    sleeper = broker.queue("q")  # a handle of its own, as a doorbell's
    seen = doze.room_stamp(sleeper)
    t, out = in_thread(lambda: doze.doze_room(sleeper, seen, time.monotonic_ns() + 30 * SECOND_NS))
    wait_for(lambda: q.stats().producers_waiting == 1, what="the doze counted as a producer waiting")
    q.get_nowait().ack()
    t.join(10)
    assert out.get("got") is True, out
    assert q.stats().producers_waiting == 0


def test_a_doze_for_room_in_a_deleted_queue_raises(broker):
    q = _full(broker)
    broker.delete_queue("q")
    with pytest.raises(shmq.QueueNotFound):
        doze.doze_room(q, doze.room_stamp(q), time.monotonic_ns() + SECOND_NS)
