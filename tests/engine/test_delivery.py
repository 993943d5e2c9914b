"""``Delivery``: a handle on the C paths builds ``CDelivery``, whose fields live in
``_fast.DeliveryBase`` (the C takes build the object directly), one on the Python paths
``PythonDelivery``, whose fields are slots; either way they behave as slots, and both are
``Delivery``s with its methods and properties."""

import gc
import os
import weakref

import pytest

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.queues.delivery import CDelivery, Delivery, PythonDelivery


def test_the_fields_come_from_the_c_base_only_in_the_c_build():
    assert Delivery.__slots__ == () and Delivery.__mro__ == (Delivery, object)  # methods only, no fields
    assert PythonDelivery.__mro__ == (PythonDelivery, Delivery, object)
    if os.environ.get("SHMQ_PURE_PYTHON"):
        assert not cpaths.FAST and CDelivery is None
    elif cpaths.FAST:
        assert CDelivery.__mro__ == (CDelivery, cpaths.C.DeliveryBase, Delivery, object)
        assert CDelivery.__slots__ == ()  # (its instances have no __dict__)
    assert shmq.Delivery is Delivery


def test_a_delivery_from_any_path_has_the_same_fields_and_methods(impl, broker):
    q = broker.create_queue("q")
    q.put(b"warm-up")
    q.get().ack()  # (the first get of a handle registers it: the hot paths need that)
    q.put_many([b"one", b"two", b"three"], headers=[{"k": 1}, None, None])
    got = [q.get(), *q.get_many(1), q.get(copy=False)]
    for d in got:
        assert type(d) is (CDelivery if impl == "fast" else PythonDelivery) and isinstance(d, shmq.Delivery)
        assert (d.queue, d.attempt, d.priority, d.group, d.has_options) == ("q", 1, 0, None, False)
        assert d._raw is None  # until a serializer loads the body
        with pytest.raises(AttributeError):
            d.anything = 1  # slots: no __dict__
    assert [(d.id, bytes(d.body), d.headers) for d in got] == [(2, b"one", {"k": 1}), (3, b"two", {}),
                                                               (4, b"three", {})]
    got[0].body = b"replaced"  # writable, as a slot is (a serializer loads into it)
    assert got[0].body == b"replaced" and repr(got[0]) == "<Delivery q#2 attempt=1 8B>"
    with got[1].process():
        pass
    q.ack_many([got[0], got[2]])
    assert q.stats().acked_total == 4
    q.close()


@pytest.mark.parametrize("build", [pytest.param("c", marks=pytest.mark.skipif(
    not cpaths.FAST, reason="the C hot paths are off")), "python"])
def test_the_python_constructor_takes_the_same_arguments(broker, build):
    q = broker.create_queue("q")
    make = CDelivery if build == "c" else PythonDelivery
    d = make(q, 0, 7, 2, b"body", None)
    assert (d._q, d._pos, d.id, d.attempt, d.body, d._hraw, d._enq) == (q, 0, 7, 2, b"body", None, 0)
    d = make(q, 8, 9, 1, b"", b"\x81\xa1k\x01", enq_ns=5)
    assert (d.headers, d.enqueued_at) == ({"k": 1}, 5e-9)
    with pytest.raises(TypeError):
        make(q, 0, 1)
    q.close()


def test_a_delivery_in_a_cycle_with_its_handle_is_collected(impl, broker):
    broker.create_queue("q")
    q = broker.queue("q", prefetch=5)  # the handle keeps its un-settled deliveries: a cycle
    q.put(b"x")
    q.get()
    alive = weakref.ref(q)
    del q
    gc.collect()
    assert alive() is None


def test_set_delivery_class_refuses_a_class_with_fields_of_its_own():
    if not cpaths.FAST:
        pytest.skip("the C hot paths are off")

    class Fat(cpaths.C.DeliveryBase):
        pass  # (a __dict__: on Python 3.12 a managed one, outside the basic size)

    class Weak(cpaths.C.DeliveryBase):
        __slots__ = ("__weakref__",)

    class Slotted(cpaths.C.DeliveryBase):
        __slots__ = ("extra",)

    try:
        for bad in (Fat, Weak, Slotted, int, "Delivery", PythonDelivery, Delivery):
            with pytest.raises(TypeError, match="__slots__"):
                cpaths.C.set_delivery_class(bad)
    finally:  # a class let through would stay installed for every later test of this process
        cpaths.C.set_delivery_class(CDelivery)
