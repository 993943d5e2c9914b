"""Busy polling (shmq.busypoll): the adaptive window, the blocking client's spin on its
socket, the loop's spin after a touch, and the server's and the clients' settings."""

import asyncio
import socket
import select
import threading
import time

import pytest

import shmq
from shmq import busypoll
from shmq.busypoll import PAUSE_FIRST_S, PAUSE_MOST_S, LoopSpin, Window, check_busy_poll_us, spin_until_readable
from shmq.client.options import ConnectOptions
from shmq.server.limits import Limits
from tests._wait import wait_for
from tests.conftest import ThreadedServer
from tests.test_cli_scripts import one_line_error, shmq_cli

LOOPS = ["asyncio"] + (["uvloop"] if __import__("importlib").util.find_spec("uvloop") else [])


def _new_loop(kind):
    if kind == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


# ---------------------------------------------------------------- the window
def test_the_window_halves_after_each_miss_down_to_a_32nd_and_comes_back_after_a_short_sleep():
    w = Window(320)
    assert (w.most, w.least, w.now) == (320e-6, 10e-6, 320e-6)
    for expected in (160e-6, 80e-6, 40e-6, 20e-6, 10e-6, 10e-6):
        w.missed(time.perf_counter())
        assert w.now == pytest.approx(expected)
    w.came()  # what it waited for came at once after the miss: a longer spin would have caught it
    assert w.now == w.most
    w.missed(time.perf_counter() - 1.0)  # began a second ago: it came late
    w.came()
    assert w.now == pytest.approx(160e-6)
    w.came()  # nothing missed since: nothing to learn
    assert w.now == pytest.approx(160e-6)


def test_a_preemption_pauses_spinning_doubling_while_it_recurs_and_a_rare_one_costs_one_first_pause():
    w = Window(100)
    w.preempted(100.0)
    assert (w.off_until, w.pause) == (100.0 + PAUSE_FIRST_S, PAUSE_FIRST_S)
    pauses = []
    for _ in range(10):  # each preempted again just after its pause ended: a loaded host
        w.preempted(w.off_until + 0.001)
        pauses.append(w.pause)
    assert pauses == [min(PAUSE_FIRST_S * 2 ** k, PAUSE_MOST_S) for k in range(1, 11)]
    assert pauses[-1] == PAUSE_MOST_S
    w.preempted(w.off_until + PAUSE_MOST_S + 1.0)  # long after the last pause: the first in a while
    assert w.pause == PAUSE_FIRST_S


class _Poller:
    """A poller that counts its looks and is never readable."""

    def __init__(self):
        self.looks = 0

    def poll(self, timeout):
        self.looks += 1
        return []


def test_no_spin_while_paused_and_a_yield_that_took_a_slice_pauses_it(monkeypatch):
    w, poller = Window(10_000), _Poller()
    w.off_until = time.perf_counter() + 60.0  # paused
    assert spin_until_readable(poller, w) is False and poller.looks == 0  # not one look: the caller sleeps
    w = Window(10_000)

    def a_slice_elsewhere():  # the yield gave the CPU to a CPU-bound process for a slice
        end = time.perf_counter() + 2 * busypoll._PREEMPTED_S
        while time.perf_counter() < end:
            pass

    monkeypatch.setattr(busypoll, "_yield", a_slice_elsewhere)
    began = time.perf_counter()
    assert spin_until_readable(poller, w) is False and poller.looks == 1
    assert w.off_until > began + PAUSE_FIRST_S * 0.99 and w.now == w.most  # paused; its window as it was
    assert spin_until_readable(poller, w) is False and poller.looks == 1


@pytest.mark.parametrize("value", [-1, 10_001, 1.5, "100", True, None])
def test_a_bad_window_is_refused_in_one_line(value):
    with pytest.raises(ValueError, match=r"^busy_poll_us must be an int of microseconds from 0 to 10000, not "):
        check_busy_poll_us(value)
    with pytest.raises(ValueError, match=r"^busy_poll_us must be an int"):
        ConnectOptions(busy_poll_us=value)
    with pytest.raises(ValueError, match=r"^busy_poll_us must be an int"):
        Limits(busy_poll_us=value)


