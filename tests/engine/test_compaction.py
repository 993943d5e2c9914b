"""Compacted streams (``engine/streams/compaction.py``): the latest record of each key stays,
offsets never change, the partition's start (Kafka's log start offset) never moves for a
run (retention and delete_records move it), every reader passes over what compaction took
(the C and Python paths, local and over TCP), a SIGKILL at any point of a run loses
nothing, against a model in a Hypothesis state machine."""

import multiprocessing
import os
import signal
import time
import uuid

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm import layout as L
from shmq.engine.streams import compaction


def _latest(s, p=0):
    return {r.key: (r.offset, r.value) for r in s.read(p, 0, 100_000)}


def test_the_latest_record_of_each_key_stays_at_its_offset(broker, impl):
    s = broker.create_stream("c", partitions=1, max_bytes=1 << 20, compact=True, delete_retention_seconds=3600)
    want = {}
    for i in range(300):
        key = b"k%d" % (i % 7)
        value = None if i % 7 == 3 and i > 200 else b"v%d" % i  # k3's last ones: tombstones (kept: an hour)
        want[key] = (s.append(value, key=key, partition=0).offset, value)
    want[b"k2"] = (s.append(b"again", key=b"k2", partition=0).offset, b"again")  # 300: k2's 296 goes
    s.append(b"free", partition=0)  # a record without a key always stays
    records, taken = s.compact_now()
    assert records == 301 - 7 and taken > 0
    got = s.read(0, 0, 1000)
    assert {r.key: (r.offset, r.value) for r in got if r.key is not None} == want
    assert [r.offset for r in got] == [293, 294, 295, 297, 298, 299, 300, 301]
    # the start stays (Kafka's log start offset: its cleaner never moves it), and so does the end; what memory
    # holds begins at 293
    assert s.offsets(0) == (0, 302) and s.stats()["partitions"][0]["memory_earliest"] == 293
    st_ = s.stats()["partitions"][0]
    assert (st_["compactions_total"], st_["compacted_bytes_total"], st_["dirty_ratio"]) == (1, taken, 0.0)
    # an offset compaction took reads on at the next record; below earliest, at earliest
    assert [r.offset for r in s.read(0, 5, 2)] == [r.offset for r in got[:2]]
    assert s.read(0, 296, 1)[0].offset == 297
    cols = s.read_columns(0, 0, 1000)
    if cols is not None:
        assert (cols[0], cols[11]) == (len(got), 302)
    with s.consumer("g") as c:
        seen = []
        while len(seen) < len(got):
            seen += c.poll(timeout=5)
        assert [r.offset for r in seen] == [r.offset for r in got]
        c.commit()
    assert s.lag("g") == {0: 0}
    s.close()


def test_compaction_runs_on_lap_after_lap_of_a_small_ring(broker, impl):
    """What stays is written past the tail, across the ring's end as appends are: a ring of
    16 KiB holds 20 keys for ever while 900 KiB of updates go through it."""
    s = broker.create_stream("c", partitions=1, max_bytes=16384, compact=True)
    want = {}
    for i in range(6000):
        key = b"k%d" % (i % 20)
        want[key] = (s.append(b"%d" % i * 20, key=key, partition=0).offset, b"%d" % i * 20)
        if i % 30 == 29:
            s.compact_now()
            assert _latest(s) == want
    st_ = s.stats()["partitions"][0]
    assert st_["dropped_total"] == 0 and st_["compactions_total"] == 200
    assert st_["compacted_bytes_total"] > 40 * 16384  # laps of the ring taken back
    s.close()


def test_an_append_that_needs_room_compacts_first(broker, impl):
    """With nobody compacting, a full ring's appender compacts before it would drop records:
    no key's latest record is ever dropped for room."""
    s = broker.create_stream("c", partitions=1, max_bytes=16384, compact=True)
    want = {}
    for i in range(3000):
        key = b"k%d" % (i % 20)
        want[key] = (s.append(b"%d" % i * 20, key=key, partition=0).offset, b"%d" % i * 20)
    assert _latest(s) == want
    st_ = s.stats()["partitions"][0]
    assert st_["compactions_total"] > 10 and st_["dropped_total"] == 0
    broker.update_stream("c", compact=False)  # a stream that is not compacted drops for room, as before
    for i in range(3000):
        s.append(b"%d" % i * 20, key=b"other", partition=0)
    assert s.stats()["partitions"][0]["dropped_total"] > 0
    s.close()


