"""numpy arrays as messages (issue 45, item 3): ``put_array`` and ``d.array()`` on every transport,
the array read where it lies in the queue's memory and guarded there until settled, and a
body given as any buffer copied once, into the queue."""

import array
import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq
from shmq.engine.shm import cpaths
from shmq.model import arrays
from shmq.model.messages import as_buffer

np = pytest.importorskip("numpy")


@pytest.fixture(params=["c", "python"])
def local(request, broker):
    """A local queue whose handle runs the C paths, or Python's."""
    if request.param == "c" and not cpaths.FAST:
        pytest.skip("the C hot paths are off")
    cpaths.set_enabled(request.param == "c")
    try:
        broker.create_queue("q", max_bytes=8 << 20, max_message_bytes=4 << 20)
        q = broker.queue("q")
        assert q.paths.kind == request.param
        yield q
        q.close()
    finally:
        cpaths.set_enabled(True)


_ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
           np.arange(20)[::3], np.arange(24, dtype=">i2").reshape(2, 3, 4).transpose(2, 0, 1), np.zeros((0, 4)),
           np.ones(()), np.array([1 + 2j, 3j]), np.array([True, False]), np.array([b"ab", b"c"])]


@pytest.mark.parametrize("a", _ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_an_array_comes_back_as_it_was_sent(local, a):
    local.put_array(a, headers={"k": "v"})
    d = local.get()
    got = d.array()
    assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    assert not got.flags.writeable and d.headers["k"] == "v"
    if a.flags.c_contiguous or a.flags.f_contiguous:  # sent as its memory lies: the same strides
        assert got.strides == a.strides
    del got
    d.ack()


def test_the_array_is_read_where_it_lies_in_the_queue(local):
    a = np.arange(1 << 16, dtype=np.float64)
    local.put_array(a)
    d = local.get()
    got = d.array()
    start = got.__array_interface__["data"][0]
    ring = np.frombuffer(local._ring, np.uint8)  # (the test looks at the handle's ring: the body is in it)
    lo = ring.__array_interface__["data"][0]
    assert lo <= start and start + got.nbytes <= lo + ring.nbytes
    del got, ring
    d.ack()


def test_a_settle_while_the_array_lives_raises_and_settles_nothing(local):
    local.put_array(np.arange(10))
    d = local.get()
    a = d.array()
    view = a[2:5]
    del a  # (a slice keeps the array's memory: still guarded)
    for settle in (d.ack, lambda: d.nack(), d.reject, lambda: local.ack_many([d])):
        with pytest.raises(BufferError, match="still alive"):
            settle()
        assert local.stats().in_flight == 1
    assert list(view) == [2, 3, 4]
    del view
    d.ack()
    assert local.stats().in_flight == 0 and local.stats().acked_total == 1


def test_a_copy_outlives_the_delivery(local):
    local.put_array(np.arange(5))
    d = local.get()
    a = d.array(copy=True)
    d.ack()
    a[0] = 7
    assert list(a) == [7, 1, 2, 3, 4] and a.flags.writeable


def test_the_consume_loop_does_not_ack_under_a_live_array(local):
    for i in range(3):
        local.put_array(np.full(4, i))
    loop = local.messages()
    d = next(loop)
    a = d.array()
    with pytest.raises(BufferError):
        next(loop)  # (its step acks the one before)
    assert local.stats().in_flight == 1
    del a
    d2 = next(loop)
    assert list(d2.array(copy=True)) == [1] * 4
    loop.close()
    assert local.stats().acked_total == 2


def test_what_is_no_array_is_refused(local):
    with pytest.raises(TypeError, match="numpy array"):
        local.put_array([1, 2, 3])
    with pytest.raises(TypeError, match="plain values"):
        local.put_array(np.array([object()]))
    with pytest.raises(TypeError, match="plain values"):  # (a record dtype: its string does not name it)
        local.put_array(np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]))
    local.put(b"bytes")
    d = local.get()
    with pytest.raises(TypeError, match="holds no array"):
        d.array()
    d.ack()
    local.put(b"\x00" * 8, headers={arrays.ARRAY_HEADER: "<f8;3;8"})  # a header that lies about the body
    d = local.get()
    with pytest.raises(ValueError, match="does not describe"):
        d.array()
    d.ack()


