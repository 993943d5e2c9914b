"""Fixtures of the Kafka listener's tests: a real ``shmq server --kafka-port 0`` process,
per test (``kafka_server``) or one per module (``shared_kafka``, with ``names``: the
test's own topic and group names, whose streams are checked gone at its end)."""

import re
import uuid

import pytest

import shmq
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from tests.conftest import SESSION_PROCESSES


class KafkaServer:
    """A ``shmq server`` process with its Kafka listener (``bootstrap``: host:port)."""

    def __init__(self, proc):
        self.proc = proc
        line = next(x for x in proc.log if "kafka listener on" in x)
        self.port = int(re.search(r"kafka listener on \S+:(\d+)", line).group(1))
        self.bootstrap = f"127.0.0.1:{self.port}"

    def stop(self):
        return self.proc.stop()


@pytest.fixture
def kafka_server(broker, servers):
    """``start(*args)``: a server of the test's namespace with a Kafka listener on a free
    port, no token (``--no-auth``) unless args say otherwise, groups assigned at once
    (``--kafka-initial-rebalance-delay-ms 0``, as Kafka's own test set-ups) unless args
    say otherwise; stopped at the end."""
    started = []

    def start(*args):
        if "--token-file" not in args:
            args = ("--no-auth", *args)
        if "--kafka-initial-rebalance-delay-ms" not in args:
            args = ("--kafka-initial-rebalance-delay-ms", "0", *args)
        srv = KafkaServer(servers(broker.namespace, "--no-persist", "--kafka-port", "0", *args))
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def shared_kafka():
    """One ``shmq server --no-auth --kafka-port 0`` for the module's tests, on a namespace
    of its own (``.broker``: a local Broker of it); each test names its topics and groups
    with ``names``. Not a stray child of any one test; stopped, and the namespace gone,
    at the module's end."""
    from tests.test_server_tcp import ServerProcess

    ns = "t" + uuid.uuid4().hex[:12]
    b = shmq.connect(namespace=ns)
    b.create_namespace()
    proc = ServerProcess(ns, "--no-persist", "--no-auth", "--kafka-port", "0", "--kafka-initial-rebalance-delay-ms", "0")
    SESSION_PROCESSES.add(proc.proc.pid)
    srv = KafkaServer(proc)
    srv.broker = b
    try:
        yield srv
    finally:
        rc = proc.stop() if proc.proc.poll() is None else proc.proc.returncode
        SESSION_PROCESSES.discard(proc.proc.pid)
        b.close()
        destroy_namespace(ns)
        assert rc == 0


@pytest.fixture
def names(shared_kafka):
    """``names(kind)``: a name of this test's own (a topic, a group) on the shared server;
    at the end, the streams of its topics are deleted, and none of them may be left in
    /dev/shm (as ``broker`` checks a test's namespace)."""
    tag = uuid.uuid4().hex[:8]
    made = []

    def name(kind: str) -> str:
        made.append(f"{kind}_{tag}_{len(made)}")
        return made[-1]

    yield name
    b = shared_kafka.broker
    for n in made:
        if n in b.list_streams():
            b.delete_stream(n)
    left = [e for e in namespace_entries(b.namespace) if any(f".s.{n}" in e for n in made)]
    assert left == [], f"delete_stream left these in /dev/shm: {left}"
