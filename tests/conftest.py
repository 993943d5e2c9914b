"""Shared fixtures: a fresh namespace per test, and leak checks on teardown.

Every test that uses ``broker`` gets its own namespace. On teardown the fixture
deletes the queues the test left, then fails the test if anything of the namespace is
still in /dev/shm (delete_queue must remove a queue's segment and semaphores), or if
the test left child processes running.
"""

import compileall
import os
import sys
import uuid

import psutil
import pytest

import shmq
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from shmq.persistence.kafka_txns import RUNTIME_ENTRY
from tests import _processes, _scheduling


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Where the environment says PYTHONDONTWRITEBYTECODE, every process of the suite (thousands:
# servers, workers, CLI calls, each xdist worker's collection) would compile the sources anew
# (measured: `import shmq; shmq.connect()` 0.47 s -> 0.20 s, collection 18.5 s -> 4.7 s);
# so the suite's own caches are written: pytest's rewritten test modules, and every module of
# the tree compiled once before the workers start (children only read them).
sys.dont_write_bytecode = False


def pytest_configure(config):
    config.pluginmanager.register(_scheduling, "shmq-scheduling")  # (one Spark session: tests/_scheduling.py)
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        for folder in ("shmq", "bench", "tests", "examples"):
            compileall.compile_dir(os.path.join(ROOT, folder), quiet=1)


def _shared_folder(request, tmp_path_factory, name: str) -> str:
    """A folder ``name`` of this run that its xdist workers share (the parent of a worker's
    temporary folder), for what is built once per run and read by all."""
    run = tmp_path_factory.getbasetemp()
    folder = (run.parent if hasattr(request.config, "workerinput") else run) / name
    folder.mkdir(mode=0o700, exist_ok=True)
    return str(folder)


@pytest.fixture(autouse=True, scope="session")
def shmq_home(request, tmp_path_factory):
    """The suite's servers and clients keep their token and runtime files in a temporary
    $SHMQ_HOME (inherited by every subprocess), never in the real home directory. Its
    ``spark`` folder (the connector's jar, the workers' launcher: shmq.spark) is one the
    run's workers share, so the jar is built once a run, not once a worker (17 CPU-s)."""
    home = tmp_path_factory.mktemp("shmq-home")
    os.symlink(_shared_folder(request, tmp_path_factory, "shmq-spark"), home / "spark")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHMQ_HOME", str(home))
        mp.delenv("SHMQ_TOKEN", raising=False)
        yield home


@pytest.fixture(autouse=True, scope="session")
def worker_server(shmq_home):
    """The server the suite's workers fork from (tests._processes), started before any test
    with the session's environment; it ends with the session's process."""
    _processes.start()


@pytest.fixture(scope="session")
def spark_classes(request, tmp_path_factory):
    """Spark's JVMs started from here on (the suite's sessions and the drivers it runs as
    processes) map one archive of Spark's classes: tests/spark/cds.py. It is kept in pytest's
    cache folder; without the cache plugin (``-p no:cacheprovider``: tests.flakes) in the run's
    temporary folder, which its xdist workers share."""
    from tests.spark.cds import share_classes

    if hasattr(request.config, "cache"):
        folder = str(request.config.cache.mkdir("shmq-spark-classes"))
    else:
        folder = _shared_folder(request, tmp_path_factory, "shmq-spark-classes")
    options = share_classes(folder)
    with pytest.MonkeyPatch.context() as mp:
        if options is not None:
            mp.setenv("SPARK_SUBMIT_OPTS", options)
        yield options


@pytest.fixture
def namespace():
    ns = "t" + uuid.uuid4().hex[:12]
    yield ns
    destroy_namespace(ns)


@pytest.fixture
def broker(namespace):
    """A local broker on a fresh namespace, made at once (connecting makes nothing: the
    first create would; the tests' CLI calls expect the namespace there from the start)."""
    b = shmq.connect(namespace=namespace)
    b.create_namespace()
    yield b
    try:
        for name in b.list_queues():
            b.delete_queue(name)
        for name in b.list_streams():
            b.delete_stream(name)
        for name in b.list_stores():
            b.delete_store(name)
        # the registry and the exchange table are the namespace's own, until it is destroyed
        left = [e for e in namespace_entries(namespace)
                if e not in (f"shmq.{namespace}.registry", f"shmq.{namespace}.exchanges",
                             f"shmq.{namespace}.{RUNTIME_ENTRY}")]  # (the Kafka listener's journal, no data dir)
    finally:
        b.close()
        destroy_namespace(namespace)
    assert left == [], f"delete_queue / delete_stream left these in /dev/shm: {left}"
    assert namespace_entries(namespace) == []


SESSION_PROCESSES: set[int] = set()  # long-lived children a session fixture owns (Spark's JVM): not strays


def _owned_by_session(p) -> bool:
    try:
        return p.pid in SESSION_PROCESSES or any(a.pid in SESSION_PROCESSES for a in p.parents())
    except psutil.Error:
        return True  # gone already


def _stray(p) -> bool:
    """A child of the test's still running that the session does not own (the workers'
    server is the session's; a worker it forked is the test's)."""
    try:
        return (p.pid != _processes.server_pid() and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline()) and not _owned_by_session(p))
    except psutil.NoSuchProcess:  # it ended between two looks (a loaded run saw one do so)
        return False


@pytest.fixture(autouse=True)
def no_stray_children():
    yield
    stray = [p for p in psutil.Process(os.getpid()).children(recursive=True) if _stray(p)]
    for p in stray:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    assert stray == [], f"test left processes running: {[p.pid for p in stray]}"


class ThreadedServer:
    """A real TCP server (shmq.server.tcp) on a free port, its event loop in a thread."""

    def __init__(self, namespace, token=None, max_frame_bytes=None, limits=None):
        import asyncio
        import threading

        from shmq.server.tcp import TcpServer

        self.loop = asyncio.new_event_loop()
        self.broker = shmq.connect(namespace=namespace)
        kwargs = {"token": token, "port": 0}
        if max_frame_bytes:
            kwargs["max_frame_bytes"] = max_frame_bytes
        if limits is not None:
            kwargs["limits"] = limits
        self.server = TcpServer(self.broker, **kwargs)
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)
        self.port = self.server.port
        self.url = f"tcp://127.0.0.1:{self.port}"

    def stop(self):
        import asyncio

        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.broker.close()


@pytest.fixture
def servers():
    """``start(namespace, *args)``: a ``shmq server`` process (tests.test_server_tcp.ServerProcess);
    any still running at the end (a failed assertion midway) is killed."""
    from tests.test_server_tcp import ServerProcess

    started = []

    def start(namespace, *args, env=None):
        srv = ServerProcess(namespace, *args, env=env)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(10)


@pytest.fixture
def tcp_server(broker):
    srv = ThreadedServer(broker.namespace)
    yield srv
    srv.stop()


@pytest.fixture(params=["local", "tcp"])
def any_broker(request, broker):
    """The same tests against both transports: local attach and TCP."""
    if request.param == "local":
        yield broker
        return
    srv = ThreadedServer(broker.namespace)
    remote = shmq.connect(srv.url)
    try:
        yield remote
    finally:
        remote.close()
        srv.stop()