def test_tombstones_go_after_delete_retention(broker, impl):
    s = broker.create_stream("c", partitions=1, compact=True, delete_retention_seconds=3600)
    s.append(b"a", key=b"x", partition=0)
    s.append(None, key=b"x", partition=0)
    s.append(b"b", key=b"y", partition=0)
    s.compact_now()
    assert [(r.key, r.value) for r in s.read(0, 0, 10)] == [(b"x", None), (b"y", b"b")]
    broker.update_stream("c", delete_retention_seconds=0)
    s.compact_now()
    assert [(r.offset, r.key) for r in s.read(0, 0, 10)] == [(2, b"y")]
    assert s.offsets(0) == (0, 3)
    s.close()


def test_nothing_at_or_past_an_open_transaction_is_touched(broker):
    s = broker.create_stream("c", partitions=1, compact=True)
    for i in range(4):
        s.append(b"%d" % i, key=b"k", partition=0)
    s.set_stable(0, 2)  # a transaction open from offset 2
    s.compact_now()
    assert [r[0] for r in s.read_raw(0, 0, 10)] == [1, 2, 3]
    s.set_stable(0, None)
    s.compact_now()
    assert [r[0] for r in s.read_raw(0, 0, 10)] == [3]
    s.close()


def _offsets_read(s, offset, n=100):
    return [r.offset for r in s.read(0, offset, n)]


def test_compaction_never_moves_the_start(broker, impl):
    """Kafka's log start offset: its cleaner never moves it. Offsets compaction took at
    the head stay readable (a read there goes on at the next record kept), so a consumer
    that starts at 0, or resets to the earliest offset, reads every live key."""
    s = broker.create_stream("c", partitions=1, compact=True)
    for i in range(200):
        s.append(b"v%d" % i, key=b"k%d" % (i % 10), partition=0)
    assert s.compact_now()[0] == 190
    assert s.offsets(0) == (0, 200) and s.stats()["partitions"][0]["earliest"] == 0
    for offset in (0, 1, 189, 190):
        assert _offsets_read(s, offset) == list(range(190, 200))
    assert _offsets_read(s, 195) == list(range(195, 200))
    s.reset("g", "earliest")
    assert s.committed("g") == {0: 0} and s.lag("g") == {0: 200}
    with s.consumer("g") as c, s.consumer("fresh") as fresh:
        for consumer in (c, fresh):  # committed at 0; nothing committed (auto_offset_reset="earliest")
            seen = []
            while len(seen) < 10:
                seen += consumer.poll(timeout=5)
            assert [r.offset for r in seen] == list(range(190, 200))
    # everything compacted away (expired tombstones): still nothing moves the start
    for i in range(10):
        s.append(None, key=b"k%d" % i, partition=0)
    broker.update_stream("c", delete_retention_seconds=0)
    stamped = time.time_ns()
    while time.time_ns() <= stamped:  # (a tombstone's age is over 0 s: the wall clock past its stamp)
        pass
    s.compact_now()
    assert s.offsets(0) == (0, 210) and s.stats()["partitions"][0]["memory_earliest"] == 210
    assert _offsets_read(s, 0) == [] and _offsets_read(s, 210) == []
    s.append(b"after", key=b"new", partition=0)
    assert _offsets_read(s, 3) == [210]
    s.close()


def test_delete_records_and_retention_move_the_start(broker, impl):
    """DeleteRecords moves the start to the offset named, exactly (Kafka's log start
    offset), into or past what compaction took; below it a read is OffsetOutOfRange, at it
    the next record kept comes. Retention moves it to the first record it keeps."""
    s = broker.create_stream("c", partitions=1, compact=True)
    for i in range(200):
        s.append(b"v%d" % i, key=b"k%d" % (i % 10), partition=0)
    s.append(b"again", key=b"k0", partition=0)  # 200: k0's 190 goes
    s.append(b"again", key=b"k5", partition=0)  # 201: k5's 195 goes
    s.compact_now()
    assert s.offsets(0) == (0, 202)
    kept = [191, 192, 193, 194, 196, 197, 198, 199, 200, 201]
    assert _offsets_read(s, 0) == kept
    assert s.delete_records({0: 50}) == 0  # below the first record held: nothing dropped, the start moves
    assert s.offsets(0) == (50, 202)
    with pytest.raises(shmq.OffsetOutOfRange) as e:
        s.read(0, 49)
    assert (e.value.earliest, e.value.end) == (50, 202)
    assert _offsets_read(s, 50) == kept
    assert s.delete_records({0: 20}) == 0 and s.offsets(0) == (50, 202)  # never back
    assert s.delete_records({0: 195}) == 4  # 191..194 go; 195 (compacted) is the start
    assert s.offsets(0) == (195, 202) and _offsets_read(s, 195) == kept[4:]
    with pytest.raises(shmq.OffsetOutOfRange):
        s.read(0, 194)
    s.compact_now()  # (nothing to take: the start stays where DeleteRecords put it)
    assert s.offsets(0) == (195, 202)
    s.reset("g", "earliest")
    assert s.committed("g") == {0: 195}
    # retention drops from the head (here every record: each is over a byte): the start is past what it dropped
    broker.update_stream("c", retention_bytes=1)
    assert s.housekeep()[0] == 6
    assert s.offsets(0) == (202, 202) and _offsets_read(s, 202) == []
    with pytest.raises(shmq.OffsetOutOfRange) as e:
        s.read(0, 201)
    assert e.value.earliest == 202
    broker.update_stream("c", retention_bytes=None)
    s.append(b"last", key=b"k1", partition=0)
    assert s.delete_records({0: 203}) == 1 and s.offsets(0) == (203, 203)  # all of it: the start is the end
    assert _offsets_read(s, 203) == []
    s.close()


