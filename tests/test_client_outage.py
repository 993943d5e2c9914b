"""Long-lived consumers of both TCP clients outlive a routine server restart (issue 69,
item 5): a real ``shmq server`` SIGKILLed and started again OUTAGE_S later on the same
port and data dir, under a blocking ``consume()`` iteration, the asyncio one and ``async
for d in q``, and group members' poll loops (a Consumer, a MultiConsumer, an asyncio
Consumer), all with the default options (``ConnectOptions.max_outage``). Every message
and record is delivered at least once, none lost (what was in flight at the kill comes
again: duplicates are allowed), and each broker handle logs the outage once: a WARNING
when a try first fails, an INFO when it is back. Past ``max_outage`` they raise, while a
poll keeps to its own timeout and single calls to their bounded retries (here, and
tests/test_client_reconnect.py)."""

import asyncio
import logging
import threading
import time

import pytest

import shmq
from shmq.client import aio
from tests._wait import wait_for
from tests.test_client_resume import free_port, kill

N = 150  # messages put to each queue, records appended to the stream
OUTAGE_S = 10.0  # how long the server stays away: longer than a single call's retries (3.1 s at most)


@pytest.fixture
def restartable(broker, servers, tmp_path):
    """``start()``: a ``shmq server`` of the test's namespace with a data dir, always on one
    port; one still running at the end (a failed assertion midway) is stopped."""
    port = free_port()
    started = []

    def start():
        started.append(servers(broker.namespace, "--port", str(port), "--data-dir", str(tmp_path / "data")))
        return started[-1]

    yield start
    for srv in started:
        srv.stop()


def away(srv, restart):
    """SIGKILL ``srv``, leave it dead OUTAGE_S, then start it again (same port, same data
    dir)."""
    kill(srv)
    time.sleep(OUTAGE_S)  # the outage itself, by design: there is nothing to wait for
    return restart()


def bodies(prefix: str, n: int = N) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def outages_logged(caplog, endpoint) -> tuple[int, int]:
    """(WARNINGs that an outage is ridden out, INFOs that the connection is back), for
    ``endpoint``, logged by the clients."""
    lost = back = 0
    for r in caplog.records:
        if r.name != "shmq.client":
            continue
        text = r.getMessage()
        if r.levelno == logging.WARNING and text.startswith(f"lost the connection to {endpoint}") \
                and "reconnecting" in text:
            lost += 1
        elif r.levelno == logging.INFO and text.startswith(f"reconnected to {endpoint} after "):
            back += 1
    return lost, back


class Consumers:
    """Consumer loops, each in a thread of its own, recording what they get by name; a
    loop that raises is recorded in ``failures``."""

    def __init__(self, names):
        self.got = {name: [] for name in names}
        self.failures = []
        self.threads = []

    def start(self, loop):
        def run():
            try:
                loop()
            except BaseException as e:  # noqa: BLE001 - the test says what it was
                self.failures.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def have(self, name, want) -> bool:
        return set(self.got[name]) >= set(want)

    def each_got(self, n) -> bool:
        return all(len(g) >= n for g in self.got.values()) or bool(self.failures)

    def join(self, timeout=60):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not self.failures, self.failures
        assert not any(t.is_alive() for t in self.threads), {k: len(v) for k, v in self.got.items()}


