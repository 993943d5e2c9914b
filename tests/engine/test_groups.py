"""Consumer groups (``shmq.engine.streams.groups`` and the ``Consumer`` over it): a Hypothesis state
machine of members joining, leaving, polling and committing against a model of Kafka's
rules, a member taken for dead that joins again, and a SIGKILL storm of member processes
with exact accounting. The reproductions of issue 20 run on both transports in
tests/test_stream_conformance.py."""

import bisect
import os
import random
import signal
import time

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import shmq
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from tests import _workers as w
from tests._dying import killed_at_each_store
from tests._processes import WORKERS
from tests._wait import wait_for

P = 3
MAX_MEMBERS = 4


class GroupModel(RuleBasedStateMachine):
    """The model knows only the rules: partition p belongs to the member of rank p % n (in
    join order); an owner's *stint* on p begins when p becomes its and ends when p goes to
    another. In a stint the owner reads on from where it is; a new stint starts at the
    committed offset (or 0). A commit succeeds only if every partition it names was the
    member's at its last view (join or poll) and has been without a break since (issue
    27: in a generation it has not seen too), forward or back; what a commit() of its
    positions moves past was delivered to it in its stint, or committed before and moved
    back by it (nothing is skipped)."""

    def __init__(self):
        super().__init__()
        self.ns = "hypg%d" % id(self)
        self.broker = shmq.connect(namespace=self.ns)
        self.s = self.broker.create_stream("s", partitions=P, max_bytes=1 << 16)
        self.end = [0] * P
        self.members = []  # [(model id, Consumer)] in join order
        self.next_id = 0
        self.changes = 0  # membership changes so far
        self.seen = {}  # model id -> changes when it last polled (took the group's view)
        self.viewed = {}  # model id -> the partitions it owned then
        self.since = {p: 0 for p in range(P)}  # p -> changes when its owner last changed
        self.committed = {}  # p -> the group's committed offset
        self.stint = {}  # p -> where the owner reads next; absent: its stint has not begun reading
        self.got = {p: set() for p in range(P)}  # offsets delivered to p's owner in its stint
        self.rewound = {p: set() for p in range(P)}  # offsets its owner moved the commit back over

    def teardown(self):
        for _mid, c in self.members:
            c.close()
        self.s.close()
        self.broker.delete_stream("s")
        self.broker.close()
        destroy_namespace(self.ns)
        assert namespace_entries(self.ns) == []

    # -- the model ------------------------------------------------------------------
    def _owner(self, p):
        ids = [mid for mid, _c in self.members]
        return ids[p % len(ids)] if ids else None

    def _owned(self, mid):
        return [p for p in range(P) if self._owner(p) == mid]

    def _start(self, p):
        return self.stint.get(p, self.committed.get(p, 0))

    def _membership(self, change):
        before = [self._owner(p) for p in range(P)]
        change()
        self.changes += 1
        for p in range(P):
            if self._owner(p) != before[p]:  # a new stint
                self.stint.pop(p, None)
                self.got[p], self.rewound[p] = set(), set()
                self.since[p] = self.changes

    def _view(self, mid):
        """Member ``mid`` takes the group's view: where its stints begin, they start at the commit."""
        self.seen[mid], self.viewed[mid] = self.changes, self._owned(mid)
        for p in self.viewed[mid]:
            self.stint.setdefault(p, self.committed.get(p, 0))

    def _commit_ok(self, mid, offsets):
        return all(p in self.viewed[mid] and self._owner(p) == mid and self.since[p] <= self.seen[mid]
                   for p in offsets)

    def _apply_commit(self, mid, offsets):
        for p, off in offsets.items():
            was = self.committed.get(p, 0)
            assert set(range(was, off)) <= self.got[p] | self.rewound[p], (
                f"partition {p}: the group commits past {was}..{off - 1} that member {mid} was not delivered in its "
                f"stint")
            self.rewound[p] |= set(range(off, was))
            self.committed[p] = off

    # -- rules ----------------------------------------------------------------------
    @initialize()
    def first_member(self):
        self.join()

    @rule(p=st.integers(0, P - 1), n=st.integers(1, 12))
    def append(self, p, n):
        ms = self.s.append_many([b"%d-%d" % (p, self.end[p] + i) for i in range(n)], partition=p)
        assert [m.offset for m in ms] == list(range(self.end[p], self.end[p] + n))
        self.end[p] += n

    @precondition(lambda self: len(self.members) < MAX_MEMBERS)
    @rule()
    def join(self):
        mid, self.next_id = self.next_id, self.next_id + 1
        self._membership(lambda: self.members.append((mid, self.s.consumer("g"))))
        self._view(mid)  # joining takes the view

    @precondition(lambda self: self.members)
    @rule(k=st.integers(0, MAX_MEMBERS - 1))
    def leave(self, k):
        mid, c = self.members[k % len(self.members)]
        self._membership(lambda: self.members.remove((mid, c)))
        c.close()

    @precondition(lambda self: self.members)
    @rule(k=st.integers(0, MAX_MEMBERS - 1), n=st.integers(1, 20))
    def poll(self, k, n):
        mid, c = self.members[k % len(self.members)]
        records = c.poll(max_records=n, timeout=0)
        self._view(mid)
        owned = self._owned(mid)
        assert {r.partition for r in records} <= set(owned)
        assert len(records) == min(n, sum(self.end[p] - self._start(p) for p in owned))
        for p in owned:
            offs = [r.offset for r in records if r.partition == p]
            start = self._start(p)
            assert offs == list(range(start, start + len(offs))), f"partition {p} of member {mid} from {start}"
            self.stint[p] = start + len(offs)
            self.got[p] |= set(offs)
        assert all(r.value == b"%d-%d" % (r.partition, r.offset) for r in records)

    @precondition(lambda self: self.members)
    @rule(k=st.integers(0, MAX_MEMBERS - 1))
    def commit(self, k):
        mid, c = self.members[k % len(self.members)]
        self._try_commit(mid, c, {p: self._start(p) for p in self.viewed[mid]}, None)

    @precondition(lambda self: self.members)
    @rule(k=st.integers(0, MAX_MEMBERS - 1), p=st.integers(0, P - 1), back=st.integers(0, 5))
    def commit_some(self, k, p, back):
        """An explicit commit of an offset at most where the owner is, ``back`` below it
        (so some are below the committed offset), or of a partition that is not its."""
        mid, c = self.members[k % len(self.members)]
        offsets = {p: max(0, self._start(p) - back)}
        self._try_commit(mid, c, offsets, offsets)

    def _try_commit(self, mid, c, offsets, explicit):
        """Member ``mid`` commits ``explicit`` (None: its positions, ``offsets``): stored
        all or none, as the model says."""
        if self._commit_ok(mid, offsets):
            c.commit(explicit)
            self._apply_commit(mid, offsets)
            return
        with pytest.raises(shmq.CommitFailed, match="nothing committed"):
            c.commit(explicit)

    @invariant()
    def committed_is_the_models(self):
        assert self.s.committed("g") == self.committed


