"""Memory in proportion to what a queue or stream partition holds (``shm/memory.py``): an
empty one holds its header only, whatever its ``max_bytes``; memory grows as records are
written and goes back when they are settled or dropped; a /dev/shm that cannot grow
refuses the put that needed the room, and nothing stored is lost. Sizes are what the
kernel counts (st_blocks), not the files' apparent sizes."""

import errno
import os
import resource
import time

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import shmq
from shmq.engine.shm import layout as L
from shmq.engine.shm import memory
from shmq.engine.shm import cpaths
from shmq.engine.shm.segment import SHM_DIR, namespace_entries
from tests.engine.test_model import PurePython, QueueModel

MiB = 2**20
HEADER = 128 * 1024  # a queue's header, in whole chunks (the process table, the dedup table, the bitmap)


def held(namespace, part="") -> int:
    """Bytes of /dev/shm the namespace's entries whose name has ``part`` hold."""
    return sum(os.stat(f"{SHM_DIR}/{e}").st_blocks * 512 for e in namespace_entries(namespace) if part in e)


def drain(q) -> int:
    n = 0
    while True:
        try:
            ds = q.get_many(1000, timeout=0)
        except shmq.QueueEmpty:
            return n
        q.ack_many(ds)
        n += len(ds)


def rounds_until(q, bound, most=8) -> int:
    """Housekeeping rounds until the queue holds at most ``bound`` bytes (AssertionError past ``most``)."""
    for n in range(1, most + 1):
        q._housekeep()
        if q.stats().bytes_held <= bound:
            return n
    raise AssertionError(f"still {q.stats().bytes_held} bytes after {most} rounds")


def refuse(fd, offset, length):
    """``posix_fallocate`` on a full /dev/shm."""
    raise OSError(errno.ENOSPC, "No space left on device")


class FullShm:
    """/dev/shm as if full once ``fill()`` is called: every chunk a queue or partition asks
    for is refused with ENOSPC (the C and Python paths, and a server in this process,
    alike); ``free()`` makes room again."""

    def __init__(self, monkeypatch):
        self._mp = monkeypatch

    def fill(self):
        self._mp.setattr(memory, "_fallocate", refuse)

    def free(self):
        self._mp.undo()


@pytest.fixture
def full_shm(monkeypatch):
    return FullShm(monkeypatch)


# ------------------------------------------------------------------ queues
def test_an_empty_queue_holds_its_header_whatever_its_max_bytes(broker):
    for name, max_bytes in (("small", 64 * 1024), ("default", 64 * MiB), ("big", 2 << 30)):
        q = broker.create_queue(name, max_bytes=max_bytes)
        assert held(broker.namespace, f".q.{name}") <= HEADER + 8192  # (+ its two semaphores)
        assert q.stats().bytes_held == HEADER if max_bytes > MiB else q.stats().bytes_held <= HEADER
        assert q.stats().max_bytes == max_bytes  # the cap keeps its meaning
        q._housekeep()
        assert q._memory.held() == q._memory.marked()


def test_two_hundred_empty_default_queues_hold_at_most_256_mib(broker):
    for i in range(200):
        broker.create_queue(f"q{i}").close()
    assert held(broker.namespace) <= 256 * MiB
    assert held(broker.namespace, ".q.") <= 200 * (HEADER + 8192)  # 26 MiB: 12.8 GB before


def test_ring_max_bytes_is_bounded(broker):
    with pytest.raises(ValueError, match="max_bytes must be at most"):
        broker.create_queue("huge", max_bytes=8 << 30)
    with pytest.raises(ValueError, match="max_bytes must be at most"):
        broker.create_stream("huge", max_bytes=8 << 30)


def test_memory_grows_with_what_is_stored_and_goes_back_when_settled(broker):
    q = broker.create_queue("jobs")
    q.put_many([b"x" * 1000] * 10_000)  # 10.5 MB of records
    assert 10 * MiB < q.stats().bytes_held < 11 * MiB * 5 // 4 + HEADER  # (and up to a quarter ahead, as it grew)
    assert drain(q) == 10_000
    assert rounds_until(q, 8 * MiB) <= 3  # "within a few housekeeping rounds"
    assert rounds_until(q, HEADER) <= 3  # and, idle, down to its header
    assert q._memory.held() == q._memory.marked()
    q.put(b"after")  # and it grows again
    assert q.get_nowait().body == b"after"