def test_housekeeping_compacts_by_the_dirty_ratio(broker):
    s = broker.create_stream("c", partitions=2, compact=True, min_cleanable_dirty_ratio=0.9)
    for i in range(50):
        s.append(b"%d" % i, key=b"same", partition=0)
    part = s._part(0)
    assert compaction.due(part, time.monotonic_ns(), 0.9, 0)  # all of it is dirty
    assert s.compact_now(force=False) == (49, s.stats()["partitions"][0]["compacted_bytes_total"])
    assert s.dirty_ratio(0) == 0.0 and s.compact_now(force=False) == (0, 0)  # (and at most once a second)
    s.close()


def test_a_remote_stream_is_created_compacted_and_read_past_gaps(broker, tcp_server):
    with shmq.connect(tcp_server.url) as remote:
        rs = remote.create_stream("c", partitions=1, compact=True, delete_retention_seconds=60)
        for i in range(20):
            rs.append(b"%d" % i, key=b"k%d" % (i % 3), partition=0)
        assert rs.compact is True
        local = broker.stream("c")
        assert local.compact and local.delete_retention_seconds == 60
        local.compact_now()
        assert [(r.offset, r.value) for r in rs.read(0, 0, 100)] == [(17, b"17"), (18, b"18"), (19, b"19")]
        assert rs.offsets(0) == (0, 20)  # (the start: compaction never moves it)
        with rs.consumer("g") as c:
            assert [r.offset for r in c.poll(timeout=5)] == [17, 18, 19]
        local.close()


def test_settings_are_checked_and_kept(broker, tmp_path):
    with pytest.raises(TypeError):
        broker.create_stream("c", compact=1)
    with pytest.raises(ValueError):
        broker.create_stream("c", min_cleanable_dirty_ratio=1.5)
    with pytest.raises(ValueError):
        broker.create_stream("c", max_compaction_lag_seconds=0)
    s = broker.create_stream("c", compact=True, delete_retention_seconds=5, min_cleanable_dirty_ratio=0.25,
                             max_compaction_lag_seconds=2)
    assert (s.compact, s.delete_retention_seconds, s.min_cleanable_dirty_ratio, s.max_compaction_lag_seconds) == (
        True, 5, 0.25, 2)
    assert broker.create_stream("c", exist_ok=True, compact=True).name == "c"
    with pytest.raises(shmq.StreamExists):
        broker.create_stream("c", exist_ok=True, compact=False, delete_retention_seconds=6)
    broker.update_stream("c", compact=False)
    assert not s.compact
    s.close()


def test_a_rebuilt_compacted_stream_reads_across_its_gaps(broker, tmp_path):
    """A snapshot of a compacted partition holds gaps; the stream rebuilt from it reads on across them."""
    from shmq.persistence.snapshotter import Snapshotter
    from shmq.persistence.recovery import recover

    s = broker.create_stream("c", partitions=1, compact=True, durability="snapshot")
    for i in range(40):
        s.append(b"%d" % i, key=b"k%d" % (i % 4), partition=0)
    s.compact_now()
    Snapshotter(broker, str(tmp_path)).run_once()
    want = [(r.offset, r.value) for r in s.read(0, 0, 100)]
    s.close()
    broker.delete_stream("c")
    recover(broker, str(tmp_path))
    s = broker.stream("c")
    assert s.compact and [(r.offset, r.value) for r in s.read(0, 0, 100)] == want == [(36, b"36"), (37, b"37"), (38, b"38"),
                                                                      (39, b"39")]
    assert [r.offset for r in s.read(0, 37, 1)] == [37]
    s.close()


