"""Keepalive (``d.keepalive()``, ``d.process(renew=True)``): a lease renewed in the
background is not redelivered to another process however long the job; settling stops
the renewal; a lost lease ends it quietly; a SIGKILLed holder's message comes back. On
the local, blocking TCP and asyncio deliveries."""

import asyncio
import os
import signal
import subprocess
import sys
import threading

import pytest

import shmq
from shmq import DeliveryExpired, Keepalive
from shmq.model import keepalive
from shmq.engine.queues.delivery import Delivery
from tests._wait import wait_for

VIS_S = 1.5  # the queue's visibility timeout
HELD_S = 5.5  # how long the holder keeps it: 3.7 visibility timeouts

# a rival consumer in another process: waits up to SECONDS for a message, says what it got
RIVAL = """
import sys, shmq
where, qname, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
b = shmq.connect(where) if where.startswith("tcp://") else shmq.connect(namespace=where)
try:
    d = b.queue(qname).get(timeout=seconds)
except shmq.QueueEmpty:
    print("nothing", flush=True)
else:
    print(f"got {d.body.decode()} attempt {d.attempt}", flush=True)
    d.ack()
b.close()
"""

# a holder in another process: takes the message, keeps it alive, says so, then waits to be killed
HOLDER = """
import sys, time, shmq
b = shmq.connect(namespace=sys.argv[1])
d = b.queue(sys.argv[2]).get(timeout=30)
d.keepalive()
print(f"holding {d.body.decode()}", flush=True)
sys.stdin.read()  # until the test kills it
"""


