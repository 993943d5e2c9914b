"""TCP handles across fork(), as gunicorn --preload, uwsgi, multiprocessing's fork and
Celery's prefork pool use them: a child that uses the handle it inherited opens its own
connection and never touches its parent's (redis-py's ``_checkpid``), so every child
gets its own replies and the parent's connection stays as it was. Each child is bounded
and killed if it overruns; each parent connects with ``reconnect=False``, so anything a
child did to its connection would fail its next call instead of being healed quietly."""

import asyncio
import multiprocessing
import os
import pickle
import select
import signal
import time

import psutil
import pytest

import shmq
from shmq.client import aio
from tests._wait import drain, wait_for

CHILDREN, EACH = 4, 20
BOUND_S = 30  # for all the children of a test together


@pytest.fixture
def srv(broker, servers):
    s = servers(broker.namespace, "--no-persist")
    yield s
    assert s.stop() == 0


class Child:
    """``fn(*args)`` run in a child of ``os.fork()``, which always ends with ``os._exit``;
    ``outcome()`` waits for it within a bound (killing it past that) and returns what
    ``fn`` returned, or ("error", its error) if it raised."""

    running = []  # killed at the end of each test, if a failure left any

    def __init__(self, fn, *args):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 0
            try:
                os.close(r)
                try:
                    out = fn(*args)
                except BaseException as e:
                    out = ("error", f"{type(e).__name__}: {e}")
                data = pickle.dumps(out)
                with os.fdopen(w, "wb") as f:  # its length first: a grandchild may hold the pipe open
                    f.write(len(data).to_bytes(4, "big") + data)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self._r, self.status = pid, r, None
        Child.running.append(self)

    def ended(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                Child.running.remove(self)
        return self.status is not None

    def kill(self):
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.status = -signal.SIGKILL
            Child.running.remove(self)

    def outcome(self, until: float):
        try:
            wait_for(self.ended, timeout=max(0.0, until - time.monotonic()), what=f"child {self.pid} to exit")
        finally:
            self.kill()
        with os.fdopen(self._r, "rb") as f:
            size = int.from_bytes(f.read(4), "big")
            data = f.read(size)
        assert self.status == 0 and size and len(data) == size, f"child {self.pid} ended with {self.status}"
        return pickle.loads(data)


@pytest.fixture(autouse=True)
def no_child_left():
    yield
    for child in list(Child.running):
        child.kill()


def outcomes(children):
    until = time.monotonic() + BOUND_S
    return [c.outcome(until) for c in children]


def put_some(q, n, prefix=None):
    prefix = os.getpid() if prefix is None else prefix
    return [q.put(f"{prefix}-{i}".encode()) > 0 for i in range(n)].count(True)


# ---------------------------------------------------------------- the blocking client
def test_forked_children_each_put_over_their_own_connection_and_the_parents_stays(broker, srv):
    local = broker.create_queue("q")
    broker.create_stream("s", partitions=1, max_bytes=1 << 20)
    with shmq.connect(srv.url, reconnect=False) as b:
        q, s = b.queue("q"), b.stream("s")
        q.put(b"parent-before")
        link = b._link

        def child():
            return put_some(q, EACH), [s.append(f"{os.getpid()}-{i}".encode()).offset >= 0
                                       for i in range(EACH)].count(True)

        children = [Child(child) for _ in range(CHILDREN)]
        assert outcomes(children) == [(EACH, EACH)] * CHILDREN
        q.put(b"parent-after")  # the parent's own connection, as it was
        s.append(b"parent-after")
        assert b._link is link and b.queue("q").stats().ready == CHILDREN * EACH + 2
    bodies = drain(local)
    assert len(bodies) == len(set(bodies)) == CHILDREN * EACH + 2
    assert {x for x in bodies if not x.startswith(b"parent-")} == {
        f"{c.pid}-{i}".encode() for c in children for i in range(EACH)}
    records = broker.stream("s").read(0, 0, 1000)
    assert len(records) == len({r.value for r in records}) == CHILDREN * EACH + 1
    broker.delete_stream("s")


_inherited = {}  # what a pool's workers inherit: handed as arguments, the handles would be pickled


def _pool_task(task):
    return os.getpid(), put_some(_inherited["q"], EACH, f"task{task}")


def test_a_fork_pool_whose_workers_share_the_parents_handle(broker, srv):
    local = broker.create_queue("q")
    with shmq.connect(srv.url, reconnect=False) as b:
        _inherited["q"] = b.queue("q")
        try:
            with multiprocessing.get_context("fork").Pool(3) as pool:  # terminated on leaving the with
                done = pool.map_async(_pool_task, range(6), chunksize=1).get(BOUND_S)
        finally:
            _inherited.clear()
        assert [n for _, n in done] == [EACH] * 6 and os.getpid() not in {pid for pid, _ in done}
        b.ping()
    bodies = drain(local)
    assert sorted(bodies) == sorted(f"task{t}-{i}".encode() for t in range(6) for i in range(EACH))


def test_a_child_that_closes_its_inherited_handle_leaves_the_parents_connection_open(broker, srv):
    broker.create_queue("q")
    with shmq.connect(srv.url, reconnect=False) as b:
        link = b._link

        def child():
            b.close()  # the child's copy only: no shutdown of the parent's socket
            return b._link.sock is None

        assert outcomes([Child(child)]) == [True]
        b.ping()
        assert b._link is link and b.queue("q").put(b"x") == 1


def test_what_was_bound_to_the_parents_connection_stays_the_parents(broker, srv):
    local = broker.create_queue("q", visibility_timeout=60)
    local.put_many([b"a", b"b"])
    broker.create_stream("s", partitions=1, max_bytes=1 << 16)
    with shmq.connect(srv.url, reconnect=False) as b:
        q = b.queue("q")
        d = q.get(timeout=5)
        it = q.consume(prefetch=1)
        pushed = next(it)
        member = b.stream("s").consumer("g")
        parent = os.getpid()

        def child():
            out = []
            for call in (d.ack, pushed.ack, lambda: next(it), member.poll):
                try:
                    call()
                    out.append("no error")
                except shmq.ShmqError as e:
                    out.append(f"{type(e).__name__}: {e}")
            it.close()
            member.close()  # neither cancels nor leaves anything of the parent's
            return out, q.stats().in_flight

        [(errors, in_flight)] = outcomes([Child(child)])
        ep = b.endpoint
        assert errors == [
            f"DeliveryExpired: delivery q#1 was leased on the connection of process {parent}, of which this process "
            "is a fork: only that process can settle it",
            f"DeliveryExpired: delivery q#2 was leased on the connection of process {parent}, of which this process "
            "is a fork: only that process can settle it",
            f"BrokerUnavailable: the connection to {ep} is process {parent}'s, of which this process is a fork: "
            "what was bound to it stays that process's",
            f"BrokerUnavailable: consumer of group 'g' is a member for the connection of process {parent}, of which "
            "this process is a fork: join in this process (stream.consumer)",
        ]
        assert in_flight == 2  # still the parent's leases
        d.ack()
        pushed.ack()
        assert member.assignment() == [0]
        it.close()
        member.close()
    stats = local.stats()
    assert (stats.ready, stats.in_flight, stats.acked_total) == (0, 0, 2)
    broker.delete_stream("s")


def test_a_child_outliving_its_parent_holds_none_of_the_parents_leases(broker, srv):
    """The child closes its copy of the parent's socket at the fork: when the parent dies
    (its descriptors closed, no shutdown), the server sees the connection end and gives
    the lease back at once, though the child lives on."""
    local = broker.create_queue("q", visibility_timeout=120)
    local.put(b"m")
    hold_r, hold_w = os.pipe()  # the grandchild lives until the write end closes

    def parent():
        b = shmq.connect(srv.url)
        b.queue("q").get(timeout=5)

        def grandchild():
            os.close(hold_w)
            select.select([hold_r], [], [], 60)  # longer than the test waits for the lease
            return "released"

        grand = Child(grandchild)
        Child.running.clear()  # the grandchild is reaped by no one here: the test kills it by pid
        return grand.pid  # and this process ends without closing the connection, as a crash would

    [grand] = outcomes([Child(parent)])
    os.close(hold_r)
    try:
        assert psutil.Process(grand).status() != psutil.STATUS_ZOMBIE
        wait_for(lambda: local.stats().ready == 1, timeout=10, what="the lease to be given back")
        assert psutil.Process(grand).is_running()  # the child lives, and held nothing back
        assert local.stats().in_flight == 0
    finally:
        os.close(hold_w)
        try:
            psutil.Process(grand).wait(10)
        except psutil.NoSuchProcess:
            pass
    assert drain(local) == [b"m"]


# ---------------------------------------------------------------- the asyncio client
async def _aio_put_some(b, n):
    q = await b.queue("q")
    return [await q.put(f"{os.getpid()}-{i}".encode()) > 0 for i in range(n)].count(True)


def test_forked_children_of_a_running_event_loop_use_the_inherited_asyncio_handle_in_their_own(broker, srv):
    """A child of fork() cannot run its parent's event loop (its epoll is the parent's):
    in an event loop of its own, the handle connects anew there."""
    local = broker.create_queue("q")

    async def main():
        async with await aio.connect(srv.url, reconnect=False) as b:
            await b.ping()
            link = b._link
            children = [Child(lambda: asyncio.run(asyncio.wait_for(_aio_put_some(b, EACH), BOUND_S)))
                        for _ in range(CHILDREN)]
            assert await asyncio.to_thread(outcomes, children) == [EACH] * CHILDREN
            assert await _aio_put_some(b, 1) == 1  # the parent's own connection, as it was
            assert b._link is link
            return children

    children = asyncio.run(asyncio.wait_for(main(), BOUND_S + 10))
    bodies = drain(local)
    assert len(bodies) == len(set(bodies)) == CHILDREN * EACH + 1
    assert {x for x in bodies if not x.startswith(f"{os.getpid()}-".encode())} == {
        f"{c.pid}-{i}".encode() for c in children for i in range(EACH)}


def test_a_child_still_in_its_parents_event_loop_gets_a_clear_error(broker, srv):
    broker.create_queue("q")

    async def main():
        async with await aio.connect(srv.url, reconnect=False) as b:
            parent = os.getpid()

            def child():  # runs on in the parent's coroutine, inside the parent's loop
                coro = b.ping()
                try:
                    coro.send(None)  # the call's first step: it never gets to wait
                except shmq.ShmqError as e:
                    return f"{type(e).__name__}: {e}"
                return "no error"

            [error] = await asyncio.to_thread(outcomes, [Child(child)])
            assert error == (f"ShmqError: this process is a fork of process {parent}, whose event loop it cannot use: "
                             "call the broker from an event loop of this process (asyncio.run)")
            await b.ping()

    asyncio.run(asyncio.wait_for(main(), BOUND_S + 10))
