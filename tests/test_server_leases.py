"""``shmq.server.leases``: tags handed out in blocks, pushed deliveries counted per
subscription, batches of tags checked and settled as one."""

import threading

import pytest

from shmq.errors import DeliveryExpired
from shmq.server.leases import Leases, new_tags


class FakeSub:
    """What ``Leases`` tells a subscription: the tags pushed for it, and those settled."""

    def __init__(self):
        self.pushed, self.settled_tags = [], []

    def held(self, tags):
        self.pushed += tags

    def settled(self, tags):
        self.settled_tags += tags


def test_tags_are_unique_in_the_process_across_threads():
    got = []

    def take():
        mine = []
        for n in (1, 7, 100) * 50:
            mine += new_tags(n)
        got.append(mine)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [t for mine in got for t in mine]
    assert len(every) == len(set(every)) == 4 * 50 * 108


def test_pushed_deliveries_are_counted_for_their_subscription_until_settled(broker):
    q = broker.create_queue("q")
    q.put_many([b"%d" % i for i in range(6)])
    leases, a, b = Leases(), FakeSub(), FakeSub()
    wire_a = leases.lease(q, q.get_many(3, timeout=0), a)
    wire_b = leases.lease(q, q.get_many(3, timeout=0), b)
    tags_a, tags_b = [m["delivery"] for m in wire_a], [m["delivery"] for m in wire_b]
    assert [m["body"] for m in wire_a + wire_b] == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert (a.pushed, b.pushed, len(leases)) == (tags_a, tags_b, 6)
    # one ACK naming deliveries of both, one twice: each subscription hears of its own
    assert leases.settle(q, [tags_b[0], tags_a[1], tags_b[0], tags_a[0]], q.ack_many) == 3
    assert (sorted(a.settled_tags), b.settled_tags) == (sorted(tags_a[:2]), [tags_b[0]])
    assert len(leases) == 3 and q.stats().acked_total == 3
    leases.settle(q, tags_a[2:] + tags_b[1:], q.ack_many)
    assert len(leases) == 0 and q.stats().in_flight == 0


def test_a_batch_with_one_unknown_tag_settles_none(broker):
    q, other = broker.create_queue("q"), broker.create_queue("other")
    q.put_many([b"a", b"b"])
    other.put(b"c")
    leases = Leases()
    tags = [m["delivery"] for m in leases.lease(q, q.get_many(2, timeout=0))]
    (elsewhere,) = [m["delivery"] for m in leases.lease(other, other.get_many(1, timeout=0))]
    for bad in ([tags[0], tags[1] + 10_000], [tags[0], elsewhere]):
        with pytest.raises(DeliveryExpired, match=r"unknown deliveries on this connection: \[%d\]" % bad[1]):
            leases.settle(q, bad, q.ack_many)
    assert len(leases) == 3 and q.stats().in_flight == 2
    leases.release(lambda name: None, "test")
    assert q.stats().ready == 2 and other.stats().ready == 1