def test_a_busy_queue_keeps_the_memory_it_writes_again(broker):
    """A flow of puts, gets and acks reuses what it wrote (the next lap starts where the
    memory just freed is, once the queue is empty): nothing is allocated per message, and
    the housekeeping rounds meanwhile give nothing back that the flow needs."""
    q = broker.create_queue("flow", max_bytes=16 * MiB)
    body = b"y" * (256 * 1024)
    for _ in range(8):
        q.put(body)
        q.get_nowait().ack()
    grown = q._memory.word("grown_total")
    for i in range(400):  # 100 MiB through a 16 MiB ring
        q.put(body)
        q.get_nowait().ack()
        if i % 50 == 0:
            q._housekeep()
    assert q._memory.word("grown_total") == grown
    assert q.stats().bytes_held <= HEADER + 2 * MiB


@given(words=st.lists(st.sampled_from([0, 2**64 - 1, 1, 2**63, 0x00FF00FF00FF00FF]) | st.integers(0, 2**64 - 1),
                      min_size=1, max_size=4),
       c=st.integers(0, 300), length=st.integers(0, 300), bit=st.sampled_from([0, 1]))
def test_the_bitmap_is_read_a_word_at_a_time_as_a_chunk_at_a_time_reads_it(words, c, length, bit):
    c = min(c, 64 * len(words))
    stop = min(c + length, 64 * len(words))
    mq = [7, *words]  # (a word before the bitmap: the scan starts at its word ``bw``)
    chunk_at_a_time = next((k for k in range(c, stop) if (mq[1 + (k >> 6)] >> (k & 63) & 1) == bit), stop)
    assert memory._first(mq, 1, c, stop, bit) == chunk_at_a_time


@pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
def test_a_large_body_into_the_emptied_queue_starts_the_next_lap_in_c(broker, monkeypatch):
    """A put or reserve into the empty queue far enough into its lap starts the next lap in C
    where the memory just freed is allocated (no Python placement, nothing allocated), as the
    Python path would place it; where it is not allocated (given back) the Python path
    allocates it first."""
    q = broker.create_queue("frames", max_bytes=16 * MiB, max_message_bytes=MiB)
    body = bytes(range(256)) * 4096  # 1 MiB
    q.put(body)
    q.get_nowait().ack()
    placed = []
    python_room = type(q)._room
    monkeypatch.setattr(type(q), "_room", lambda self, *a, **k: placed.append(1) or python_room(self, *a, **k))
    grown = q._memory.word("grown_total")
    for i in range(20):
        if i % 2:
            with q.reserve(len(body)) as buf:
                buf[:] = body
        else:
            q.put(body)
        assert q._mq[L.I_HEAD] % q._cap == 0 and q._mq[L.I_TAIL] - q._mq[L.I_HEAD] > MiB  # at the lap's start
        d = q.get_nowait()
        assert d.body == body
        d.ack()
    assert placed == [] and q._memory.word("grown_total") == grown
    q._housekeep()
    q._housekeep()  # (the room the last round's puts wrote is kept one round)
    assert q.stats().bytes_held == HEADER
    q.put(body)  # the lap's start given back: the Python path allocates it
    assert placed == [1] and q._memory.held() == q._memory.marked() and q.get_nowait().body == body


def test_a_put_dev_shm_cannot_make_room_for_is_refused_and_nothing_is_lost(any_broker, broker, full_shm):
    """The put that needed a chunk /dev/shm could not give gets StorageError naming /dev/shm
    and how to enlarge it; what the queue held is intact; puts that fit what it holds go
    on, and once room is freed every put does (locally, and through a server)."""
    q = any_broker.create_queue("jobs", max_bytes=8 * MiB)
    full_shm.fill()
    stored = []
    with pytest.raises(shmq.StorageError, match=r"/dev/shm is full: queue 'jobs' could not take .*--shm-size"):
        for i in range(1000):  # the first chunk was allocated at create (the header's): 4 KiB of ring
            q.put(b"%d" % i + b"." * 1000)  # no timeout: at once
            stored.append(i)
    assert 0 < len(stored) < 10
    with pytest.raises(shmq.StorageError):
        q.put_many([b"z" * 1000] * 5)
    got = [int(d.body.rstrip(b".")) for d in q.get_many(100, timeout=0)]
    assert got == stored  # intact, in order
    full_shm.free()
    q.put_many([b"z" * 1000] * 100)
    assert len(q.get_many(1000, timeout=1)) == 100
    if any_broker is broker:
        assert q._memory.word("refused_total") >= 2