@pytest.mark.parametrize("headers", [None, {}, {"k": "v"}, {"key": "x" * 29}, {"a": 1, "b": b"\0" * 200}])
@pytest.mark.parametrize("a", [np.ones(1 << 16, np.float32), np.ones((3, 5), ">f8"), np.ones((), np.int16),
                               np.ones(7, np.complex128), np.ones(300, np.uint8)], ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_an_array_lies_8_aligned_in_the_queue(local, a, headers):
    """The array header is padded so that the body lies 8-aligned in the ring: numpy's
    aligned loops then run on the array where it lies (unaligned, a sum of 1 MiB of
    float32 took three times as long)."""
    for i in range(3):  # (records of other lengths before it)
        local.put(b"x" * (8 * i + 1))
        local.put_array(a, headers=headers)
    for i in range(3):
        local.get().ack()
        d = local.get()
        got = d.array()
        assert got.flags.aligned and got.__array_interface__["data"][0] % 8 == 0
        assert np.array_equal(got, a) and d.headers == {**(headers or {}), arrays.ARRAY_HEADER: d.headers[arrays.ARRAY_HEADER]}
        assert arrays.ARRAY_HEADER in d.headers and d.headers[arrays.ARRAY_HEADER].rstrip(" ").count(";") == 2
        del got
        d.ack()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["<f4", "<f8", "<i8", ">u2", "|u1", "<c8", "|b1"]),
       st.lists(st.integers(0, 5), max_size=4), st.sampled_from(["C", "F", "step", "T"]))
def test_arrays_of_any_dtype_shape_and_order_come_back(broker, dtype, shape, order):
    q = broker.queue("h") if "h" in broker.list_queues() else broker.create_queue("h", max_bytes=1 << 20)
    a = np.arange(int(np.prod(shape)) if shape else 1).astype(dtype).reshape(shape)
    a = {"C": a, "F": np.asfortranarray(a), "step": a[..., ::2] if a.ndim else a, "T": a.T}[order]
    q.put_array(a)
    d = q.get()
    got = d.array()
    assert got.shape == a.shape and got.dtype == a.dtype and np.array_equal(got, a)
    del got
    d.ack()


# ---------------------------------------------------------------- a body as any buffer
@pytest.mark.parametrize("body", [bytearray(b"abc"), memoryview(b"abc"), array.array("b", b"abc"),
                                  np.frombuffer(b"abc", np.uint8)], ids=lambda b: type(b).__name__)
def test_a_buffer_body_is_put_as_its_bytes(local, body):
    local.put(body)
    d = local.get()
    assert d.body == b"abc"
    d.ack()


def test_a_buffer_in_one_piece_is_not_copied_before_the_queue_copies_it():
    a = np.arange(8, dtype=np.float64)
    view = as_buffer(a)
    assert type(view) is memoryview and view.nbytes == 64 and np.shares_memory(np.frombuffer(view, np.float64), a)
    assert type(as_buffer(a[::2])) is bytes  # (not in one piece: its bytes, copied)
    with pytest.raises(TypeError, match="bytes-like"):
        as_buffer("text")


def test_a_buffer_put_is_the_queues_own_copy(local):
    body = bytearray(b"before")
    local.put(body)
    body[:] = b"after!"
    d = local.get()
    assert d.body == b"before"
    d.ack()


# ---------------------------------------------------------------- the other transports
def test_arrays_over_tcp_and_asyncio(broker, tcp_server):
    broker.create_queue("t", max_bytes=8 << 20, max_message_bytes=4 << 20)
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with shmq.connect(tcp_server.url) as remote:
        q = remote.queue("t")
        q.put_array(np.asfortranarray(a), headers={"k": 1})
        d = q.get()
        got = d.array()
        assert np.array_equal(got, a) and not got.flags.writeable and d.headers["k"] == 1
        d.ack()  # (over TCP the array is the client's own bytes: nothing to guard)
        assert np.array_equal(got, a)

    async def main():
        import shmq.aio

        async with await shmq.aio.connect(tcp_server.url) as b:
            aq = await b.queue("t")
            await aq.put_array(a[:, ::2])
            d = await aq.get()
            assert np.array_equal(d.array(copy=True), a[:, ::2])
            await d.ack()
        async with await shmq.aio.connect(namespace=broker.namespace) as b:
            lq = await b.queue("t")
            await lq.put_array(a)
            d = await lq.get()
            got = d.array()
            with pytest.raises(BufferError):
                await d.ack()
            del got
            await d.ack()

    asyncio.run(main())