# ---------------------------------------------------------------------------- SIGKILL inside a run
class _KillAt:
    """The partition's words, killing this process with SIGKILL at the ``nth`` store of word ``at``."""

    def __init__(self, mq, at, nth=1):
        self.mq, self.at, self.left = mq, at, nth

    def __getitem__(self, i):
        return self.mq[i]

    def __setitem__(self, i, v):
        if i == self.at:
            self.left -= 1
            if not self.left:
                os.kill(os.getpid(), signal.SIGKILL)
        self.mq[i] = v

    def __len__(self):
        return len(self.mq)


def _compact_and_die(ns, at):
    with shmq.connect(namespace=ns) as b:
        s = b.stream("c")
        part = s._part(0)
        part._mq = _KillAt(part._mq, at)
        s.compact_now()
    os._exit(0)  # (the kill never came: the parent sees exit code 0)


@pytest.mark.parametrize("at", ["tail", "head", "earliest"])
def test_a_run_killed_at_any_store_loses_no_key(broker, namespace, at):
    s = broker.create_stream("c", partitions=1, max_bytes=1 << 20, compact=True)
    want = {}
    for i in range(2000):
        want[b"k%d" % (i % 50)] = (s.append(b"v%d" % i, key=b"k%d" % (i % 50), partition=0).offset, b"v%d" % i)
    word = {"tail": L.PI_TAIL, "head": L.PI_HEAD, "earliest": L.PI_EARLIEST}[at]
    child = multiprocessing.get_context("fork").Process(target=_compact_and_die, args=(namespace, word))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    got = s.read(0, 0, 10_000)  # (the lock's repair runs first: its holder died)
    assert _latest(s) == want
    offsets = [r.offset for r in got]
    assert offsets == sorted(set(offsets))  # each once, in order
    s.append(b"after", key=b"new", partition=0)
    s.compact_now()
    assert _latest(s) == {**want, b"new": (2000, b"after")}
    s.close()


def _churn(ns, done):
    with shmq.connect(namespace=ns) as b:
        s = b.stream("c")
        base, i = s.offsets(0)[1], 0  # (the only appender: its records' offsets are base + i)
        while True:
            s.append_many([b"v%d" % (base + i + j) for j in range(20)],
                          keys=[b"k%d" % ((i + j) % 300) for j in range(20)], partition=0)
            i += 20
            done.value = i
            s.compact_now()


def test_a_process_killed_while_it_appends_and_compacts_loses_no_key(broker, namespace):
    """Killed at random points of appends and runs: every key's latest value is there, once."""
    s = broker.create_stream("c", partitions=1, max_bytes=65536, compact=True)  # (it laps)
    ctx = multiprocessing.get_context("fork")
    for _round in range(4):
        done = ctx.Value("q", 0, lock=False)
        child = ctx.Process(target=_churn, args=(namespace, done))
        child.start()
        deadline = time.monotonic() + 30
        while done.value < 2000 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        got = s.read(0, 0, 1_000_000)
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets))
        by_key = {}
        for r in got:
            by_key[r.key] = r
        assert len(by_key) == 300  # no key lost: 300 keys, each appended many times
        for r in by_key.values():
            assert r.value == b"v%d" % r.offset  # each record's value names its own offset
        # what remains of each key: its latest (a run may have been cut short: older ones may stay too)
        s.compact_now()
        assert len(s.read(0, 0, 1_000_000)) == 300
    s.close()