def test_a_put_with_a_timeout_waits_for_dev_shm_room_within_it_as_for_a_full_queue(broker, full_shm):
    """/dev/shm full is back-pressure, not an error at once: a put with a timeout waits for
    room there within it (room made elsewhere meanwhile lets it through), and past it gets
    ShmFull, a StorageError and a queue.Full both."""
    import queue as stdlib_queue
    import threading

    q = broker.create_queue("jobs", max_bytes=8 * MiB)
    full_shm.fill()
    for i in range(1000):  # what the queue's first chunk takes
        try:
            q.put_nowait(b"." * 1000)
        except shmq.StorageError:
            break
    started = time.monotonic()
    with pytest.raises(stdlib_queue.Full) as e:
        q.put(b"w" * 1000, timeout=0.3)
    assert isinstance(e.value, shmq.StorageError) and isinstance(e.value, shmq.ShmFull)
    assert 0.3 <= time.monotonic() - started < 5
    room = threading.Timer(0.2, full_shm.free)
    room.start()
    try:
        q.put(b"w" * 1000, timeout=30)  # waits until the room comes, then goes in
    finally:
        room.join()
    assert q.get_many(2000, timeout=0)[-1].body == b"w" * 1000


def test_reserve_and_restore_allocate_first_too(broker, full_shm):
    q = broker.create_queue("jobs", max_bytes=8 * MiB)
    full_shm.fill()
    with pytest.raises(shmq.StorageError):
        with q.reserve(100_000) as buf:
            buf[:] = b"r" * 100_000
    exported = [(7, 0, 1, b"", b"m" * 200_000)]
    with pytest.raises(shmq.StorageError):
        q._import_messages(exported)
    full_shm.free()
    assert q._import_messages(exported) == 1
    assert q.get_nowait().body == b"m" * 200_000


# ------------------------------------------------------------------ streams
def test_an_empty_partition_holds_its_header_and_a_12_partition_stream_costs_what_it_holds(any_broker, broker):
    any_broker.create_stream("events", partitions=12)
    parts = [p for p in namespace_entries(broker.namespace) if ".s.events#" in p]
    assert len(parts) == 12 and all(held(broker.namespace, p) <= MiB for p in parts)
    assert held(broker.namespace, ".s.events") <= 2 * MiB  # (776 MiB before)
    s = any_broker.stream("events")
    s.append_many([b"v" * 1000] * 12_000)  # 12 MB of records, over the 12 partitions
    total = sum(p["bytes_held"] for p in s.stats()["partitions"])
    assert 12 * MiB < total < 12 * MiB + 12 * 4 * 64 * 1024


def test_a_partition_gives_back_what_retention_drops(broker, monkeypatch):
    monkeypatch.setattr(L, "GIVE_BACK_GRACE_NS", 0)  # (readers without the lock get a second, normally)
    s = broker.create_stream("events", partitions=1, max_bytes=32 * MiB)
    s.append_many([b"v" * 1000] * 20_000, partition=0)
    part = s._part(0)
    assert part.stats()["bytes_held"] > 20 * MiB
    s.delete_records({0: 19_000})
    for _ in range(4):
        s.housekeep()
    assert part.stats()["bytes_held"] < 2 * MiB
    assert [r.offset for r in s.read(0, 19_000, 5)] == list(range(19_000, 19_005))
    assert part._memory.held() == part._memory.marked()


def test_retention_bytes_and_seconds_drop_from_memory_too(broker, monkeypatch):
    monkeypatch.setattr(L, "GIVE_BACK_GRACE_NS", 0)
    by_size = broker.create_stream("sized", partitions=1, retention_bytes=1 * MiB)
    by_size.append_many([b"s" * 1000] * 5000, partition=0)
    assert by_size.housekeep()[0] > 3900  # what is past retention_bytes, oldest first
    earliest, end = by_size.offsets(0)
    assert end == 5000 and 900 <= end - earliest <= 1000
    by_age = broker.create_stream("aged", partitions=1, retention_seconds=60)
    by_age._part(0).append([(None, b"", b"a")] * 10, 0, times=[1] * 5 + [2**62] * 5)  # five of 1970
    assert by_age.housekeep()[0] == 5 and by_age.offsets(0) == (5, 10)
    for _ in range(3):
        dropped, _given = by_size.housekeep()
    assert dropped == 0 and by_size._part(0).stats()["bytes_held"] < 2 * MiB


