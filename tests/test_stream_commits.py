"""Issue 27, item 4: who may commit a group's offsets, on both transports. The owner of a
partition moves its committed offset anywhere, back too (Kafka's commit after a seek);
a member that lost the partition, or whose view is older than its owning it, moves
nothing; and a refusal says what happened. The rest of the fence (and the model it is
checked against) is in tests/test_stream_conformance.py and tests/engine/test_groups.py."""


import pytest

import shmq
from tests._processes import WORKERS


def _connect(target):
    return shmq.connect(target) if target.startswith("tcp://") else shmq.connect(namespace=target)


def readme_member(target, joined, stop):
    """Another process runs the README's stream snippet in group "billing": it joins,
    polls, commits, says so, and leaves when told."""
    with _connect(target) as broker:
        s = broker.stream("events")
        with s.consumer("billing") as c:
            records = c.poll(max_records=500, timeout=5.0)
            c.commit()
            joined.put(sorted({r.partition for r in records}))
            stop.wait(30)


def _target(any_broker, namespace):
    return getattr(any_broker, "url", None) or namespace


def test_the_owner_moves_its_commit_back_and_the_group_reads_from_there(any_broker):
    s = any_broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(12)], partition=0)
    c = s.consumer("g")
    assert [r.offset for r in c.poll(max_records=10, timeout=1)] == list(range(10))
    c.commit()
    assert s.committed("g") == {0: 10}
    c.commit({0: 8})  # back: the records 8 and 9 are the group's to read again
    assert s.committed("g") == {0: 8}
    assert c.position(0) == 10  # a commit does not move the member's position
    c.commit({0: 11})  # and forward again, past one it has not polled: the owner's word
    c.commit({0: 3})
    assert s.committed("g") == {0: 3}
    c.close()
    with s.consumer("g") as again:
        assert [r.offset for r in again.poll(max_records=100, timeout=1)] == list(range(3, 12))


def test_a_member_that_lost_a_partition_commits_nothing(any_broker):
    """a polls 60 of partition 1; b joins and takes 1, commits 30: a's commits of 1, back or
    forward, its own partition 0 with it, are refused and store nothing."""
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(100)], partition=1)
    a = s.consumer("g")
    assert [r.offset for r in a.poll(max_records=60, timeout=1)] == list(range(60))
    b = s.consumer("g")
    assert b.assignment() == [1]
    assert [r.offset for r in b.poll(max_records=30, timeout=1)] == list(range(30))
    b.commit()
    refused = ("group 'g' of stream 'events' rebalanced (generation 1 -> 2) since this member's last poll: "
               "partitions [1] went to other members; nothing committed: poll() takes the new assignment")
    for offsets in ({1: 10}, {1: 60}, {0: 0, 1: 10}, None):
        with pytest.raises(shmq.CommitFailed) as e:
            a.commit(offsets)
        assert str(e.value) == refused
    assert s.committed("g") == {1: 30}
    a.commit({0: 0})  # what it kept, it commits
    assert s.committed("g") == {0: 0, 1: 30}
    assert a.assignment() == [0]
    with pytest.raises(shmq.CommitFailed, match=r"^group 'g' of stream 'events': partitions \[1\] are not this "
                                                r"member's \(it owns \[0\]\): nothing committed$"):
        a.commit({1: 10})  # in its new view, 1 is plainly not its
    assert s.committed("g") == {0: 0, 1: 30}
    a.close()
    b.close()


def test_a_member_whose_partition_went_away_and_came_back_never_moves_it_back(any_broker):
    """a polls 20 of partition 1; c joins, reads to 50, commits 50, leaves: 1 is a's again,
    but a's position there (20) is stale, so its commit is refused until it polls again."""
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(100)], partition=1)
    a = s.consumer("g")
    assert [r.offset for r in a.poll(max_records=20, timeout=1)] == list(range(20))
    with s.consumer("g") as c:  # generations 2 and 3, which a never sees
        assert [r.offset for r in c.poll(max_records=50, timeout=1)] == list(range(50))
        c.commit()
    refused = ("group 'g' of stream 'events' rebalanced (generation 1 -> 3) since this member's last poll: "
               "partitions [1] went to another member and came back; nothing committed: poll() takes the new "
               "assignment")
    for offsets in ({0: 0, 1: 10}, None):  # back from 50 to 10, or to its position 20
        with pytest.raises(shmq.CommitFailed) as e:
            a.commit(offsets)
        assert str(e.value) == refused
    assert s.committed("g") == {1: 50}
    assert [r.offset for r in a.poll(max_records=100, timeout=1)] == list(range(50, 100))
    a.commit()
    assert s.committed("g") == {0: 0, 1: 100}
    a.close()


def test_a_member_taken_for_dead_commits_nothing(broker):
    """(Local: over TCP the server's members live as long as their connection.)"""
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(5)], partition=0)
    a = s.consumer("g")
    assert len(a.poll(timeout=1)) == 5
    s.groups_table.leave("g", a._member)  # what a reap does to a member it takes for dead
    with pytest.raises(shmq.CommitFailed, match=r"^group 'g' of stream 'events' rebalanced \(generation 1 -> 2\) "
                                                r"since this member's last poll, without this member \(it was taken "
                                                r"for dead\): nothing committed; poll\(\) joins again$"):
        a.commit()
    assert s.committed("g") == {}
    a.close()
    s.close()


def test_the_readme_loop_commits_again_after_a_second_member_came_and_went(any_broker, namespace):
    """The README's snippet: c polls the 4 partitions; another process runs the snippet
    too: joins (c keeps 0 and 2), commits 1 and 3 and leaves. c's commit says, each time,
    what really happened; polled again, as the README's loop does, it commits."""
    s = any_broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    for p in range(4):
        s.append_many([b"p%d-%d" % (p, i) for i in range(10)], partition=p)
    c = s.consumer("billing")
    assert len(c.poll(max_records=500, timeout=1.0)) == 40
    joined, stop = WORKERS.Queue(), WORKERS.Event()
    other = WORKERS.Process(target=readme_member, args=(_target(any_broker, namespace), joined, stop))
    other.start()
    try:
        assert joined.get(timeout=60) == [1, 3]
        with pytest.raises(shmq.CommitFailed) as e:
            c.commit()
        assert str(e.value) == ("group 'billing' of stream 'events' rebalanced (generation 1 -> 2) since this "
                                "member's last poll: partitions [1, 3] went to other members; nothing committed: "
                                "poll() takes the new assignment")
        stop.set()
        other.join(30)
        assert other.exitcode == 0
        with pytest.raises(shmq.CommitFailed) as e:
            c.commit()
        assert str(e.value) == ("group 'billing' of stream 'events' rebalanced (generation 1 -> 3) since this "
                                "member's last poll: partitions [1, 3] went to another member and came back; nothing "
                                "committed: poll() takes the new assignment")
    finally:
        stop.set()
        other.join(30)
        if other.exitcode is None:
            other.kill()
            other.join(10)
    assert s.committed("billing") == {1: 10, 3: 10}
    s.append_many([b"new"] * 2, partition=3)
    assert [(r.partition, r.offset) for r in c.poll(max_records=500, timeout=1.0)] == [(3, 10), (3, 11)]
    c.commit()  # polled again: 0 and 2 from its position, 1 and 3 from the other's commit
    assert s.committed("billing") == {0: 10, 1: 10, 2: 10, 3: 12}
    c.close()
