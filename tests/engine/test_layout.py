"""Ring arithmetic and record encoding on plain buffers."""

import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmq import mirrors
from shmq.engine.shm import layout as L


def test_record_header_is_48_aligned_bytes():
    assert L.REC_SIZE == 48
    assert L.record_size(0, 0) == 48
    assert L.record_size(0, 1) == 56
    assert L.record_size(3, 5) == 56
    assert L.record_size(0, 8) == 56


def test_a_batch_is_sized_as_each_record_alone():
    for hraw in (b"", b"abc", b"h" * 8, b"h" * 9):
        bodies = [b"", b"x", b"y" * 7, b"z" * 8, b"w" * 100]
        assert L.sized(bodies, hraw) == [(b, hraw, L.record_size(len(hraw), len(b))) for b in bodies]


def test_status_word_round_trips():
    w = L.status_word(L.LEASED, 7, 3)
    assert L.split_status(w) == (L.LEASED, 7, 3)
    assert L.split_status(L.status_word(L.READY)) == (L.READY, L.NO_HOLDER, 0)
    assert L.split_status(L.status_word(L.ACKED, 0, 2**32 - 1)) == (L.ACKED, 0, 2**32 - 1)


def test_record_encodes_into_a_plain_buffer():
    buf = bytearray(256)
    L.REC.pack_into(buf, 64, L.status_word(L.READY, L.NO_HOLDER, 0), 64, 10, 6, 0, 42, 123, L.NEVER)
    status, length, body_len, hdr_len, flags, msg_id, enq, deadline = L.REC.unpack_from(buf, 64)
    assert L.split_status(status)[0] == L.READY
    assert (length, body_len, hdr_len, flags, msg_id, enq, deadline) == (64, 10, 6, 0, 42, 123, L.NEVER)
    # the status word is the record's first 8 bytes, little-endian, so one aligned store commits it
    assert int.from_bytes(buf[64:72], "little") == status


def test_place_fits_before_the_end_of_the_lap():
    assert L.place(0, 64, 1024) == (0, 64)
    assert L.place(960, 64, 1024) == (960, 1024)


def test_place_wraps_to_the_next_lap_when_it_does_not_fit():
    # 1000 % 1024 leaves 24 bytes: the record starts at the next lap
    assert L.place(1000, 64, 1024) == (1024, 1088)
    assert L.place(1024 * 5 + 1000, 64, 1024) == (1024 * 6, 1024 * 6 + 64)


def test_skip_gap_jumps_only_when_a_header_cannot_fit():
    cap = 1024
    assert L.skip_gap(1024 - 48, cap) == 1024 - 48
    assert L.skip_gap(1024 - 40, cap) == 1024
    assert L.skip_gap(2048 + 8, cap) == 2048 + 8


@given(
    cap_laps=st.integers(min_value=2, max_value=64),
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=200),
)
def test_appends_never_straddle_the_end_and_stay_aligned(cap_laps, sizes):
    cap = cap_laps * 64
    tail = 0
    for body_len in sizes:
        size = L.record_size(0, body_len)
        if size > cap:
            continue
        start, end = L.place(tail, size, cap)
        assert start % 8 == 0 and end % 8 == 0
        assert start >= tail and end - start == size
        assert start % cap + size <= cap  # contiguous in the ring
        assert start - tail < size or start % cap == 0  # only skips to a lap start
        tail = end


def test_segment_layout_is_consistent():
    assert L.MUTEX_OFF % 64 == 0
    assert L.HOT_OFF % 8 == 0 and L.COUNTERS_OFF % 8 == 0
    assert L.data_offset(256) % 4096 == 0
    assert L.data_offset(256) >= L.PROCS_OFF + 256 * L.PROC_SIZE
    assert L.segment_size(1 << 20, 256) == L.data_offset(256) + (1 << 20)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4095])
def test_align(n):
    a = L.align(n)
    assert a % 8 == 0 and n <= a < n + 8


def test_fast_c_copies_nothing_of_this_layout():
    """_fast.c takes every offset and constant from _layout.h, generated from layout.py
    (tests/test_mirrors.py holds it fresh): none is written into it by hand."""
    path = mirrors.path("engine/_layout.h")
    source = open(os.path.join(os.path.dirname(path), "_fast.c")).read()
    assert '#include "_layout.h"' in source
    assert not re.search(r"\b(U64|U32)\([a-z]+ \+ \d", source), "a literal offset in _fast.c"
    assert not re.search(r"#define (MUTEX_OFF|HOT_OFF|REC_SIZE|ST_\w+|WALCFG_W|LOG_HEAD|R_\w+)\b", source)


def test_the_return_codes_are_layouts_table_in_c_and_in_cpaths():
    """The C calls' return codes are declared once (layout.RETURNS): _layout.h's enum, the
    plain ints cpaths hands the engine, and what the built _fast exports are its values."""
    names = [name for name, _value, _meaning in L.RETURNS]
    assert len(set(names)) == len(names) and len({v for _n, v, _m in L.RETURNS}) == len(names)
    header = L.c_header()
    for name, value, _meaning in L.RETURNS:
        assert type(getattr(L, name)) is int and getattr(L, name) == value < 0
        assert re.search(rf"^    {name} = {value}, /\*", header, re.M), name
    fast = pytest.importorskip("shmq.engine._fast")
    exported = {name: getattr(fast, name[2:]) for name in names if hasattr(fast, name[2:])}
    assert set(exported) == {"R_BUSY", "R_OWNERDEAD", "R_FALLBACK", "R_EXPIRED", "R_DELETED", "R_EMPTY", "R_SLEEP",
                             "R_FULL"}
    assert exported == {name: getattr(L, name) for name in exported}, "a stale _fast build: pip install -e ."
    from shmq.engine.shm import cpaths

    if cpaths.FAST:
        assert {n: getattr(cpaths, n[2:]) for n in exported} == exported
        assert all(type(getattr(cpaths, n[2:])) is int for n in exported)


def test_named_record_offsets_match_the_record_struct():
    rec = bytearray(L.REC_SIZE)
    L.REC.pack_into(rec, 0, 1, 2, 3, 4, 5, 6, 7, 8)
    for i, field in enumerate(L.REC_FIELDS):
        size = 8 if i in (0, 5, 6, 7) else 4
        assert int.from_bytes(rec[L.REC_OFFSETS[field]:L.REC_OFFSETS[field] + size], "little") == i + 1
    words = memoryview(rec).cast("Q")
    assert (words[L.R_STATUS], words[L.R_LENGTH] & 0xFFFFFFFF, words[L.R_MSG_ID], words[L.R_ENQ],
            words[L.R_DEADLINE]) == (1, 2, 6, 7, 8)