def test_a_block_stream_keeps_what_a_group_still_needs(broker):
    s = broker.create_stream("jobs", partitions=1, retention="block", retention_bytes=64 * 1024)
    c = s.consumer("g")
    s.append_many([b"b" * 1000] * 500, partition=0)
    assert s.housekeep()[0] == 0  # the group committed nothing: all are needed
    c.poll(max_records=200, timeout=1)
    c.commit()
    assert s.housekeep()[0] == 200 and s.offsets(0)[0] == 200
    c.close()


def test_an_append_dev_shm_cannot_make_room_for_is_refused_and_nothing_is_lost(any_broker, broker, full_shm):
    s = any_broker.create_stream("events", partitions=1)
    full_shm.fill()
    with pytest.raises(shmq.StorageError, match="/dev/shm is full: stream 'events' partition 0"):
        for i in range(1000):
            s.append(b"%d" % i + b"." * 1000, partition=0)
    n = s.offsets(0)[1]
    assert [int(r.value.rstrip(b".")) for r in s.read(0, 0, 1000)] == list(range(n))
    full_shm.free()
    assert s.append(b"after", partition=0).offset == n


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_an_append_into_prepared_room_takes_no_fault_a_page(broker):
    """``prepare`` allocates the room past the tail and maps it into this process: an append
    of as much then writes it with next to no page faults (unprepared: one a page), and its
    records are as any append's; nothing is appended by preparing."""
    s = broker.create_stream("events", partitions=2, max_bytes=32 * MiB)
    values = [b"%07d" % i + b"v" * 993 for i in range(4000)]  # 4 MB of records, about 1,000 pages
    ready = s._part(0)
    before = ready.stats()["bytes_held"]
    assert ready.prepare(4200 * 1024) == 4200 * 1024
    assert 4 * MiB < ready.stats()["bytes_held"] - before <= 4200 * 1024 + 2 * L.CHUNK
    assert ready._memory.held() == ready._memory.marked() and s.offsets(0) == (0, 0)
    warm = broker.create_stream("warm", partitions=1, max_bytes=32 * MiB)
    warm.append_many(values)  # (the Python objects of a batch this size: the heap has grown for them before)
    f0 = _faults()
    s.append_many(values, partition=0)
    f1 = _faults()
    s.append_many(values, partition=1)
    f2 = _faults()
    assert f2 - f1 > 900 and f1 - f0 < (f2 - f1) // 5, (f1 - f0, f2 - f1)
    assert [r.value for r in s.read(0, 0, 4000)] == values == [r.value for r in s.read(1, 0, 4000)]


def test_prepared_room_no_append_used_goes_back(broker, monkeypatch):
    monkeypatch.setattr(L, "GIVE_BACK_GRACE_NS", 0)
    s = broker.create_stream("events", partitions=1, max_bytes=32 * MiB)
    part = s._part(0)
    empty = part.stats()["bytes_held"]
    part.prepare(8 * MiB)
    assert part.stats()["bytes_held"] > empty + 8 * MiB - L.CHUNK
    for _ in range(3):
        s.housekeep()
    assert part.stats()["bytes_held"] == empty and part._memory.held() == part._memory.marked()


def test_prepare_on_a_full_dev_shm_takes_nothing_and_the_append_says_why(broker, full_shm):
    s = broker.create_stream("events", partitions=1)
    part = s._part(0)
    empty = part.stats()["bytes_held"]
    full_shm.fill()
    assert part.prepare(4 * MiB) == 0 and part.stats()["bytes_held"] == empty
    with pytest.raises(shmq.StorageError, match="/dev/shm is full"):
        s.append(b"x" * 1000, partition=0)
    full_shm.free()
    assert s.append(b"after", partition=0).offset == 0


# ------------------------------------------------------------------ the state machines
def held_as_marked(mem):
    """The segment holds exactly what its bitmap says: nothing was written, or read, where
    nothing was allocated (a read of a hole takes a page too)."""
    assert mem.held() == mem.marked()