TestGroupModel = GroupModel.TestCase
TestGroupModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_a_member_taken_for_dead_joins_again_from_the_committed_offset(broker):
    """A member whose slot is gone (found dead) joins again as a new member: nothing of its
    old positions carries over, even where it gets the same partition back."""
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(20)], partition=0)
    a = s.consumer("g")
    assert [r.offset for r in a.poll(max_records=10, timeout=0)] == list(range(10))
    s.groups_table.leave("g", a._member)  # what a reap does to a member it takes for dead
    with s.consumer("g") as c:
        assert [r.offset for r in c.poll(max_records=5, timeout=0)] == list(range(5))
        c.commit()
    old = a._member
    assert [r.offset for r in a.poll(max_records=100, timeout=0)] == list(range(5, 20))
    assert a._member != old
    a.commit()
    assert s.committed("g") == {0: 20}
    a.close()
    s.close()


def test_a_joiner_killed_inside_the_lock_leaves_a_table_that_reads_again_at_worst(broker):
    """The generation and the owner-since marks are written before a member's slot: a
    process killed between them leaves a member that reads again from the commit where
    the marks say so, never one that goes on past records it was not given."""
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    for p in range(2):
        s.append_many([b"r%d" % i for i in range(20)], partition=p)
    a = s.consumer("g")
    assert len(a.poll(max_records=100, timeout=0)) == 40
    a.commit({0: 5, 1: 5})
    child = WORKERS.Process(target=w.join_killed_inside, args=(broker.namespace, "events", "g"))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    # partition 1 was to go to the joiner: a reads it again from the commit; 0 goes on
    assert a.assignment() == [0, 1]
    assert (a.position(0), a.position(1)) == (20, 5)
    assert [(r.partition, r.offset) for r in a.poll(max_records=100, timeout=0)] == [(1, o) for o in range(5, 20)]
    a.commit()
    assert s.committed("g") == {0: 20, 1: 20}
    with s.consumer("g") as b:  # the lock was taken back and the table works on
        assert (a.assignment(), b.assignment()) == ([0], [1])
    a.close()
    s.close()


