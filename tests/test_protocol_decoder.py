"""``FrameDecoder``'s buffer: received bytes fed from a buffer the caller reuses (as the
server's shared receive buffer is), room made ahead with ``expect``, and a big buffer
let go once drained."""

from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.protocol import Frame, FrameDecoder, MsgType, encode_frame, encode_request
from shmq.protocol.frames import _COPY_BELOW
from tests.test_protocol import HYPOTHESIS_STRUCTURED, chunked, frames


@HYPOTHESIS_STRUCTURED
@given(frame_list=st.lists(frames, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=40),
       expects=st.lists(st.integers(0, 5000), max_size=40))
def test_frames_fed_from_a_reused_buffer_with_room_made_ahead_round_trip(frame_list, cuts, expects):
    data = b"".join(encode_frame(f) for f in frame_list)
    shared = bytearray(max(len(data), 1))  # every chunk lands in the same bytes, then is overwritten
    dec = FrameDecoder()
    out = []
    for i, chunk in enumerate(chunked(data, cuts)):
        if i < len(expects):
            dec.expect(expects[i])
        shared[: len(chunk)] = chunk
        dec.feed(memoryview(shared)[: len(chunk)])
        out.extend(dec.frames())
        shared[: len(chunk)] = b"\xff" * len(chunk)  # the caller reuses its buffer at once
    assert out == frame_list
    assert dec.buffered == 0


def test_the_rest_of_a_frame_made_room_for_lands_in_that_room():
    frame = encode_request(MsgType.PRODUCE_BATCH, 1, {"queue": "q", "messages": [{"body": b"x" * 1000}] * 1000})
    dec = FrameDecoder()
    dec.feed(frame[:60_000])
    assert dec.next_frame() is None
    dec.expect(len(frame) - 60_000)
    room = dec._buf
    for i in range(60_000, len(frame), 50_000):
        dec.feed(frame[i : i + 50_000])
        assert dec._buf is room  # copied in once: never moved to a bigger buffer
    assert len(room) == len(frame)  # exactly the frame (its header held with it, until it is whole)
    (got,) = list(dec.frames())
    assert got.msg_id == 1 and len(got.payload["messages"]) == 1000
    assert len(dec._buf) == 0  # a big buffer goes once drained: an idle connection holds little


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300), st.integers(1, 5000))
def test_the_room_grows_to_at_most_twice_what_is_held(n_frames, chunk):
    data = b"".join(encode_request(MsgType.PING, i) + encode_frame(Frame(MsgType.PRODUCE, i, {"body": b"y" * 300}))
                    for i in range(n_frames))
    dec = FrameDecoder()
    got = most = 0
    for i in range(0, len(data), chunk):
        dec.feed(data[i : i + chunk])
        most = max(most, dec.buffered)
        assert len(dec._buf) <= max(4096, 2 * most)  # room: at most twice the most it held
        got += len(list(dec.frames()))
    assert got == 2 * n_frames and dec.buffered == 0


@HYPOTHESIS_STRUCTURED
@given(frame_list=st.lists(frames, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_next_parts_gives_the_fields_of_the_frames_next_frame_gives(frame_list, cuts):
    """The server's ``next_parts`` (a plain tuple per frame) and ``next_frame`` read the
    same frames, in any chunking."""
    data = b"".join(encode_frame(f) for f in frame_list)
    dec = FrameDecoder()
    out = []
    for chunk in chunked(data, cuts):
        dec.feed(chunk)
        while (parts := dec.next_parts()) is not None:
            out.append(parts)
    assert out == [(f.type, f.msg_id, f.payload, f.status, f.version) for f in frame_list]
    assert dec.buffered == 0


def test_payloads_small_and_big_decode_alike_around_the_copy_threshold():
    """A small payload is decoded from a copy, a big one in place: the same frames either
    side of the line, whole or byte by byte, with bytes after them in the buffer or not."""
    sizes = range(_COPY_BELOW - 40, _COPY_BELOW + 40)
    expected = [Frame(MsgType.PRODUCE, n, {"queue": "q", "body": b"b" * n}) for n in sizes]
    data = b"".join(encode_frame(f) for f in expected)
    assert {len(encode_frame(f)) - 16 for f in expected} >= {_COPY_BELOW, _COPY_BELOW + 1}
    for step in (len(data), 1, 4097):
        dec = FrameDecoder()
        out = []
        for i in range(0, len(data), step):
            dec.feed(data[i : i + step])
            out.extend(dec.frames())
        assert out == expected


@HYPOTHESIS_STRUCTURED
@given(frame_list=st.lists(frames, min_size=1, max_size=6), cuts=st.lists(st.integers(0, 10_000), max_size=20),
       takes=st.lists(st.integers(0, 3), max_size=20))
def test_offer_hands_on_whole_frames_from_a_frames_start(frame_list, cuts, takes):
    """``offer`` gives ``take`` the held bytes from a frame's start, however they came and
    whatever ``next_parts`` already looked at; the whole frames ``take`` says it took are
    consumed, and the decoder goes on with the rest as if they had never come."""
    encoded = [encode_frame(f) for f in frame_list]
    dec, out, i = FrameDecoder(), [], 0  # i: frames taken or decoded so far

    def take(view, k):
        held = bytes(view)
        assert b"".join(encoded[i:]).startswith(held)  # from a frame's start: the next one's
        n, whole = 0, 0
        while whole < k and i + whole < len(encoded) and n + len(encoded[i + whole]) <= len(held):
            n += len(encoded[i + whole])
            whole += 1
        return (n, whole) if whole else None

    for j, chunk in enumerate(chunked(b"".join(encoded), cuts)):
        dec.feed(chunk)
        took = dec.offer(take, takes[j] if j < len(takes) else 1)
        if took is not None:
            out.extend(frame_list[i : i + took[1]])
            i += took[1]
        for f in dec.frames():
            out.append(f)
            i += 1
    assert out == frame_list and dec.buffered == 0


def test_offer_calls_nothing_without_a_header_or_after_a_failure():
    calls = []
    dec = FrameDecoder(max_frame_bytes=100)
    dec.feed(encode_request(MsgType.PING, 1)[:10])
    assert dec.offer(lambda view: calls.append(bytes(view))) is None and calls == []
    dec.feed(encode_request(MsgType.PRODUCE, 2, {"queue": "q", "body": b"x" * 200})[:20])
    try:
        list(dec.frames())
    except Exception:
        pass
    assert dec.offer(lambda view: calls.append(bytes(view))) is None and calls == []