def _rival(where, qname, seconds):
    out = subprocess.run([sys.executable, "-c", RIVAL, where, qname, str(seconds)], capture_output=True, text=True,
                         timeout=seconds + 60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(params=["local", "tcp"])
def where(request, broker):
    """(the broker the holder uses, what the rival process connects to)."""
    broker.create_queue("jobs", visibility_timeout=VIS_S)
    if request.param == "local":
        yield broker, broker.namespace
        return
    from tests.conftest import ThreadedServer

    srv = ThreadedServer(broker.namespace)
    remote = shmq.connect(srv.url)
    try:
        yield remote, srv.url
    finally:
        remote.close()
        srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("form", ["keepalive", "process"])
def test_a_kept_lease_is_not_redelivered_to_another_process(where, form):
    b, rival_at = where
    q = b.queue("jobs")
    q.put(b"long")
    d = q.get(timeout=5)
    if form == "keepalive":
        with d.keepalive() as ka:
            assert isinstance(ka, Keepalive) and ka.every == pytest.approx(VIS_S / 3)
            assert _rival(rival_at, "jobs", HELD_S) == "nothing"
            assert ka.active and ka.renewals >= 3
            d.ack()
            assert not ka.active and ka.error is None
    else:
        with d.process(renew=True):
            assert _rival(rival_at, "jobs", HELD_S) == "nothing"
    st = q.stats()
    assert (st.enqueued_total, st.acked_total, st.redelivered_total, st.in_flight, st.ready) == (1, 1, 0, 0, 0)
    assert keepalive._live == {}


@pytest.mark.slow
def test_without_keepalive_the_lease_lapses_and_another_process_gets_it(where):
    b, rival_at = where
    q = b.queue("jobs")
    q.put(b"long")
    d = q.get(timeout=5)
    assert _rival(rival_at, "jobs", HELD_S) == "got long attempt 2"
    with pytest.raises(DeliveryExpired, match="no longer leased"):
        d.ack()


@pytest.mark.slow
def test_asyncio_keepalive_holds_the_lease(broker, tcp_server):
    broker.create_queue("jobs", visibility_timeout=VIS_S)

    async def main():
        b = await shmq.aio.connect(tcp_server.url)
        try:
            q = await b.queue("jobs")
            await q.put(b"one")
            d = await q.get(timeout=5)
            async with d.keepalive() as ka:
                assert await asyncio.to_thread(_rival, tcp_server.url, "jobs", HELD_S) == "nothing"
                assert ka.active and ka.renewals >= 3 and ka.every == pytest.approx(VIS_S / 3)
            assert not ka.active and ka.error is None
            await d.ack()  # stopped with its lease about 3 * every long: still ours
            await q.put(b"three")
            d = await q.get(timeout=5)
            async with d.process(renew=True):
                assert await asyncio.to_thread(_rival, tcp_server.url, "jobs", HELD_S) == "nothing"
            assert keepalive._live == {}
            return await q.stats()
        finally:
            await b.close()

    st = asyncio.run(main())
    assert (st.enqueued_total, st.acked_total, st.redelivered_total, st.in_flight) == (2, 2, 0, 0)


@pytest.mark.parametrize("settle", ["ack", "nack", "reject", "ack_many", "nack_many", "reject_many"])
def test_settling_stops_the_renewal(any_broker, settle):
    q = any_broker.create_queue("jobs", visibility_timeout=30)
    q.put(b"x")
    d = q.get(timeout=5)
    plain = type(d)
    ka = d.keepalive(every=0.05)
    wait_for(lambda: ka.renewals >= 2, what="two renewals")
    if settle.endswith("_many"):
        getattr(q, settle)([d])
    else:
        getattr(d, settle)()
    assert not ka.active and ka.error is None
    assert keepalive._live == {} and type(d) is plain  # nothing left to renew it
    done = ka.renewals
    d2 = q.get(timeout=5) if settle.startswith("nack") else None  # requeued: leased to us again, renewed by no one
    if d2 is not None:
        assert d2.attempt == 2
        d2.ack()
    assert ka.renewals == done


def test_stop_and_the_with_block_end_the_renewal(broker):
    q = broker.create_queue("jobs", visibility_timeout=30)
    q.put(b"x")
    d = q.get()
    with d.keepalive(every=0.05) as ka:
        wait_for(lambda: ka.renewals >= 1, what="a renewal")
    assert not ka.active and keepalive._live == {} and type(d) is q.paths.Delivery and isinstance(d, Delivery)
    ka2 = d.keepalive(every=0.05)
    ka3 = d.keepalive(every=0.05)  # a second one replaces the first
    assert not ka2.active and ka3.active and list(keepalive._live.values()) == [ka3]
    ka3.stop()
    ka3.stop()  # (twice: nothing more)
    d.ack()
    assert q.stats().acked_total == 1


def test_a_lost_lease_ends_the_renewal_quietly_and_the_settle_raises(any_broker):
    q = any_broker.create_queue("jobs", visibility_timeout=30)
    q.put(b"x")
    d = q.get(timeout=5, visibility_timeout=0.1)  # lapses long before the first renewal
    errors = []
    old_hook = threading.excepthook
    threading.excepthook = errors.append
    try:
        ka = d.keepalive(every=1.0)
        wait_for(lambda: not ka.active, what="the keepalive to end")
    finally:
        threading.excepthook = old_hook
    assert errors == [] and ka.renewals == 0
    assert isinstance(ka.error, DeliveryExpired)
    assert keepalive._live == {}
    with pytest.raises(DeliveryExpired, match="no longer leased"):
        d.ack()
    # the renewer still serves the next one
    d = q.get(timeout=5)
    ka = d.keepalive(every=0.05)
    wait_for(lambda: ka.renewals >= 1, what="a renewal")
    d.ack()


def test_every_is_checked(broker):
    q = broker.create_queue("jobs")
    q.put(b"x")
    d = q.get()
    with pytest.raises(ValueError, match="every must be > 0 seconds"):
        d.keepalive(every=0)
    with pytest.raises(TypeError, match="every must be a number of seconds"):
        d.keepalive(every="5")
    assert keepalive._live == {}
    d.ack()


def test_a_forked_child_renews_nothing_of_the_parents(broker):
    q = broker.create_queue("jobs", visibility_timeout=30)
    q.put(b"x")
    q.put(b"y")
    d = q.get()
    ka = d.keepalive(every=0.05)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an empty list, its own thread on its first keepalive
        code = 1
        try:
            if keepalive._live == {} and keepalive._renewer is None:
                mine = q.get(timeout=5)
                kept = mine.keepalive(every=0.05)
                wait_for(lambda: kept.renewals >= 1, what="the child's renewal")
                mine.ack()
                code = 0
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    assert os.read(r, 1) == b"\0"
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    assert ka.active and list(keepalive._live.values()) == [ka]
    d.ack()
    assert q.stats().acked_total == 2


@pytest.mark.slow
def test_a_sigkilled_holder_keeps_nothing_alive(broker):
    q = broker.create_queue("jobs", visibility_timeout=VIS_S)
    q.put(b"job")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.namespace, "jobs"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline().strip() == "holding job"
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(30) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
        holder.stdin.close()
        holder.stdout.close()
    d = q.get(timeout=30)
    assert (d.body, d.attempt) == (b"job", 2)
    d.ack()