# ---------------------------------------------------------------- the SIGKILL storm

STORM_PARTITIONS = 4


def _member_logs(paths):
    """Per member (a log file's incarnation between joins): its deliveries [(t0, t1, p,
    first, last)] and its commits [(p, before, offset, t0, t1 or None, outcome, deliveries
    so far)], outcome "ok", "fail" or "maybe" (killed before it could say)."""
    members = []
    for path in paths:
        lines = path.read_text().split("\n")[:-1]  # a partial last line was cut by the kill
        for i, line in enumerate(lines):
            word, *rest = line.split(" ")
            if word == "j":
                got, commits = [], []
                members.append((f"{path.name}#{len(members)}", got, commits))
            elif word == "d":
                t0, t1, p, first, last = map(int, rest)
                got.append((t0, t1, p, first, last))
            elif word == "t":
                after = lines[i + 1].split(" ") if i + 1 < len(lines) else ["maybe", None]
                outcome, t1 = after[0], None if after[1] is None else int(after[1])
                for item in rest[1:]:
                    p, before, offset = map(int, item.split(":"))
                    commits.append((p, before, offset, int(rest[0]), t1, outcome, len(got)))
    return members


def _covered(runs, lo, hi):
    """Whether the offset runs [(first, last)] cover [lo, hi)."""
    for first, last in sorted(runs):
        if first > lo:
            break
        lo = max(lo, last + 1)
    return lo >= hi


def _kill(p):
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)


@pytest.mark.slow
def test_a_storm_of_members_joining_leaving_and_killed_skips_nothing(broker, tmp_path):
    """Appenders append to a stream while the member processes of one group poll, commit,
    leave, join again and are SIGKILLed and restarted at random. Then, from their logs:
    every offset the group committed past was delivered to the member that committed past
    it, in its stint on the partition (after any other member's commit there), its commit
    succeeded, and no commit moved an offset back (also watched live); at the end the
    group has committed every record, and every append that returned is in the log."""
    rnd = random.Random(20)
    s = broker.create_stream("events", partitions=STORM_PARTITIONS, max_bytes=4 << 20, durability="memory")
    stop_appending, stop_members = w.StopFlag(WORKERS), w.StopFlag(WORKERS)  # (their pollers are killed)
    procs, counter = {}, [0]

    def start(kind):
        counter[0] += 1
        tag = f"{kind}{counter[0]}"
        if kind == "a":
            args = (w.storm_appender, (broker.namespace, "events", tag, str(tmp_path / tag), stop_appending))
        else:
            args = (w.storm_member, (broker.namespace, "events", "g", str(tmp_path / tag), stop_members))
        procs[tag] = WORKERS.Process(target=args[0], args=args[1])
        procs[tag].start()

    seen = {}

    def watch(seconds):
        """Sample the group's committed offsets for ``seconds``: none may move back."""
        until = time.monotonic() + seconds
        while True:
            for p, o in s.committed("g").items():
                assert o >= seen.get(p, 0), f"partition {p}'s committed offset went back from {seen[p]} to {o}"
                seen[p] = o
            if time.monotonic() >= until:
                return
            time.sleep(0.005)  # the sampling's pace

    try:
        for kind in "aammmm":
            start(kind)
        # at least 18 s, and on until it has done what the checks below count on (a loaded host
        # does less a second), 180 s at most
        kills, started, checked = 0, time.monotonic(), 0.0

        def enough():
            oks = [c[5] for _n, _g, cs in _member_logs([f for f in tmp_path.iterdir() if f.name[0] == "m"])
                   for c in cs]
            appended = sum(f.read_text().count("\n") for f in tmp_path.iterdir() if f.name[0] == "a")
            return kills >= 20 and oks.count("ok") > 200 and oks.count("fail") > 0 and appended > 2000

        while time.monotonic() < started + 180:
            now = time.monotonic()
            if now >= started + 18 and now >= checked + 2:
                checked = now
                if enough():
                    break
            watch(rnd.uniform(0.05, 0.5))  # the kill instant is random on purpose; nothing waits on it
            kind = "a" if rnd.random() < 0.1 else "m"
            tag = rnd.choice(sorted(t for t in procs if t[0] == kind))
            _kill(procs.pop(tag))
            kills += 1
            start(tag[0])
        stop_appending.set()
        for tag in [t for t in procs if t[0] == "a"]:
            p = procs.pop(tag)
            p.join(30)
            assert p.exitcode == 0
        ends = {p: s.offsets(p)[1] for p in range(STORM_PARTITIONS)}
        wait_for(lambda: watch(0) or s.committed("g") == ends, timeout=60, what="the group to commit everything")
        stop_members.set()
        for p in procs.values():
            p.join(30)
            assert p.exitcode == 0
    finally:
        stop_appending.set()
        stop_members.set()
        for p in procs.values():
            if p.is_alive():
                _kill(p)

    # nothing lost from the log: every append that returned is there, offsets dense, none dropped
    appended = [line.split(" ") for f in tmp_path.iterdir() if f.name[0] == "a" for line in
                f.read_text().split("\n")[:-1]]
    for p in range(STORM_PARTITIONS):
        assert s.offsets(p) == (0, ends[p])
        stored = {r.offset: r.value for r in _read_all(s, p)}
        assert sorted(stored) == list(range(ends[p]))
        mine = [(int(o), v.encode()) for q, o, v in appended if int(q) == p]
        assert all(stored[o] == v for o, v in mine), "an append that returned is not in the log"
    assert len(appended) > 2000

    # no skip: each successful commit past [before, offset) was delivered to its member in its stint
    members = _member_logs([f for f in tmp_path.iterdir() if f.name[0] == "m"])
    latest = _LatestOther([(c[0], c[3], c[4], name) for name, _got, cs in members for c in cs if c[5] == "ok"])
    covers = {p: [] for p in range(STORM_PARTITIONS)}
    for name, got, commits in members:
        for p, before, offset, t0, t1, outcome, n_got in commits:
            if outcome == "fail":
                continue
            lo = max(before, 0)
            assert outcome == "maybe" or offset >= lo, f"{name} moved partition {p} back from {before} to {offset}"
            # another member's commit of p that ended before this one began ended that member's stint
            # before this member's began: what counts is delivered after it started
            other = latest.start(p, name, t0)
            runs = [(a, b) for d0, d1, q, a, b in got[:n_got] if q == p and d1 > other]
            if outcome == "ok":
                assert _covered(runs, lo, offset), (
                    f"{name} committed partition {p} from {before} to {offset}, past records it was not delivered "
                    f"in its stint")
                covers[p].append((lo, offset - 1))
            elif _covered(runs, lo, offset):  # killed before it said: it may have committed
                covers[p].append((lo, offset - 1))
    for p in range(STORM_PARTITIONS):
        assert _covered(covers[p], 0, ends[p]), f"partition {p}: offsets skipped by the group"
    outcomes = [c[5] for _n, _g, cs in members for c in cs]
    assert kills >= 20 and outcomes.count("ok") > 200 and outcomes.count("fail") > 0
    assert len(members) > 20


