"""The general take's walk (scheduling.py): what it must look at, and no more."""

import pytest

from shmq.engine.shm import ring
from shmq.engine.queues import scheduling
from tests._wait import wait_for


@pytest.fixture
def counted(monkeypatch):
    """How many records the walks of the general take visit."""
    seen = [0]
    records = ring.records

    def counting(*args):
        for rec in records(*args):
            seen[0] += 1
            yield rec

    monkeypatch.setattr(scheduling.ring, "records", counting)
    return seen


def test_a_due_delayed_message_keeps_its_due_order_and_the_walk_stops_at_the_first_plain_ones(broker, counted):
    q = broker.create_queue("q")
    q.put(b"early", delay=0.05)  # due before every message put after it came due
    wait_for(lambda: q.peek(1), timeout=5, what="the delay to end")  # due: peek shows it
    for i in range(200):
        q.put(b"%d" % i)
    got = [bytes(q.get(timeout=5).body) for _ in range(3)]
    assert got == [b"early", b"0", b"1"]  # due order: the delayed one came due before the others were put
    counted[0] = 0
    for i in range(2, 50):
        d = q.get(timeout=5)
        assert bytes(d.body) == b"%d" % i
        d.ack()
    # each take walks from the head to its first plain candidate, not the whole ring of 200
    assert counted[0] < 48 * 60, counted[0]


def test_a_message_put_while_another_is_delayed_goes_first(broker):
    q = broker.create_queue("q")
    q.put(b"later", delay=0.2)
    q.put(b"now")
    assert bytes(q.get(timeout=5).body) == b"now"
    assert bytes(q.get(timeout=5).body) == b"later"