# ---------------------------------------------------------------------------- the model
class Compacted(RuleBasedStateMachine):
    """Appends (keyed, keyless, tombstones), runs of compaction, the tombstones' retention,
    open transactions and aborted records at random, in a small ring that laps; every read
    at every offset gives the model's records and where to read on, on the C and Python
    paths."""

    def __init__(self):
        super().__init__()
        self.ns = "t" + uuid.uuid4().hex[:12]
        self.broker = shmq.connect(namespace=self.ns)
        self.s = self.broker.create_stream("c", partitions=1, max_bytes=16384, compact=True,
                                           delete_retention_seconds=3600)
        self.records = {}  # offset -> (key, value) of what is there
        self.aborted = set()  # offsets of records there flagged aborted (readers pass over them)
        self.start = 0  # the partition's start (Kafka's log start offset): compaction never moves it
        self.end = 0
        self.expire = False
        self.stable = None

    def teardown(self):
        self.s.close()
        self.broker.close()
        shmq.destroy_namespace(self.ns)

    def _used(self):
        st_ = self.s.stats()["partitions"][0]
        return st_["bytes"]

    @rule(items=st.lists(st.tuples(st.sampled_from([None, b"a", b"b", b"c", b"d"]),
                                   st.none() | st.binary(max_size=120)), min_size=1, max_size=4))
    def append(self, items):
        if self._used() > 6000:  # keep what stays well under half the ring: a run always has room
            self.compact()
        keys = [k for k, _v in items]
        values = [v if k is not None or v is not None else b"" for k, v in items]
        first = self.s.append_many(values, keys=keys, partition=0)[0].offset
        assert first == self.end
        for i, (k, v) in enumerate(zip(keys, values)):
            self.records[first + i] = (k, v)
        self.end += len(items)

    @rule()
    def compact(self):
        upto = self.end if self.stable is None else min(self.stable, self.end)
        latest = {}
        for o in sorted(self.records):
            if o < upto and self.records[o][0] is not None and o not in self.aborted:
                latest[self.records[o][0]] = o
        gone = [o for o, (k, v) in self.records.items() if o < upto and (o in self.aborted or k is not None and (
            latest[k] != o or (v is None and self.expire)))]
        if self.expire and gone:
            time.sleep(0.001)  # (a tombstone's age is over 0 s: the clock moves on from its append)
        self.s.compact_now()
        for o in gone:
            del self.records[o]
            self.aborted.discard(o)

    @rule(n=st.integers(1, 4))
    def abort(self, n):
        """The last ``n`` offsets flagged aborted (as the coordinator flags an aborted
        transaction's records): no key's latest, gone at the next run."""
        first = max(0, self.end - n)
        self.s.hide(0, [(first, self.end)], L.FLAG_ABORTED)
        self.aborted.update(o for o in range(first, self.end) if o in self.records)

    @rule(data=st.data())
    def delete_records(self, data):
        """DeleteRecords: the start moves up to the offset named, never back; the records
        below it go."""
        offset = data.draw(st.integers(0, self.end))
        before = len([o for o in self.records if o < offset])
        assert self.s.delete_records({0: offset}) == (before if offset > self.start else 0)
        self.start = max(self.start, offset)
        for o in [o for o in self.records if o < self.start]:
            del self.records[o]
            self.aborted.discard(o)

    @rule()
    def expiry(self):
        self.expire = not self.expire
        self.broker.update_stream("c", delete_retention_seconds=0 if self.expire else 3600)

    @precondition(lambda self: self.stable is None)
    @rule()
    def open_txn(self):
        self.stable = self.end
        self.s.set_stable(0, self.stable)

    @precondition(lambda self: self.stable is not None)
    @rule()
    def end_txn(self):
        self.stable = None
        self.s.set_stable(0, None)

    @invariant()
    def reads(self):
        present = sorted(self.records)
        stop = self.end if self.stable is None else min(self.stable, self.end)
        earliest = present[0] if present else self.end
        assert self.s.offsets(0) == (self.start, self.end)
        for offset in sorted({0, self.start, earliest, self.end, *range(0, self.end + 1, 3)}):
            if offset < self.start:
                with pytest.raises(shmq.OffsetOutOfRange) as e:
                    self.s.read_raw(0, offset, 1, visible=True)
                assert (e.value.earliest, e.value.end) == (self.start, self.end)
                continue
            for n in (1, 4, 1000):
                rows = self.s.read_raw(0, offset, n, visible=True)
                looked = [o for o in present if offset <= o < stop][:n]  # (an aborted one is looked at, not shown)
                shown = [o for o in looked if o not in self.aborted]
                assert [r[0] for r in rows] == shown
                for r in rows:
                    key, value = self.records[r[0]]
                    assert (r[2] if r[2] is None else bytes(r[2]), r[4] if r[4] is None else bytes(r[4])) == (
                        key, value)
                nxt = looked[-1] + 1 if looked else (stop if offset < stop else max(offset, earliest))
                assert rows.next == nxt
                cols = self.s.read_columns(0, offset, n)
                if cols is not None:
                    assert (cols[0], cols[11]) == (len(shown), rows.next)


class CompactedPython(Compacted):
    """The same, every handle on the Python paths (the scan's twin, the Python reads)."""

    def __init__(self):
        cpaths.set_enabled(False)
        super().__init__()

    def teardown(self):
        super().teardown()
        cpaths.set_enabled(True)


TestCompacted = Compacted.TestCase
TestCompacted.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestCompactedPython = CompactedPython.TestCase
TestCompactedPython.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
