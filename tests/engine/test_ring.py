"""The ring's record walk, placement, record writes, lease check and head reclaim, on a
plain bytearray laid out as a segment (no shared memory, no lock, no clock)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmq.engine.shm import layout as L
from shmq.engine.shm import ring, takes

BASE = 4096  # where the ring starts in the buffer (a segment's data offset is page-aligned)


def _segment(cap):
    mm = bytearray(BASE + cap)
    return mm, memoryview(mm).cast("Q")


def _append(mm, mq, cap, sizes, first_id=1, state=L.READY):
    """Append records of ``sizes`` at the tail, as a put does; returns their positions."""
    pos = mq[L.I_TAIL]
    out = []
    for i, size in enumerate(sizes):
        pos, a = ring.place(mm, BASE, cap, pos, size)
        hraw = b"hh" if size > L.REC_SIZE else b""  # the record's bytes fill exactly its size
        ring.write_record(mm, a, state, size, b"b" * (size - L.REC_SIZE - len(hraw)), hraw, first_id + i, 7)
        out.append(pos)
        pos += size
    mq[L.I_TAIL] = pos
    return out


def test_place_pads_the_rest_of_a_lap_and_write_record_writes_every_field():
    mm, mq = _segment(256)
    assert ring.place(mm, BASE, 256, 0, 96) == (0, BASE)
    assert ring.place(mm, BASE, 256, 192, 96) == (256, BASE)  # 64 left: a PAD record fills them
    assert L.REC.unpack_from(mm, BASE + 192)[:2] == (L.PAD, 64)
    mm[BASE + 224:BASE + 256] = b"\x99" * 32
    assert ring.place(mm, BASE, 256, 224 + 256, 96) == (512, BASE)  # 32 left: an implicit pad, nothing written
    assert mm[BASE + 224:BASE + 256] == b"\x99" * 32
    ring.write_record(mm, BASE + 64, L.READY, 64, b"body", b"hdr", 42, 1234)
    assert L.REC.unpack_from(mm, BASE + 64) == (L.READY, 64, 4, 3, 0, 42, 1234, 0)
    assert mm[BASE + 64 + 48:BASE + 64 + 55] == b"hdrbody"


def test_records_walks_across_explicit_and_implicit_pads():
    cap = 256
    mm, mq = _segment(cap)
    mq[L.I_HEAD] = mq[L.I_TAIL] = 96
    positions = _append(mm, mq, cap, [96, 96])  # the second does not fit the lap: a 64-byte PAD first
    assert positions == [96, 256]
    walked = [(pos, mq[w] & 0xFF) for pos, w in ring.records(mq, cap, BASE, 96, mq[L.I_TAIL])]
    assert walked == [(96, L.READY), (192, L.PAD), (256, L.READY)]
    mq[L.I_HEAD] = mq[L.I_TAIL] = 224 + 256  # 32 bytes before the lap end: an implicit pad
    _append(mm, mq, cap, [64])
    assert [pos for pos, _w in ring.records(mq, cap, BASE, 224 + 256, mq[L.I_TAIL])] == [512]


def test_the_caller_may_stop_the_walk_before_a_bad_record_is_stepped_over():
    mm, mq = _segment(256)
    _append(mm, mq, 256, [64, 64])
    L.REC.pack_into(mm, BASE + 64, L.READY, 0, 0, 0, 0, 0, 0, 0)  # a length of 0 would never advance
    seen = []
    for pos, w in ring.records(mq, 256, BASE, 0, mq[L.I_TAIL]):
        if mq[w + L.R_LENGTH] & 0xFFFFFFFF < L.REC_SIZE:
            break
        seen.append(pos)
    assert seen == [0]


def test_leased_word_checks_range_state_attempt_id_and_deadline():
    mm, mq = _segment(256)
    (pos,) = _append(mm, mq, 256, [64], first_id=9)
    w = (BASE + pos) >> 3
    mq[w] = L.status_word(L.LEASED, 3, 2)
    mq[w + L.R_DEADLINE] = 1000
    args = (mq, BASE, 256, pos)
    assert takes.leased_word(*args, 2, 9, 0, 64, 999) == w
    assert takes.leased_word(*args, 2, 9, 0, 64, 1000) == -1  # lapsed at its deadline
    assert takes.leased_word(*args, 1, 9, 0, 64, 0) == -1  # another attempt's lease
    assert takes.leased_word(*args, 2, 8, 0, 64, 0) == -1  # another message
    assert takes.leased_word(*args, 2, 9, 64, 64, 0) == -1  # behind the head: reclaimed
    mq[w] = L.status_word(L.READY, L.NO_HOLDER, 2)
    assert takes.leased_word(*args, 2, 9, 0, 64, 0) == -1


def test_make_ready_keeps_the_attempt_and_tracks_the_lowest_requeued_position():
    mm, mq = _segment(512)
    positions = _append(mm, mq, 512, [64, 64, 64], state=L.status_word(L.LEASED, 1, 1))
    mq[L.I_FRONTIER] = mq[L.I_TAIL]  # leased: taken, so behind the frontier
    for pos in (positions[2], positions[0]):
        takes.make_ready(mq, (BASE + pos) >> 3, pos)
    assert [L.split_status(mq[(BASE + p) >> 3]) for p in positions] == [
        (L.READY, L.NO_HOLDER, 1), (L.LEASED, 1, 1), (L.READY, L.NO_HOLDER, 1)]
    assert (mq[L.I_READY], mq[L.I_REQUEUED], mq[L.I_READY_POS]) == (2, 2, positions[0])
    assert takes.next_ready(mq, 512, BASE, 0, 192) == positions[0]
    assert takes.next_ready(mq, 512, BASE, 64, 192) == positions[2]
    assert takes.next_ready(mq, 512, BASE, 64, 128) == -1


def test_make_ready_of_a_record_the_frontier_has_not_reached_counts_it_ready_not_requeued():
    mm, mq = _segment(512)
    positions = _append(mm, mq, 512, [64, 64], state=L.status_word(L.DELAYED, L.NO_HOLDER, 0))
    mq[L.I_FRONTIER] = positions[0]  # nothing taken: the frontier will meet both
    takes.make_ready(mq, (BASE + positions[1]) >> 3, positions[1])
    assert (mq[L.I_READY], mq[L.I_REQUEUED]) == (1, 0)


def test_advance_head_reclaims_settled_records_and_pads_only():
    cap = 256
    mm, mq = _segment(cap)
    first, second = _append(mm, mq, cap, [96, 96])  # 0, 96
    assert not ring.advance_head(mq, cap, BASE)  # the first is not settled
    mq[(BASE + first) >> 3] = L.ACKED
    assert ring.advance_head(mq, cap, BASE) and mq[L.I_HEAD] == 96
    assert mq[L.I_FRONTIER] == mq[L.I_READY_POS] == 96  # cursors follow the head
    mq[(BASE + second) >> 3] = L.ACKED
    assert ring.advance_head(mq, cap, BASE) and mq[L.I_HEAD] == mq[L.I_TAIL] == 192
    (third,) = _append(mm, mq, cap, [96])  # a PAD at 192, the record at 256
    mq[L.I_HEAD] = 192
    assert ring.advance_head(mq, cap, BASE) and mq[L.I_HEAD] == third == 256  # over the PAD, not the record
    mq[(BASE + third % cap) >> 3] = L.ACKED
    assert ring.advance_head(mq, cap, BASE) and mq[L.I_HEAD] == mq[L.I_TAIL] == 352


@given(st.lists(st.integers(L.REC_SIZE // 8, 30).map(lambda n: n * 8), min_size=1, max_size=40))
def test_any_appended_sequence_walks_back_as_written(sizes):
    cap = 1024
    sizes = [s for s in sizes if s <= cap]
    mm, mq = _segment(cap)
    written = []
    for i, size in enumerate(sizes):
        if mq[L.I_TAIL] + size - mq[L.I_HEAD] > cap - 256:  # keep room: reclaim everything so far
            for pos, w in ring.records(mq, cap, BASE, mq[L.I_HEAD], mq[L.I_TAIL]):
                mq[w] = L.ACKED if mq[w] & 0xFF != L.PAD else mq[w]
            ring.advance_head(mq, cap, BASE)
            assert mq[L.I_HEAD] == mq[L.I_TAIL]
            written = []
        written.append((_append(mm, mq, cap, [size], first_id=i + 1)[0], i + 1))
    walked = [(pos, mq[w + L.R_MSG_ID]) for pos, w in ring.records(mq, cap, BASE, mq[L.I_HEAD], mq[L.I_TAIL])
              if mq[w] & 0xFF != L.PAD]
    assert walked == written


@pytest.mark.parametrize("cap", [256, 4096])
def test_place_never_lets_a_record_straddle_the_lap_end(cap):
    mm, mq = _segment(cap)
    for tail in range(0, 2 * cap, 8):
        for size in (48, 56, 200):
            if size > cap:
                continue
            pos, a = ring.place(mm, BASE, cap, tail, size)
            assert pos >= tail and pos % cap + size <= cap and a == BASE + pos % cap


def test_commit_publishes_the_records_and_owes_posts_to_sleepers_only():
    cap = 4096
    mm, mq = _segment(cap)
    pos = _append(mm, mq, cap, [64, 64])
    mq[L.I_TAIL] = 0  # written, not yet published
    mq[L.I_NEXT_ID] = 1
    assert ring.commit(mq, pos[-1] + 64, 3, 2) == 0  # nobody asleep: no post
    assert (mq[L.I_TAIL], mq[L.I_NEXT_ID], mq[L.I_READY]) == (128, 3, 2)
    mq[L.I_CWAIT] = 3  # three sleepers, one posted already
    mq[L.I_CPOSTED] = 1
    assert ring.commit(mq, 192, 4, 1) == 1 and mq[L.I_CPOSTED] == 2
    assert ring.commit(mq, 256, 6, 5) == 1 and mq[L.I_CPOSTED] == 3  # no more than are asleep
    assert ring.commit(mq, 320, 7, 0) == 0 and mq[L.I_READY] == 8  # a delayed put's: counted by its caller


def test_a_queues_commit_is_written_once_in_python_and_once_in_c():
    """The ready count moves only in ring.py (commit, commit_fills) and takes.py (a record made
    ready again), and C stores a queue's tail only in commit, commit_fills and a lap reset."""
    import os
    import re

    engine = os.path.dirname(os.path.dirname(ring.__file__))
    writers = set()
    for folder, _dirs, files in os.walk(engine):
        for f in files:
            if f.endswith(".py") and re.search(r"mq\[(L\.)?I_READY\] \+=", open(os.path.join(folder, f)).read()):
                writers.add(f)
    assert writers == {"ring.py", "takes.py"}
    c = open(os.path.join(engine, "_fast.c")).read()
    assert len(re.findall(r"__atomic_store_n\(&h\[H_TAIL\]", c)) == 2  # commit_fills, commit
    assert len(re.findall(r"h\[H_TAIL\] = ", c)) == 1  # the lap reset (an empty ring, nothing to publish)