@pytest.mark.slow
def test_a_blocking_consume_loop_outlives_a_server_restart(broker, restartable, caplog):
    caplog.set_level(logging.INFO, logger="shmq.client")
    q = broker.create_queue("q", max_bytes=1 << 20)
    want = bodies("m")
    q.put_many(want[:N // 3])
    srv = restartable()
    run = Consumers(["q"])

    def consume():
        with shmq.connect(srv.url) as b, b.queue("q").consume(prefetch=10) as it:  # the default options
            for d in it:
                run.got["q"].append(d.body)
                d.ack(wait=False)
                if run.have("q", want):
                    return

    run.start(consume)
    wait_for(lambda: run.each_got(N // 6), 30, "the consumer to get some")
    assert not run.failures, run.failures
    kill(srv)
    q.put_many(want[N // 3: 2 * N // 3])  # put while the server is away (here, in shared memory)
    time.sleep(OUTAGE_S)  # the outage itself, by design
    srv = restartable()
    q.put_many(want[2 * N // 3:])
    run.join()
    assert set(run.got["q"]) == set(want)  # every one, none lost (at least once: some may come twice)
    wait_for(lambda: (q.stats().ready, q.stats().in_flight) == (0, 0), 10, "every message acked")
    assert outages_logged(caplog, f"127.0.0.1:{srv.port}") == (1, 1)
    assert srv.stop() == 0


@pytest.mark.slow
def test_asyncio_consume_loops_outlive_a_server_restart(broker, restartable, caplog):
    caplog.set_level(logging.INFO, logger="shmq.client")
    pushed, got_one = broker.create_queue("pushed", max_bytes=1 << 20), broker.create_queue("got", max_bytes=1 << 20)
    want = {"pushed": bodies("p"), "got": bodies("g")}
    pushed.put_many(want["pushed"][:N // 2])
    got_one.put_many(want["got"][:N // 2])
    srv = restartable()
    run = Consumers(["pushed", "got"])

    async def loops(url):
        async with await aio.connect(url) as b:  # the default options; both loops on this one handle
            async def subscription():
                async with (await b.queue("pushed")).consume(prefetch=10) as it:
                    async for d in it:  # pushed by the server
                        run.got["pushed"].append(d.body)
                        await d.ack(wait=False)
                        if run.have("pushed", want["pushed"]):
                            return

            async def gets():
                async for d in await b.queue("got"):  # a get per step
                    run.got["got"].append(d.body)
                    await d.ack(wait=False)
                    if run.have("got", want["got"]):
                        return

            await asyncio.gather(subscription(), gets())

    run.start(lambda: asyncio.run(loops(srv.url)))
    wait_for(lambda: run.each_got(N // 4), 30, "each loop to get some")
    assert not run.failures, run.failures
    srv = away(srv, restartable)
    pushed.put_many(want["pushed"][N // 2:])
    got_one.put_many(want["got"][N // 2:])
    run.join()
    for name, q in (("pushed", pushed), ("got", got_one)):
        assert set(run.got[name]) == set(want[name]), name  # every one, none lost (some may come twice)
        settled = lambda q=q: (q.stats().ready, q.stats().in_flight) == (0, 0)  # noqa: E731
        wait_for(settled, 10, f"every message of {name} acked")
    assert outages_logged(caplog, f"127.0.0.1:{srv.port}") == (1, 1)  # one handle, one outage: one of each
    assert srv.stop() == 0


@pytest.mark.slow
def test_group_members_poll_loops_outlive_a_server_restart(broker, restartable, caplog):
    caplog.set_level(logging.INFO, logger="shmq.client")
    s = broker.create_stream("s", partitions=2, max_bytes=1 << 20)
    want = bodies("r")
    for v in want[:N // 2]:
        s.append(v, key=v)
    srv = restartable()
    run = Consumers(["consumer", "multi", "asyncio"])

    def polling(name, member):
        """A poll loop as Kafka's users write it: poll, handle, poll again."""
        with member:
            while not run.have(name, want):
                run.got[name].extend(r.value for r in member.poll(timeout=0.5))

    def blocking(name, make):
        with shmq.connect(srv.url) as b:  # the default options
            polling(name, make(b))

    async def in_asyncio(url):
        async with await aio.connect(url) as b:
            member = await (await b.stream("s")).consumer("ga", auto_commit=True, auto_commit_interval=0.05)
            while not run.have("asyncio", want):
                run.got["asyncio"].extend(r.value for r in await member.poll(timeout=0.5))
            await member.close()

    run.start(lambda: blocking("consumer", lambda b: b.stream("s").consumer("g", auto_commit=True,
                                                                            auto_commit_interval=0.05)))
    run.start(lambda: blocking("multi", lambda b: b.consumer("gm", streams=["s"], auto_commit=True,
                                                             auto_commit_interval=0.05)))
    run.start(lambda: asyncio.run(in_asyncio(srv.url)))
    wait_for(lambda: run.each_got(N // 4), 30, "each member to get some")
    assert not run.failures, run.failures
    srv = away(srv, restartable)
    for v in want[N // 2:]:
        s.append(v, key=v)
    run.join()
    for name in run.got:
        assert set(run.got[name]) == set(want), name  # every record, none lost (uncommitted ones come again)
    for group in ("g", "gm", "ga"):  # each left committing where it was
        assert sum(s.lag(group).values()) == 0, group
    # three handles, each told of the outage once (the group's rejoin has lines of its own)
    assert outages_logged(caplog, f"127.0.0.1:{srv.port}") == (3, 3)
    assert srv.stop() == 0
    broker.delete_stream("s")


def test_max_outage_bounds_the_ride_while_polls_keep_to_their_timeout_and_single_calls_to_their_retries(
        broker, restartable, caplog):
    caplog.set_level(logging.INFO, logger="shmq.client")
    q = broker.create_queue("q")
    broker.create_stream("s", partitions=1, max_bytes=1 << 16)
    srv = restartable()
    endpoint = f"127.0.0.1:{srv.port}"
    with shmq.connect(srv.url, max_outage=1.5, retries=1, backoff=(0.05, 0.2)) as b:
        it = b.queue("q").consume(prefetch=1)
        member = b.stream("s").consumer("g")
        assert member.poll(timeout=0.1) == []
        kill(srv)  # and it does not come back within max_outage
        lost = time.monotonic()
        polls = 0
        while True:  # a poll loop: [] within each poll's timeout, until the outage has lasted max_outage
            began = time.monotonic()
            try:
                assert member.poll(timeout=0.3) == []
            except shmq.BrokerUnavailable as e:
                assert str(e).endswith("s: max_outage)") and "gave up reconnecting after" in str(e), e
                break
            assert time.monotonic() - began < 0.3 + 1.0  # its own timeout (and a loaded machine's slack)
            polls += 1
            assert time.monotonic() - lost < 30, "the poll loop never gave up"
        assert polls >= 2 and time.monotonic() - lost >= 1.0
        with pytest.raises(shmq.BrokerUnavailable, match=r"\(gave up reconnecting after 2 tries in [\d.]+s\)$"):
            b.ping()  # a single call: its bounded retries, as before
        began = time.monotonic()
        with pytest.raises(shmq.BrokerUnavailable, match=r"\(gave up reconnecting after \d+ tries in [\d.]+s: "
                                                         r"max_outage\)$"):
            next(it)  # after a give-up, iterating again rides out as long again
        assert time.monotonic() - began >= 1.0
        srv = restartable()
        q.put(b"m")
        assert next(it).body == b"m"  # and once it is back, it goes on
    assert outages_logged(caplog, endpoint) == (2, 1)  # each ride said once, and the return
    assert srv.stop() == 0
    broker.delete_stream("s")


def test_an_asyncio_loop_of_gets_rides_out_up_to_max_outage_then_raises(broker, restartable):
    broker.create_queue("q")
    srv = restartable()

    async def main():
        async with await aio.connect(srv.url, max_outage=1.0, backoff=(0.05, 0.2)) as b:
            q = await b.queue("q")
            member = await (await b.stream("s")).consumer("g")
            began = time.monotonic()  # (the loss comes after: max_outage is counted from it)
            kill(srv)  # (gone at once: a stop's last snapshot may take longer than the outage allowed)
            assert await member.poll(timeout=0.2) == []  # within the outage: nothing, no error
            with pytest.raises(shmq.BrokerUnavailable, match=r": max_outage\)$"):
                async for _ in q:
                    raise AssertionError("the server is away")
            return time.monotonic() - began

    broker.create_stream("s", partitions=1, max_bytes=1 << 16)
    assert asyncio.run(asyncio.wait_for(main(), 30)) >= 1.0
    assert restartable().stop() == 0  # (what the killed one left, taken over and removed)
    broker.delete_stream("s")
