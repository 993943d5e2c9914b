"""kombu's own integration tests against shmq's transport (``shmq.kombu``), Redis beside
it as the baseline: not a pytest module of shmq's (it needs kombu's sdist), a script a
person runs.

    python -m tests.peers.kombu_suite [--target shmq-local|shmq-tcp|redis|all] [--jobs 3] [--shmq REV|DIR]
                                      [--src DIR] [--out FILE]

kombu's ``t/`` comes from its sdist at the installed version (pip download into ``--src``,
default ~/.cache/shmq-peers; or ``--src`` a kombu source tree). Each transport's file in
``t/integration`` subclasses the base classes of ``common.py`` with a ``connection``
fixture; ``test_shmq_peer.py``, written here, does so for every base class
(BasicFunctionality, BaseExchangeTypes, BaseMessage, BaseEventLoop, BaseFailover,
BaseTimeToLive, BasePriority) with the target's url, as ``test_redis.py`` does for Redis:
kombu's virtual transports deliver one message per ``drain_events``, so BasePriority's two
tests that drain once are drained once per message (``test_redis.py``'s overrides), in
the target's priority order (shmq: higher first, as AMQP; Redis: lower first).
``test_redis.py`` itself subclasses neither BaseTimeToLive nor BaseFailover
(``test_py_amqp.py`` does): on Redis they show what kombu's Redis transport lacks.

Targets, each on a broker of its own: ``shmq-local`` (``shmq:///NS``, a fresh namespace),
``shmq-tcp`` (a ``shmq server`` on a free port with a token), ``redis`` (a
``redis-server`` on a free port). The invalid url of the failure tests is a closed port
of the target's scheme (on shmq-local the failover list is that TCP url then the local
one: BaseFailover's two ``switch`` tests compare the ports of the two urls, and kombu keeps
the dead url's port when the live one names none, so they fail there by construction).
The namespaces are destroyed and the servers stopped at the end.
``--shmq HEAD`` tests a commit (exported and built in the work directory) whatever the
work tree holds; ``--jobs 3`` runs the targets side by side (about 40 s each). Prints the
counts and each failure; ``--out`` writes every test's outcome and traceback as JSON.
"""

import argparse
import os
import sys
import tempfile
import time

from . import pysuites

TARGETS = ("shmq-local", "shmq-tcp", "redis")

TEST_FILE = '''"""Written by tests/peers/kombu_suite.py (shmq): kombu's integration base classes on the
broker at $PEER_URL, adapted as test_redis.py adapts them for Redis."""

import os
from time import sleep

import pytest

import kombu

from .common import (BaseEventLoop, BaseExchangeTypes, BaseFailover, BaseMessage, BasePriority,
                     BaseTimeToLive, BasicFunctionality)

URL = os.environ["PEER_URL"]
INVALID_URL = os.environ["PEER_INVALID_URL"]


@pytest.fixture()
def connection():
    return kombu.Connection(URL)


@pytest.fixture()
def invalid_connection():
    return kombu.Connection(INVALID_URL)


@pytest.fixture()
def failover_connection():
    return kombu.Connection(f"{INVALID_URL};{URL}")


class test_PeerBasicFunctionality(BasicFunctionality):
    def test_failed_connection__ConnectionError(self, invalid_connection):
        # (test_redis.py's: the error is one the transport names, so kombu retries it)
        with pytest.raises(Exception) as ex:
            invalid_connection.connection
        assert ex.type in invalid_connection.transport.connection_errors


class test_PeerBaseExchangeTypes(BaseExchangeTypes):
    pass


class test_PeerMessage(BaseMessage):
    pass


class test_PeerEventLoop(BaseEventLoop):
    pass


class test_PeerFailover(BaseFailover):
    pass


class test_PeerTimeToLive(BaseTimeToLive):
    pass


class test_PeerPriority(BasePriority):
    """test_redis.py's overrides (one drain_events per message), in the target's order."""

    PRIORITY_ORDER = os.environ.get("PEER_PRIORITY_ORDER", "asc")

    def _levels(self):
        # (max, high, low): common.py's numbers for each order
        return (9, 6, 3) if self.PRIORITY_ORDER == "asc" else (0, 3, 6)

    def _publish(self, producer, queue, body, priority):
        producer.publish(body, retry=True, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue], serializer="pickle", priority=priority)

    def test_publish_consume(self, connection):
        _max, high, low = self._levels()
        test_queue = kombu.Queue("priority_test", routing_key="priority_test", max_priority=10)
        received = []

        def callback(body, message):
            received.append(body)
            message.ack()

        with connection as conn:
            with conn.channel() as channel:
                producer = kombu.Producer(channel)
                for msg, prio in [({"msg": "first"}, low), ({"msg": "second"}, high), ({"msg": "third"}, low)]:
                    self._publish(producer, test_queue, msg, prio)
                sleep(0.5)
                consumer = kombu.Consumer(conn, [test_queue], accept=["pickle"])
                consumer.register_callback(callback)
                with consumer:
                    for _ in range(3):
                        conn.drain_events(timeout=1)
                assert received == [{"msg": "second"}, {"msg": "first"}, {"msg": "third"}]

    def test_publish_requeue_consume(self, connection):
        top, high, low = self._levels()
        test_queue = kombu.Queue("priority_requeue_test", routing_key="priority_requeue_test", max_priority=10)
        messages, bodies = [], []

        def callback(body, message):
            messages.append(message)
            bodies.append(body)

        with connection as conn:
            with conn.channel() as channel:
                producer = kombu.Producer(channel)
                for msg, prio in [({"msg": "first"}, low), ({"msg": "second"}, high), ({"msg": "third"}, low)]:
                    self._publish(producer, test_queue, msg, prio)
                sleep(0.5)
                consumer = kombu.Consumer(conn, [test_queue], accept=["pickle"])
                consumer.register_callback(callback)
                with consumer:
                    for _ in range(3):
                        conn.drain_events(timeout=1)
                for msg in messages:
                    msg.requeue()
                messages.clear()
                bodies.clear()
                self._publish(producer, test_queue, {"msg": "fourth"}, top)
                with consumer:
                    for _ in range(4):
                        conn.drain_events(timeout=1)
                assert bodies == [{"msg": "fourth"}, {"msg": "second"}, {"msg": "first"}, {"msg": "third"}]
'''