def test_the_server_refuses_a_bad_busy_poll_in_one_line(namespace):
    one_line_error(shmq_cli("server", "--busy-poll-us", "-1", "--namespace", namespace), 2,
                   "shmq: error: Invalid value for '--busy-poll-us': -1 is not in the range 0<=x<=10000")


# ---------------------------------------------------------------- the blocking client's spin
def _pair():
    a, b = socket.socketpair()
    poller = select.poll()
    poller.register(a, select.POLLIN)
    return a, b, poller


def test_a_spin_sees_bytes_that_come_while_it_spins():
    a, b, poller = _pair()
    try:
        w = Window(10_000)  # 10 ms: the writer's thread has time to start
        sent = threading.Event()

        def write():
            sent.wait(5)
            b.send(b"x")

        t = threading.Thread(target=write)
        t.start()
        sent.set()
        caught = spin_until_readable(poller, w)
        t.join(5)
        if caught:  # (False only where the CPU was wanted by another process meanwhile)
            assert a.recv(10) == b"x" and w.now == w.most and w.missed_at is None
        else:
            assert a.recv(10) == b"x"
    finally:
        a.close()
        b.close()


def test_a_spin_that_catches_nothing_ends_within_its_window_and_halves_it():
    a, b, poller = _pair()
    try:
        w = Window(2_000)
        began = time.perf_counter()
        assert spin_until_readable(poller, w) is False
        assert time.perf_counter() - began < 1.0  # the window (2 ms) or less: a bound, not a speed
        assert w.now in (w.most, w.most / 2)  # halved, or as it was if the CPU was wanted
    finally:
        a.close()
        b.close()


def test_no_window_no_spin():
    a, b, poller = _pair()
    try:
        b.send(b"x")
        assert spin_until_readable(poller, Window(0)) is False  # even with bytes there: the caller reads
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- the loop's spin
@pytest.mark.parametrize("kind", LOOPS)
def test_a_touch_keeps_the_loop_turning_for_its_window_then_stops(kind):
    loop = _new_loop(kind)
    try:
        spin = _CountingSpin(loop, 5_000)

        async def main():
            spin.touch()
            assert spin.running
            began = loop.time()
            while spin.running and loop.time() - began < 5:
                await asyncio.sleep(0.001)  # a timer: without the spin, the loop sleeps a millisecond a turn
            return loop.time() - began

        assert loop.run_until_complete(main()) < 5 and not spin.running
        assert spin.turns > 1  # it turned the loop, not once and asleep
        assert spin.window.now == spin.window.most / 2  # it caught nothing: halved
    finally:
        loop.close()


class _CountingSpin(LoopSpin):
    """Counts its turns; never takes a yield for contention (the tests run beside others)."""

    __slots__ = ("turns",)
    contended_s = 10.0

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.turns = 0

    def _spin(self):
        self.turns += 1
        super()._spin()


class _WantedSpin(_CountingSpin):
    __slots__ = ()
    contended_s = -1.0  # every yield took too long: the CPU is wanted


def test_a_spin_ends_at_its_first_yield_when_the_cpu_is_wanted_its_window_as_it_was():
    loop = asyncio.new_event_loop()
    try:
        spin = _WantedSpin(loop, 5_000)

        async def main():
            spin.touch()
            began = loop.time()
            while spin.running and loop.time() - began < 5:
                await asyncio.sleep(0.001)

        loop.run_until_complete(main())
        assert not spin.running and spin.turns == 1 and spin.window.now == spin.window.most
    finally:
        loop.close()


class _PreemptedSpin(_CountingSpin):
    __slots__ = ()
    contended_s = preempted_s = -1.0  # every yield gave the CPU away for a slice: the host is loaded


def test_a_loop_spin_preempted_pauses_and_a_touch_meanwhile_starts_none():
    loop = asyncio.new_event_loop()
    try:
        spin = _PreemptedSpin(loop, 5_000)

        async def main():
            spin.touch()
            began = loop.time()
            while spin.running and loop.time() - began < 5:
                await asyncio.sleep(0.001)
            spin.touch()  # paused: no spin
            return spin.running

        assert loop.run_until_complete(main()) is False
        assert spin.turns == 1 and spin.window.off_until > time.perf_counter()
        assert spin.window.now == spin.window.most
    finally:
        loop.close()