class _LatestOther:
    """Of successful commits (p, t0, t1, member): the latest start of one of partition p
    by another member than ``member`` that had ended before ``t``."""

    def __init__(self, commits):
        self.ends, self.best = {}, {}
        for p in {c[0] for c in commits}:
            mine = sorted((t1, t0, m) for q, t0, t1, m in commits if q == p)
            first, second, best = (0, None), (0, None), []  # the latest start, and the latest by another member
            for _t1, t0, m in mine:
                if m == first[1]:
                    first = max(first, (t0, m))
                elif t0 > first[0]:
                    first, second = (t0, m), first
                elif t0 > second[0]:
                    second = (t0, m)
                best.append((first, second))
            self.ends[p], self.best[p] = [c[0] for c in mine], best

    def start(self, p, member, t):
        n = bisect.bisect_left(self.ends.get(p, []), t)
        if n == 0:
            return 0
        first, second = self.best[p][n - 1]
        return first[0] if first[1] != member else second[0]


def _read_all(s, p):
    out, offset = [], 0
    while rows := s.read(p, offset, max_records=5000):
        out += rows
        offset = rows[-1].offset + 1
    return out


def test_a_generation_moved_on_by_a_member_killed_between_its_stores_keeps_the_group(broker):
    """A rebalance moves a group's generation on with two word stores: a kill before
    either leaves the group where it was, by name, with its committed offsets (a repacked
    head, zeroed before it was written, could leave the group's slot free)."""
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(10)], partition=0)
    with s.consumer("g") as c:
        c.poll(max_records=5, timeout=0)
        c.commit()
    g = s.groups_table
    i = g._find("g")
    _used, _name, gen, seen = g._head(i)
    stores = []
    for k in killed_at_each_store(s, lambda: g._set_generation(i, gen + 1, seen + 1)):
        stores.append(k)
        assert g._find("g") == i and g._head(i)[:2] == (1, "g")
        assert s.committed("g") == {0: 5}
    assert stores == [0, 1, None]  # each store a place to die, then the whole move
    assert g._head(i)[2:] == (gen + 1, seen + 1)
