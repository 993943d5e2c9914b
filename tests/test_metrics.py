"""``shmq server --metrics``: a real server process, scraped over HTTP, the text parsed
with ``prometheus_client``'s own parser; every value equals what the engine says
(``Queue.stats()``, a stream's offsets and lag), the traffic of local processes
included, and the server's request counts equal the requests made."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import shmq
from shmq.auth import default_data_dir
from shmq.engine.shm.segment import namespace_entries
from shmq.persistence import Snapshotter
from shmq.server.exporter import ShmqCollector, snapshot_families
from shmq.server.metrics import LATENCY_BUCKETS, Metrics, parse_address
from tests.test_server_tcp import ServerProcess


def _scrape(port) -> dict:
    """{(sample name, frozenset of labels): value} of one scrape of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return _samples(text)


def _samples(text) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _get(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def _until(scrape, ready, timeout=5.0):
    """Scrape until ``ready(samples)`` (the server counts a request just after its reply
    is written, so a client may be a moment ahead); fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape()
        if ready(samples) or time.monotonic() > deadline:
            return samples


@pytest.fixture
def metered(broker):
    srv = ServerProcess(broker.namespace, "--metrics", "127.0.0.1:0")
    try:
        (line,) = [entry for entry in srv.log if "metrics on http://" in entry]
        srv.metrics_port = int(line.rsplit(":", 1)[1].split("/")[0])
        yield srv
    finally:
        assert srv.stop() == 0


def test_queue_metrics_equal_stats(broker, metered):
    with shmq.connect(metered.url) as rb:
        rb.create_queue("dead")
        rq = rb.create_queue("orders", dead_letter_queue="dead")
        for i in range(5):
            rq.put(b"order %d" % i)
        local = broker.queue("orders")
        local.put(b"from a local process")  # straight into shared memory: the server never sees it
        local.put(b"and another")
        acked, nacked, rejected, delayed, held = (rq.get(timeout=5) for _ in range(5))
        acked.ack()
        nacked.nack()
        rejected.reject()  # to "dead"
        delayed.nack(delay=60)
        samples = _scrape(metered.metrics_port)  # `held` is still leased by this connection
        stats = {name: broker.queue(name).stats() for name in ("orders", "dead")}
        assert _get(samples, "shmq_connections") == 1

    s = stats["orders"]
    assert (s.ready, s.in_flight, s.delayed, s.dead_lettered_total) == (3, 1, 1, 1)  # the traffic is what we think
    for name, st in stats.items():
        q = {"queue": name}
        assert _get(samples, "shmq_queue_ready", **q) == st.ready
        assert _get(samples, "shmq_queue_in_flight", **q) == st.in_flight
        assert _get(samples, "shmq_queue_delayed", **q) == st.delayed
        assert _get(samples, "shmq_queue_used_bytes", **q) == st.bytes_used
        assert _get(samples, "shmq_queue_capacity_bytes", **q) == st.max_bytes
        assert _get(samples, "shmq_queue_consumers_waiting", **q) == st.consumers_waiting
        assert _get(samples, "shmq_queue_producers_waiting", **q) == st.producers_waiting
        for counter in ("enqueued", "acked", "redelivered", "dead_lettered", "purged", "expired"):
            assert _get(samples, f"shmq_queue_{counter}_total", **q) == getattr(st, f"{counter}_total"), counter
        age = _get(samples, "shmq_queue_oldest_ready_age_seconds", **q)
        assert 0 < age <= st.oldest_ready_age_s  # scraped a moment before stats()
    assert _get(samples, "shmq_queue_dead_letter_depth", queue="orders") == stats["dead"].ready == 1
    assert _get(samples, "shmq_queue_dead_letter_depth", queue="dead") == 0  # it has none


def test_expired_messages_and_the_dead_letter_depth(broker, metered):
    broker.create_queue("dead")
    q = broker.create_queue("orders", dead_letter_queue="dead")
    q.put_many([b"a", b"b"], ttl=0.05)
    q.put(b"kept")
    # the server's housekeeping finds them expired and dead-letters them, with no consumer around:
    # it leases them first (expired counted, in flight) and then moves them, so wait for the move
    def moved(s):
        orders = frozenset({"queue": "orders"}.items())
        return (s.get(("shmq_queue_dead_letter_depth", orders)) == 2
                and s.get(("shmq_queue_in_flight", orders)) == 0)

    samples = _until(lambda: _scrape(metered.metrics_port), moved)
    assert _get(samples, "shmq_queue_expired_total", queue="orders") == q.stats().expired_total == 2
    assert _get(samples, "shmq_queue_dead_lettered_total", queue="orders") == 2
    assert _get(samples, "shmq_queue_ready", queue="orders") == 1


def test_stream_metrics_equal_offsets_and_lag(broker, metered):
    with shmq.connect(metered.url) as rb:
        rs = rb.create_stream("events", partitions=2)
        for i in range(3):
            rs.append(b"a%d" % i, partition=0)
        for i in range(2):
            rs.append(b"b%d" % i, partition=1)
        broker.stream("events").append(b"local", partition=1)  # a local producer
        with rs.consumer("billing") as c:
            assert len(c.poll(timeout=5)) >= 1
            c.commit({0: 1, 1: 2})
            samples = _scrape(metered.metrics_port)
            assert _get(samples, "shmq_stream_group_members", stream="events", group="billing") == 1
    s = broker.stream("events")
    lag = s.lag("billing")
    assert lag == {0: 2, 1: 1}
    for p in range(2):
        part = {"stream": "events", "partition": str(p)}
        earliest, end = s.offsets(p)
        assert _get(samples, "shmq_stream_partition_earliest_offset", **part) == earliest == 0
        assert _get(samples, "shmq_stream_partition_end_offset", **part) == end == (3, 3)[p]
        assert _get(samples, "shmq_stream_partition_stable_offset", **part) == end  # no transaction open
        assert _get(samples, "shmq_stream_partition_used_bytes", **part) == s.stats()["partitions"][p]["bytes"] > 0
        assert _get(samples, "shmq_stream_partition_appended_total", **part) == end
        assert _get(samples, "shmq_stream_group_partition_lag", stream="events", group="billing",
                    partition=str(p)) == lag[p]
    assert _get(samples, "shmq_stream_group_lag", stream="events", group="billing") == sum(lag.values()) == 3


def test_the_stable_offset_stops_at_an_open_transaction(broker, metered):
    s = broker.create_stream("events", partitions=1)
    s.append_many([b"a", b"b"], partition=0)
    s.set_stable(0, 1)  # (the transaction coordinator's: one opened at offset 1)
    samples = _scrape(metered.metrics_port)
    part = {"stream": "events", "partition": "0"}
    assert (_get(samples, "shmq_stream_partition_stable_offset", **part),
            _get(samples, "shmq_stream_partition_end_offset", **part)) == (1, 2)
    s.close()


def test_request_counts_errors_and_latency(broker, metered):
    port = metered.metrics_port
    with shmq.connect(metered.url) as rb:
        before = _scrape(port)
        for _ in range(7):
            rb.ping()
        with pytest.raises(shmq.QueueNotFound):
            rb.delete_queue("nope")

        def count(samples, name, **labels):
            return samples.get((name, frozenset(labels.items())), 0)

        after = _until(lambda: _scrape(port),
                       lambda s: count(s, "shmq_request_errors_total", type="DELETE", status="NO_SUCH_QUEUE") >= 1)
    for sample, labels, delta in (("shmq_requests_total", {"type": "PING"}, 7),
                                  ("shmq_requests_total", {"type": "DELETE"}, 1),
                                  ("shmq_request_errors_total", {"type": "DELETE", "status": "NO_SUCH_QUEUE"}, 1),
                                  ("shmq_request_errors_total", {"type": "PING", "status": "NO_SUCH_QUEUE"}, 0)):
        assert count(after, sample, **labels) - count(before, sample, **labels) == delta, (sample, labels)
    assert count(after, "shmq_requests_total", type="HELLO") >= 1
    assert not any(name == "shmq_request_errors_total" and dict(labels)["type"] == "PING" for name, labels in after)
    # the latency histogram: one observation per request, cumulative buckets
    pings = _get(after, "shmq_requests_total", type="PING")
    assert _get(after, "shmq_request_duration_seconds_count", type="PING") == pings > 0
    buckets = [_get(after, "shmq_request_duration_seconds_bucket", type="PING", le=le)
               for le in [str(b) for b in LATENCY_BUCKETS] + ["+Inf"]]
    assert buckets == sorted(buckets) and buckets[-1] == pings
    assert 0 < _get(after, "shmq_request_duration_seconds_sum", type="PING") < pings  # each well under a second


def test_scrape_survives_deleted_queues_and_streams(broker):
    """What was deleted between the list and its stats is left out of the scrape."""
    broker.create_queue("stays")
    broker.create_queue("goes")
    broker.create_stream("s1", partitions=1)
    collector = ShmqCollector(shmq.connect(namespace=broker.namespace))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        first = _samples(generate_latest(registry).decode())
        assert ("shmq_queue_ready", frozenset({"queue": "goes"}.items())) in first
        broker.delete_queue("goes")  # its handle is cached: the next scrape finds it deleted
        real = collector.broker.list_queues, collector.broker.list_streams
        collector.broker.list_queues = lambda: real[0]() + ["never-was"]  # listed, gone before its stats
        collector.broker.list_streams = lambda: real[1]() + ["never-was"]
        second = _samples(generate_latest(registry).decode())
    finally:
        collector.close()
    assert {dict(labels).get("queue") for name, labels in second if name == "shmq_queue_ready"} == {"stays"}
    assert {dict(labels).get("stream") for name, labels in second if name.startswith("shmq_stream")} == {"s1"}


def _server_cli(namespace, *args):
    return subprocess.run([sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0",
                           *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_bad_metrics_address_is_one_line(namespace):
    r = _server_cli(namespace, "--metrics", "nope")
    assert r.returncode == 2  # a malformed value: a usage error (docs/OPERATIONS.md's table of exit codes)
    assert r.stderr == ("shmq: error: --metrics must be HOST:PORT (like 127.0.0.1:9464; port 0: any free), not "
                        "'nope'; try 'python -m shmq.cli server --help'\n")


def test_metrics_port_in_use_is_one_line_and_makes_nothing(namespace):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _server_cli(namespace, "--metrics", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert r.stderr == (f"shmq: error: port {port} on 127.0.0.1 is in use (--metrics): choose another port, or stop "
                        "what listens on it\n")  # as the TCP port's: no INFO line before
    assert namespace_entries(namespace) == [] and not os.path.exists(default_data_dir(namespace))


def test_parse_address():
    assert parse_address("9464") == ("127.0.0.1", 9464)  # 127.0.0.1 unless told otherwise
    assert parse_address(":0") == ("127.0.0.1", 0)
    assert parse_address("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:9464") == ("::1", 9464)
    for bad in ("nope", "127.0.0.1:", "127.0.0.1:99999", "::1:9464", "host:port", " 9464", ""):
        with pytest.raises(ValueError, match=r"^--metrics must be HOST:PORT .* not "):
            parse_address(bad)


def test_docs_list_every_metric_and_the_dashboard_uses_only_those(broker):
    collector = ShmqCollector(shmq.connect(namespace=broker.namespace), Metrics(broker.namespace))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        exposed = set(re.findall(r"^# TYPE (shmq_\w+) ", generate_latest(registry).decode(), re.M))
    finally:
        collector.close()
    docs = os.path.join(os.path.dirname(__file__), "..", "docs")
    with open(os.path.join(docs, "METRICS.md")) as f:
        documented = set(re.findall(r"^\| `(shmq_\w+)` \|", f.read(), re.M))
    assert exposed == documented
    with open(os.path.join(docs, "grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"shmq_\w+", e)}
    assert used and used <= documented
    health = " ".join(t["expr"] for p in dashboard["panels"] if p["type"] == "stat" for t in p["targets"])
    for metric in ("shmq_queue_ready", "shmq_queue_oldest_ready_age_seconds", "shmq_queue_dead_letter_depth"):
        assert metric in health  # the three health numbers, at the top


# -- memory, the process, snapshots (docs/METRICS.md: "Memory: /dev/shm", "The process", "Snapshots")

MiB = 2**20
MEMORY_METRICS = ("shmq_queue_memory_bytes", "shmq_stream_partition_memory_bytes", "shmq_dev_shm_free_bytes",
                  "shmq_dev_shm_size_bytes", "process_resident_memory_bytes")


def _shm_free():
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize


def _documented_process_metrics():
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "METRICS.md")) as f:
        return set(re.findall(r"^\| `(process_\w+)` \|", f.read(), re.M))


def test_dev_shm_and_the_process_metrics_are_the_servers(broker, metered):
    before = _shm_free()
    samples = _scrape(metered.metrics_port)
    after = _shm_free()
    st = os.statvfs("/dev/shm")
    assert _get(samples, "shmq_dev_shm_size_bytes") == st.f_blocks * st.f_frsize > 0
    free = _get(samples, "shmq_dev_shm_free_bytes")
    # other processes of the host may take or give back /dev/shm meanwhile: a margin around the two reads
    assert 0 < free and min(before, after) - 32 * MiB <= free <= max(before, after) + 32 * MiB
    assert free <= _get(samples, "shmq_dev_shm_size_bytes")

    # the process collector's, and the server's (not this test's) process
    server = psutil.Process(metered.proc.pid)
    exposed = {name for name, _labels in samples if name.startswith("process_")}
    documented = _documented_process_metrics()
    assert {"process_resident_memory_bytes", "process_open_fds", "process_max_fds", "process_cpu_seconds_total",
            "process_start_time_seconds"} <= documented <= exposed  # (a later prometheus_client may add more)
    assert 0 < _get(samples, "process_open_fds") <= _get(samples, "process_max_fds")
    assert _get(samples, "process_max_fds") == server.rlimit(psutil.RLIMIT_NOFILE)[0]
    assert abs(_get(samples, "process_start_time_seconds") - server.create_time()) < 1
    assert _get(samples, "process_resident_memory_bytes") > 4 * MiB  # a Python server's interpreter at least
    assert 0 < _get(samples, "process_cpu_seconds_total") <= sum(server.cpu_times()[:2]) + 0.05


def test_the_dashboard_shows_memory(broker):
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "grafana-dashboard.json")) as f:
        dashboard = json.load(f)

    def panels(within):  # rows may hold their panels (a collapsed row's), or not
        for p in within:
            yield p
            yield from panels(p.get("panels", []))

    byte_panels = [p for p in panels(dashboard["panels"]) if p.get("fieldConfig", {}).get("defaults", {}).get("unit")
                   == "bytes"]
    for metric in MEMORY_METRICS:
        assert any(re.search(rf"\b{metric}\b", t["expr"]) for p in byte_panels for t in p["targets"]), metric
    health = [t["expr"] for p in dashboard["panels"] if p["type"] == "stat" for t in p["targets"]]
    assert any("shmq_dev_shm_free_bytes" in e for e in health)  # among the health numbers at the top


def _scrape_until(port, ready, what, timeout=10.0):
    samples = _until(lambda: _scrape(port), ready, timeout)
    assert ready(samples), what
    return samples


def test_snapshot_metrics_of_a_real_server(broker, tmp_path, servers):
    data = tmp_path / "data"
    data.mkdir()
    (data / "bad.dmsq.tmp").mkdir()  # where the snapshot of "bad" is written first: each one fails
    for name in ("good", "bad"):
        broker.create_queue(name)
    broker.create_queue("volatile", durability="memory")  # never snapshotted
    broker.create_stream("events", partitions=2)
    began = time.time()
    srv = servers(broker.namespace, "--data-dir", str(data), "--snapshot-interval", "0.05",
                  "--metrics", "127.0.0.1:0")

    def ts(samples, kind, name):
        return samples.get((f"shmq_{kind}_last_snapshot_timestamp_seconds", frozenset({kind: name}.items())))

    try:
        (line,) = [entry for entry in srv.log if "metrics on http://" in entry]
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        first = _scrape(port)
        now = time.time()
        assert _get(first, "shmq_snapshot_failures_total") >= 1  # the round at start-up, before it served
        assert began <= ts(first, "queue", "good") <= now
        assert began <= ts(first, "stream", "events") <= now
        assert ts(first, "queue", "bad") is None and ts(first, "queue", "volatile") is None
        # each round fails again, and moves the good ones on (their files unchanged: not rewritten)
        later = _scrape_until(port, lambda s: (_get(s, "shmq_snapshot_failures_total")
                                              > _get(first, "shmq_snapshot_failures_total")
                                              and ts(s, "queue", "good") > ts(first, "queue", "good")
                                              and ts(s, "stream", "events") > ts(first, "stream", "events")),
                              "the rounds went on without counting")
        assert ts(later, "queue", "bad") is None

        (data / "bad.dmsq.tmp").rmdir()  # room for it
        fixed = _scrape_until(port, lambda s: ts(s, "queue", "bad") is not None, "no good snapshot of bad")
        assert ts(later, "queue", "good") < ts(fixed, "queue", "bad") <= time.time()
        assert (data / "bad.dmsq").exists()
        settled = _get(_scrape(port), "shmq_snapshot_failures_total")
        broker.delete_queue("good")
        gone = _scrape_until(port, lambda s: ts(s, "queue", "good") is None, "a deleted queue keeps its timestamp")
        assert _get(gone, "shmq_snapshot_failures_total") == settled  # no more failures once bad was written
    finally:
        assert srv.stop() == 0  # (a failure above: stopped all the same, its lock file gone)


def test_the_snapshotter_counts_a_gone_data_dir(broker, tmp_path):
    broker.create_queue("q")
    data = tmp_path / "data"
    snap = Snapshotter(broker, str(data))
    metrics = Metrics(broker.namespace)
    metrics.watch(None, snap)
    try:
        snap.run_once()
        assert (snap.failures, list(snap.last_good)) == (0, [("queue", "q")])
        shutil.rmtree(data)
        snap.run_once()
        assert snap.failures == 1  # the round, once
        failures, queues, _streams, alarm, _free = snapshot_families(metrics.snapshotter)
        assert [s.value for s in alarm.samples] == [0]
        assert [s.value for s in failures.samples] == [1]
        assert [(s.labels, s.value) for s in queues.samples] == [({"queue": "q"}, snap.last_good[("queue", "q")])]
    finally:
        snap.close()


def test_a_server_without_metrics_never_imports_prometheus_client():
    """prometheus_client (its HTTP server and collectors) costs each server start a tenth
    of its CPU: a server without --metrics, and the CLI, import none of it."""
    code = ("import sys, shmq.server.main, shmq.server.tcp, shmq.cli.ops; "
            "print(sorted(m for m in sys.modules if m.startswith('prometheus_client') or m == 'shmq.server.exporter'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr
