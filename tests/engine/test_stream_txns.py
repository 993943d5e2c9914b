"""What a reader of records sees of a partition with transactions in it (the coordinator's
calls: ``append_marker``, ``hide``, ``set_stable``): markers and aborted records passed
over, nothing at or past the last stable offset, and where to read on; on the C paths and
the Python ones, against a model in a Hypothesis state machine."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shmq
from shmq.engine.shm import layout as L
from shmq.engine.streams.partition import Rows

MARKER = (b"\0\0\0\1", b"\0\0\0\0\0\0")


def test_a_reader_passes_over_markers_and_aborted_records(broker, impl):
    s = broker.create_stream("ev", partitions=1)
    s.append_many([b"a", b"b", b"x", b"y"], partition=0)  # 0..3
    assert s.append_marker(0, *MARKER) == 4
    s.append_many([b"c"], partition=0)  # 5
    assert s.append_marker(0, *MARKER) == 6
    assert s.hide(0, [(2, 4)], L.FLAG_ABORTED) == 2
    assert s.hide(0, [(2, 4)], L.FLAG_ABORTED) == 0  # (set already)
    assert [r.offset for r in s.read(0, 0, 100)] == [0, 1, 5]
    rows = s.read_raw(0, 0, 100, visible=True)
    assert isinstance(rows, Rows) and [r[0] for r in rows] == [0, 1, 5] and rows.next == 7
    rows = s.read_raw(0, 2, 2, visible=True)  # two looked at, both passed over: on from 4
    assert list(rows) == [] and rows.next == 4
    assert [r[0] for r in s.read_raw(0, 0, 100)] == list(range(7))  # as stored: everything (the Kafka listener's)
    assert s.read(0, 6, 10) == []  # a marker at the end: nothing, and no wait
    with s.consumer("g") as c:
        assert [r.value for r in c.poll(timeout=5)] == [b"a", b"b", b"c"]
        c.commit()
    assert s.lag("g") == {0: 0}  # past the last marker
    s.close()


def test_nothing_is_read_at_or_past_the_last_stable_offset(broker, impl):
    s = broker.create_stream("ev", partitions=1)
    s.append_many([b"a"], partition=0)
    s.set_stable(0, 1)  # a transaction opens at 1
    s.append_many([b"t1", b"t2"], partition=0)
    assert (s.stable(0), s.offsets(0)) == (1, (0, 3))
    assert [r.value for r in s.read(0, 0, 100)] == [b"a"]
    assert s.read(0, 1, 100, timeout=0.05) == []
    cols = s.read_columns(0, 0, 100)
    if cols is not None:
        assert (cols[0], cols[11]) == (1, 1)
    with s.consumer("g") as c:
        assert [r.value for r in c.poll(timeout=5)] == [b"a"]
        assert c.poll(timeout=0.05) == []
        c.seek_to_end()  # the end a reader reads from: the last stable offset
        assert c.position(0) == 1
        s.set_stable(0, None)  # it committed
        assert [r.value for r in c.poll(timeout=5)] == [b"t1", b"t2"]
    s.close()


def test_a_remote_reader_sees_the_same(broker, tcp_server):
    s = broker.create_stream("ev", partitions=1)
    s.append_many([b"a", b"x"], partition=0)
    s.hide(0, [(1, 2)], L.FLAG_ABORTED)
    s.append_marker(0, *MARKER)
    s.set_stable(0, 3)
    s.append_many([b"open"], partition=0)
    with shmq.connect(tcp_server.url) as remote:
        rs = remote.stream("ev")
        assert [r.value for r in rs.read(0, 0, 100)] == [b"a"] and rs.stable(0) == 3
        with rs.consumer("g") as c:
            assert [r.value for r in c.poll(timeout=5)] == [b"a"]
    s.close()


class Visible(RuleBasedStateMachine):
    """Records, markers, aborts and the stable offset at random; every read, at any offset
    and size, gives the model's visible records and where to read on."""

    def __init__(self):
        super().__init__()
        self.ns = "t" + __import__("uuid").uuid4().hex[:12]
        self.broker = shmq.connect(namespace=self.ns)
        self.s = self.broker.create_stream("ev", partitions=1, max_bytes=1 << 20)
        self.kinds = []  # per offset: "r", "m" (marker), "x" (aborted)
        self.stable = None

    def teardown(self):
        self.s.close()
        self.broker.close()
        shmq.destroy_namespace(self.ns)

    @rule(n=st.integers(1, 5))
    def append(self, n):
        first = len(self.kinds)
        assert self.s.append_many([b"%d" % (first + i) for i in range(n)], partition=0)[0].offset == first
        self.kinds += ["r"] * n

    @rule()
    def marker(self):
        assert self.s.append_marker(0, *MARKER) == len(self.kinds)
        self.kinds.append("m")

    @precondition(lambda self: self.kinds)
    @rule(data=st.data())
    def abort(self, data):
        first = data.draw(st.integers(0, len(self.kinds) - 1))
        end = data.draw(st.integers(first + 1, len(self.kinds)))
        self.s.hide(0, [(first, end)], L.FLAG_ABORTED)
        for o in range(first, end):
            if self.kinds[o] == "r":
                self.kinds[o] = "x"

    @rule(data=st.data())
    def stable_at(self, data):
        self.stable = data.draw(st.none() | st.integers(0, len(self.kinds)))
        self.s.set_stable(0, self.stable)

    @invariant()
    def reads(self):
        end = len(self.kinds)
        stop = end if self.stable is None else min(self.stable, end)
        assert self.s.stable(0) == stop
        for offset in range(0, end + 1, 2):
            for n in (1, 3, 100):
                rows = self.s.read_raw(0, offset, n, visible=True)
                looked = [o for o in range(offset, stop)][:n]
                shown = [o for o in looked if self.kinds[o] == "r"]
                assert [r[0] for r in rows] == shown
                assert rows.next == (looked[-1] + 1 if looked else offset)
                cols = self.s.read_columns(0, offset, n)
                if cols is not None:
                    assert (cols[0], cols[11]) == (len(shown), rows.next)


TestVisible = Visible.TestCase
TestVisible.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)