class Target:
    """A broker for one target: its url, a url of the same scheme nobody answers, and its
    priority order."""

    def __init__(self, name: str, workdir: str):
        self.name = name
        self._redis = self._shmq = None
        if name == "redis":
            self._redis = pysuites.Redis(workdir)
            self.url, self.order = self._redis.url(), "desc"
            self.invalid = f"redis://127.0.0.1:{pysuites.free_port()}"
        else:
            self._shmq = pysuites.Shmq(workdir, tcp=name == "shmq-tcp", prefix="kombu")
            self.url, self.order = self._shmq.url(), "asc"
            self.invalid = f"shmq://127.0.0.1:{pysuites.free_port()}"

    def env(self) -> dict:
        return {"PEER_URL": self.url, "PEER_INVALID_URL": self.invalid, "PEER_PRIORITY_ORDER": self.order,
                "PEER_IMPORTS": "" if self.name == "redis" else "shmq.kombu"}

    def stop(self) -> None:
        for broker in (self._redis, self._shmq):
            if broker is not None:
                broker.stop()


def run(target: str, root: str, deadline: float, extra: list[str], workdir: str) -> dict:
    broker = Target(target, workdir)
    env = {**os.environ, **broker.env()}
    try:
        result = pysuites.run_pytest(root, ["t/integration/test_shmq_peer.py"], extra, env, deadline,
                                     os.path.join(workdir, f"{target}.log"))
    finally:
        broker.stop()
    result["url"] = broker.url.replace(getattr(broker._shmq, "token", None) or "\0", "TOKEN")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="all", help=f"{', '.join(TARGETS)}, several with commas, or all")
    ap.add_argument("--jobs", type=int, default=1, help="targets run side by side (default 1)")
    ap.add_argument("--src", default=None, help="where kombu's sdist is (or goes), or a kombu source tree")
    ap.add_argument("--shmq", default=None, metavar="REV|DIR",
                    help="test this git revision (exported, extension built) or source tree, not the installed shmq")
    ap.add_argument("--deadline", type=float, default=60, help="seconds per test (default 60)")
    ap.add_argument("-k", default=None, help="pytest's -k")
    ap.add_argument("--out", default=None, help="write the outcomes and tracebacks here (JSON)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, the test file)")
    a = ap.parse_args(argv)
    targets = pysuites.targets_of(a.target, TARGETS)
    extra = ["-k", a.k] if a.k else []
    workdir = tempfile.mkdtemp(prefix="kombu-suite-")
    root = pysuites.sdist_tests("kombu", a.src, workdir)
    shmq_dir, revision = pysuites.shmq_source(a.shmq, workdir)
    os.environ.update(pysuites.with_path(dict(os.environ), shmq_dir))  # (the servers, pytest: every process after)
    with open(os.path.join(root, "t", "integration", "test_shmq_peer.py"), "w") as f:
        f.write(TEST_FILE)
    pysuites.write_ini(root, ["python_classes = test_*", "markers =", "    env", "    flaky"])
    from importlib.metadata import version

    out = {"kombu": version("kombu"), "shmq": revision, "started": time.strftime("%Y-%m-%d %H:%M"),
           "targets": {}}
    print(f"kombu {out['kombu']} integration suite, shmq {out['shmq']}; work dir {workdir}", flush=True)

    def done(target, result):
        out["targets"][target] = result
        pysuites.report(target, result)
        if a.out:
            pysuites.write_out(a.out, out)

    return pysuites.run_and_close(
        targets, a.jobs, lambda t: run(t, root, a.deadline, extra, workdir), done, a.out, out, a.keep, workdir)


if __name__ == "__main__":
    sys.exit(main())