@pytest.mark.parametrize("kind", LOOPS)
def test_a_client_spin_ends_once_nothing_is_awaited(kind):
    loop = _new_loop(kind)
    try:
        pending = {1: None}
        spin = _CountingSpin(loop, 10_000, pending.__len__)

        async def main():
            spin.touch()
            await asyncio.sleep(0)  # a turn spinning
            pending.clear()  # the reply came
            began = loop.time()
            while spin.running and loop.time() - began < 5:
                await asyncio.sleep(0)

        loop.run_until_complete(main())
        assert not spin.running and spin.window.now == spin.window.most  # ended by what it spun for, not missed
    finally:
        loop.close()


def test_a_loop_spin_of_no_window_never_runs():
    loop = asyncio.new_event_loop()
    try:
        spin = LoopSpin(loop, 0)
        spin.touch()
        assert not spin.running
    finally:
        loop.close()


class _Peer:
    spin_epoch = -1


def test_a_crowded_server_does_not_spin_until_an_epoch_passes_uncrowded():
    """A server's spin (``most_peers``: its CPUs) starts on a touch while at most that many
    peers touched it in this epoch and the one before; a peer past that count stops it for
    the rest of the epoch and the next; an epoch after an idle one is not crowded."""
    loop = asyncio.new_event_loop()
    try:
        spin = _CountingSpin(loop, 5_000, None, 2)
        a, b, c = _Peer(), _Peer(), _Peer()
        e = busypoll.CROWD_EPOCH_S

        def starts(peer, now):
            spin.running = False  # (the spin the touch starts is not run: only whether it starts)
            spin.touch(peer, now)
            return spin.running

        assert starts(a, 0.0) and starts(b, 0.001) and starts(a, 0.002)  # two peers: spins
        assert not starts(c, 0.003) and not starts(a, 0.004)  # a third: crowded, this epoch
        assert not starts(a, e + 0.001) and spin.peers == 1  # the next epoch: the last was crowded
        assert starts(b, 2 * e + 0.001)  # the one after: one peer in the last
        assert starts(a, 2 * e + 0.002) and not starts(c, 2 * e + 0.003)  # crowded again
        assert starts(c, 10.0)  # after an idle while: that count is old, not crowded
        unpaced = LoopSpin(loop, 5_000)  # a client's: peers not counted
        unpaced.touch(a, 0.0)
        assert unpaced.running and unpaced.epoch == 0
    finally:
        loop.close()


# ---------------------------------------------------------------- the server and the clients
@pytest.mark.parametrize("busy", [0, 200])
def test_the_server_spins_after_a_read_then_stops_and_serves_alike(broker, busy):
    srv = ThreadedServer(broker.namespace, limits=Limits(busy_poll_us=busy))
    try:
        broker.create_queue("q")
        with shmq.connect(srv.url, busy_poll_us=busy) as remote:
            q = remote.queue("q")
            for i in range(50):
                q.put(b"%d" % i)
            got = [q.get(timeout=5) for _ in range(50)]
            q.ack_many(got)
            assert [d.body for d in got] == [b"%d" % i for i in range(50)]
        spin = srv.server.spin
        assert spin.window.most == busy / 1e6
        wait_for(lambda: not spin.running, timeout=5, what="the server's spin to end")
        st = broker.queue("q").stats()
        assert (st.ready, st.in_flight, st.acked_total) == (0, 0, 50)
    finally:
        srv.stop()


@pytest.mark.parametrize("busy", [0, 100])
def test_the_asyncio_client_spins_alike(broker, tcp_server, busy):
    broker.create_queue("q")

    async def main():
        async with await shmq.aio.connect(tcp_server.url, busy_poll_us=busy) as remote:
            q = await remote.queue("q")
            for i in range(20):
                await q.put(b"%d" % i)
            got = [await q.get(timeout=5) for _ in range(20)]
            for d in got:
                await d.ack()
            assert remote._link.spin.window.most == busy / 1e6
            return [d.body for d in got]

    assert asyncio.run(main()) == [b"%d" % i for i in range(20)]
    assert broker.queue("q").stats().acked_total == 20