class MemoryQueueModel(QueueModel):
    """The queue model (tests/engine/test_model.py) on a ring of several chunks, with
    messages that span chunks, rounds that give memory back, and a /dev/shm that now and
    then cannot grow. After every step the segment holds exactly what its bitmap says (so
    nothing was written, or read, where nothing was allocated), and a queue with nothing
    in it gives back all but its header."""

    CAPACITY, MAX_MESSAGE = 6 * L.CHUNK, 100_000

    def __init__(self):
        super().__init__()
        self._allocate = memory._fallocate

    def teardown(self):
        memory._fallocate = self._allocate
        super().teardown()

    @rule(size=st.sampled_from([5000, 40_000, 70_000, 100_000]))
    def put_large(self, size):
        QueueModel.put(self, size)

    @rule(n=st.integers(1, 3), size=st.sampled_from([30_000, 90_000]))
    def put_many_large(self, n, size):
        QueueModel.put_many(self, n, size, None)

    @rule(full=st.booleans())
    def shm(self, full):
        self.shm_full = full
        memory._fallocate = refuse if full else self._allocate

    @rule()
    def give_back(self):
        self._lapse()
        self.q._housekeep()
        if not self._live():
            self.q._housekeep()  # (the room the last round's puts wrote is kept one round)
            assert self.q.stats().bytes_held == HEADER

    @invariant()
    def holds_what_its_bitmap_says(self):
        held_as_marked(self.q._memory)


TestMemoryQueueModel = MemoryQueueModel.TestCase
TestMemoryQueueModel.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)


class PurePythonMemoryQueueModel(PurePython, MemoryQueueModel):
    """The same on the pure-Python paths."""


TestPurePythonMemoryQueueModel = PurePythonMemoryQueueModel.TestCase
TestPurePythonMemoryQueueModel.settings = settings(max_examples=50, stateful_step_count=60, deadline=None)


class PartitionMemoryModel(RuleBasedStateMachine):
    """A partition of a ring of several chunks: appends of every size (wrapping the ring,
    retention dropping the oldest for room), delete_records, retention by bytes, rounds
    that give memory back (with no grace: no reader without the lock here) and a /dev/shm
    that now and then cannot grow. Reads return exactly the records the model kept, and
    the segment holds exactly what its bitmap says after every step."""

    def __init__(self):
        super().__init__()
        self._grace, L.GIVE_BACK_GRACE_NS = L.GIVE_BACK_GRACE_NS, 0
        self._allocate = memory._fallocate
        self.ns = "hypm%d" % id(self)
        self.broker = shmq.connect(namespace=self.ns)
        self.s = self.broker.create_stream("m", partitions=1, max_bytes=5 * L.CHUNK, max_message_bytes=100_000)
        self.part = self.s._part(0)
        self.records = {}  # offset -> value, of those still held
        self.end = 0
        self.full = False

    def teardown(self):
        memory._fallocate = self._allocate
        L.GIVE_BACK_GRACE_NS = self._grace
        self.s.close()
        self.broker.delete_stream("m")
        self.broker.close()
        shmq.destroy_namespace(self.ns)

    def _sync_earliest(self):
        earliest = self.s.offsets(0)[0]
        assert all(o >= earliest for o in self.records if o >= earliest)
        self.records = {o: v for o, v in self.records.items() if o >= earliest}

    @rule(n=st.integers(1, 4), size=st.sampled_from([10, 3000, 40_000, 90_000]))
    def append(self, n, size):
        values = [bytes([(self.end + i) % 256]) * size for i in range(n)]
        try:
            metas = self.s.append_many(values, partition=0)
        except shmq.StorageError:
            assert self.full
            return
        except shmq.MessageTooLarge:
            assert n * (size + 48) > 5 * L.CHUNK
            return
        assert [m.offset for m in metas] == list(range(self.end, self.end + n))
        self.records.update(zip(range(self.end, self.end + n), values))
        self.end += n
        self._sync_earliest()  # (what retention dropped for room)

    @rule(k=st.integers(0, 6))
    def delete_records(self, k):
        cut = min(self.end, self.s.offsets(0)[0] + k)
        self.s.delete_records({0: cut})
        self.records = {o: v for o, v in self.records.items() if o >= cut}

    @rule(limit=st.sampled_from([None, 50_000, 200_000]))
    def housekeep(self, limit):
        self.part.housekeep(None, limit)
        self._sync_earliest()
        if not self.records:
            self.part.housekeep()
            assert self.part.stats()["bytes_held"] == L.CHUNK  # its header

    @rule(full=st.booleans())
    def shm(self, full):
        self.full = full
        memory._fallocate = refuse if full else self._allocate

    @rule()
    def read_all(self):
        earliest, end = self.s.offsets(0)
        assert end == self.end
        got = {r.offset: r.value for r in self.s.read(0, earliest, 1000)} if end > earliest else {}
        assert got == self.records

    @invariant()
    def holds_what_its_bitmap_says(self):
        held_as_marked(self.part._memory)


TestPartitionMemoryModel = PartitionMemoryModel.TestCase
TestPartitionMemoryModel.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
