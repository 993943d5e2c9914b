"""What a scrape of ``shmq server --metrics`` reads and serves (docs/METRICS.md).

Strategy: nothing is counted twice. The queue and stream numbers already live in shared
memory (``Queue.stats()``, a stream's partition offsets and its groups' commits), kept
by every process that uses them, so a custom ``prometheus_client`` collector
(``ShmqCollector``) reads them at scrape time, in the HTTP server's thread, through a
broker of its own: one scrape covers the traffic of every process, local or remote. The
server adds what only it knows (``metrics.Metrics``): its requests (the scrape thread
copies the loop's dicts, each copy one step under the GIL), its open connections and its
snapshots (the ``Snapshotter``'s ``failures`` and ``last_good``, read at scrape time
too). /dev/shm's size and free space come from one ``statvfs`` a scrape, the process'
own numbers (RSS, descriptors, CPU) from ``prometheus_client``'s ``ProcessCollector``.
``prometheus_client`` writes the exposition format and serves it (``start_http_server``:
a daemon thread, so the asyncio loop never serves a scrape).
"""

import logging
import os
import threading

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ..engine.broker import Broker
from ..engine.shm.segment import SHM_DIR
from ..errors import QueueNotFound, ShmqError, StreamNotFound
from ..protocol import MsgType, Status
from .metrics import LATENCY_BUCKETS, Metrics

__all__ = ["ShmqCollector", "request_families", "serve", "snapshot_families"]

log = logging.getLogger("shmq.server")

SCRAPE_LOCK_TIMEOUT_S = 1.0  # the longest a scrape waits for one queue's or stream's lock (then skips it)
_LE = [repr(b) for b in LATENCY_BUCKETS] + ["+Inf"]
_TYPE_NAMES = {t: MsgType(t).name for t in MsgType}
_STATUS_NAMES = {s: Status(s).name for s in Status}

# QueueStats fields exported as gauges and counters: (field, metric name, help, unit)
_QUEUE_GAUGES = (
    ("ready", "shmq_queue_ready", "Messages ready to be delivered (the visible depth).", ""),
    ("in_flight", "shmq_queue_in_flight", "Messages delivered and not yet settled (leased).", ""),
    ("delayed", "shmq_queue_delayed", "Messages nacked with a delay, not yet ready again.", ""),
    ("oldest_ready_age_s", "shmq_queue_oldest_ready_age_seconds",
     "Age of the oldest ready message (0 when none is ready).", "seconds"),
    ("bytes_used", "shmq_queue_used_bytes", "Bytes of the queue's ring in use.", "bytes"),
    ("max_bytes", "shmq_queue_capacity_bytes", "Size of the queue's ring (max_bytes).", "bytes"),
    ("bytes_held", "shmq_queue_memory_bytes", "Bytes of /dev/shm the queue holds (its header and the ring's "
     "chunks in use: what the kernel counts).", "bytes"),
    ("consumers_waiting", "shmq_queue_consumers_waiting", "Local consumers asleep in get, waiting for messages.", ""),
    ("producers_waiting", "shmq_queue_producers_waiting", "Local producers asleep in put, waiting for room.", ""),
)
_QUEUE_COUNTERS = (
    ("enqueued_total", "shmq_queue_enqueued", "Messages put since the queue was created."),
    ("acked_total", "shmq_queue_acked", "Messages acknowledged."),
    ("redelivered_total", "shmq_queue_redelivered", "Deliveries made ready again (nack, lapsed lease, dead holder)."),
    ("dead_lettered_total", "shmq_queue_dead_lettered", "Messages moved to the dead-letter queue (or dropped)."),
    ("expired_total", "shmq_queue_expired", "Messages that expired before delivery (TTL): dropped or dead-lettered."),
    ("purged_total", "shmq_queue_purged", "Ready messages dropped by purge."),
)


def request_families(metrics):
    """``metrics``' (a ``Metrics``') families: requests, errors, latency, connections, snapshots."""
    requests = CounterMetricFamily("shmq_requests", "Requests dispatched, by type (counted when they arrive; "
                                   "a waiting CONSUME, READ or POLL once).", labels=["type"])
    errors = CounterMetricFamily("shmq_request_errors", "Error replies given at dispatch, by request type "
                                 "and status.", labels=["type", "status"])
    latency = HistogramMetricFamily("shmq_request_duration_seconds", "Time the server took to handle a "
                                    "request and write its reply (a waiting request: until it is in line).",
                                    labels=["type"], unit="seconds")
    merged = {}
    for t, h in list(metrics.latency.items()):  # one step under the GIL each: no lock against the loop
        name = _TYPE_NAMES.get(t, "UNKNOWN")
        h = list(h)
        m = merged.get(name)
        merged[name] = h if m is None else [a + b for a, b in zip(m, h)]
    for name, h in sorted(merged.items()):
        cumulative, total = [], 0
        for le, n in zip(_LE, h):
            total += n
            cumulative.append((le, total))
        requests.add_metric([name], total)
        latency.add_metric([name], cumulative, h[-1])
    merged_errors = {}
    for (t, s), n in list(metrics.errors.items()):
        key = (_TYPE_NAMES.get(t, "UNKNOWN"), _STATUS_NAMES.get(s, str(s)))
        merged_errors[key] = merged_errors.get(key, 0) + n
    for key, n in sorted(merged_errors.items()):
        errors.add_metric(list(key), n)
    connections = GaugeMetricFamily("shmq_connections", "Open client connections.")
    connections.add_metric([], len(metrics.server.connections) if metrics.server is not None else 0)
    return [requests, errors, latency, connections] + snapshot_families(metrics.snapshotter)


def snapshot_families(snap):
    """The snapshots' metrics, from ``snap``'s (a ``Snapshotter``'s) own counts (no samples
    when None: a server with no data dir snapshots nothing)."""
    failures = CounterMetricFamily("shmq_snapshot_failures", "Snapshot writes that failed (a queue's, a "
                                   "stream's or the exchange table's, each round it fails; a round that finds "
                                   "the data dir gone: one).")
    queues = GaugeMetricFamily("shmq_queue_last_snapshot_timestamp_seconds", "When the queue's last good "
                               "snapshot began (Unix time): the data dir holds the queue as it was then.",
                               labels=["queue"], unit="seconds")
    streams = GaugeMetricFamily("shmq_stream_last_snapshot_timestamp_seconds", "When the stream's last good "
                                "snapshot began (Unix time): the data dir holds the stream as it was then.",
                                labels=["stream"], unit="seconds")
    alarm = GaugeMetricFamily("shmq_disk_alarm", "1 while the data dir has less free space than "
                              "--disk-free-limit: puts and appends of wal queues and streams are refused.")
    free = GaugeMetricFamily("shmq_data_dir_free_bytes", "Free bytes of the data dir's filesystem at the last "
                             "snapshot round's look (with a --disk-free-limit).", unit="bytes")
    if snap is not None:
        failures.add_metric([], snap.failures)
        for (kind, name), when in sorted(list(snap.last_good.items())):  # (a copy in one step under the GIL)
            (queues if kind == "queue" else streams).add_metric([name], when)
        alarm.add_metric([], 1 if snap.alarm else 0)
        if snap.disk_free is not None:
            free.add_metric([], snap.disk_free)
    return [failures, queues, streams, alarm, free]


class ShmqCollector(Collector):
    """Every queue's and stream's numbers, read from shared memory at each scrape
    through handles of its own (``broker``), plus ``metrics``' request families (when
    given). Queues and streams deleted during a scrape are left out of it."""

    def __init__(self, broker: Broker, metrics: Metrics | None = None):
        self.broker = broker
        self.metrics = metrics
        self._queues = {}  # name -> Queue handle, kept from scrape to scrape
        self._streams = {}
        self._lock = threading.Lock()  # scrapes may come at once (a thread each)

    def describe(self):
        return []  # no scrape at registration

    def close(self):
        with self._lock:
            for handles in (self._queues, self._streams):
                for h in handles.values():
                    h.close()
                handles.clear()
            self.broker.close()

    def collect(self):
        with self._lock:
            families = self._queue_families() + self._stream_families() + _shm_families()
        if self.metrics is not None:
            families += request_families(self.metrics)
        return families

    def _handle(self, handles, name, attach):
        h = handles.get(name)
        if h is None or h.deleted:
            if h is not None:
                h.close()
            h = handles[name] = attach(name)
            h.lock_timeout = SCRAPE_LOCK_TIMEOUT_S
        return h

    def _sync(self, handles, names):
        for name in list(handles):
            if name not in names:
                handles.pop(name).close()

    def _queue_families(self):
        names = self.broker.list_queues()
        self._sync(self._queues, set(names))
        stats, dlqs = {}, {}
        for name in names:
            try:
                q = self._handle(self._queues, name, self.broker.queue)
                stats[name] = q.stats()
                dlqs[name] = q.dead_letter_queue
            except QueueNotFound:  # deleted since the list: left out
                h = self._queues.pop(name, None)
                if h is not None:
                    h.close()
            except ShmqError as e:  # a lock held too long by a stopped process, ...
                log.warning("metrics: queue %s left out of this scrape: %s", name, e)
        gauges = [(field, GaugeMetricFamily(metric, doc, labels=["queue"], unit=unit))
                  for field, metric, doc, unit in _QUEUE_GAUGES]
        counters = [(field, CounterMetricFamily(metric, doc, labels=["queue"]))
                    for field, metric, doc in _QUEUE_COUNTERS]
        dl_depth = GaugeMetricFamily("shmq_queue_dead_letter_depth", "Ready messages in the queue's dead-letter "
                                     "queue (0 when it has none).", labels=["queue"])
        for name, s in stats.items():
            for field, family in gauges + counters:
                family.add_metric([name], getattr(s, field))
            dlq = stats.get(dlqs[name])
            dl_depth.add_metric([name], dlq.ready if dlq is not None else 0)
        return [f for _field, f in gauges + counters] + [dl_depth]

    def _stream_families(self):
        names = self.broker.list_streams()
        self._sync(self._streams, set(names))
        kw = {"labels": ["stream", "partition"]}
        earliest = GaugeMetricFamily("shmq_stream_partition_earliest_offset", "Earliest readable offset.", **kw)
        end = GaugeMetricFamily("shmq_stream_partition_end_offset", "The offset the next append gets.", **kw)
        stable = GaugeMetricFamily("shmq_stream_partition_stable_offset", "The last stable offset: readers read below "
                                   "it (the end, unless a transaction is open in the partition).", **kw)
        used = GaugeMetricFamily("shmq_stream_partition_used_bytes", "Bytes of the partition's ring in use.",
                                 unit="bytes", **kw)
        capacity = GaugeMetricFamily("shmq_stream_partition_capacity_bytes", "Size of the partition's ring.",
                                     unit="bytes", **kw)
        held = GaugeMetricFamily("shmq_stream_partition_memory_bytes", "Bytes of /dev/shm the partition holds (its "
                                 "header and the chunks of its index and ring in use).", unit="bytes", **kw)
        appended = CounterMetricFamily("shmq_stream_partition_appended", "Records appended.", **kw)
        dropped = CounterMetricFamily("shmq_stream_partition_dropped", "Records dropped from the ring (when full, "
                                      "or by delete_records).", **kw)
        compactions = CounterMetricFamily("shmq_stream_partition_compactions", "Compaction runs that took records "
                                          "back (a compacted stream's).", **kw)
        compacted = CounterMetricFamily("shmq_stream_partition_compacted_bytes", "Bytes of the ring compaction took "
                                        "back.", unit="bytes", **kw)
        dirty = GaugeMetricFamily("shmq_stream_partition_dirty_ratio", "A compacted stream's bytes appended since "
                                  "its last compaction over all it holds.", **kw)
        kw = {"labels": ["stream", "group"]}
        lag = GaugeMetricFamily("shmq_stream_group_lag", "Records between the group's committed offsets and the "
                                "ends, over all partitions.", **kw)
        members = GaugeMetricFamily("shmq_stream_group_members", "Live members of the group.", **kw)
        part_lag = GaugeMetricFamily("shmq_stream_group_partition_lag", "Records between the group's committed "
                                     "offset and the end, per partition.", labels=["stream", "group", "partition"])
        for name in names:
            try:
                st = self._handle(self._streams, name, self.broker.stream).stats()
            except StreamNotFound:
                self._streams.pop(name, None)
                continue
            except ShmqError as e:
                log.warning("metrics: stream %s left out of this scrape: %s", name, e)
                continue
            for p in st["partitions"]:
                labels = [name, str(p["partition"])]
                earliest.add_metric(labels, p["earliest"])
                end.add_metric(labels, p["end"])
                stable.add_metric(labels, p.get("stable", p["end"]))
                used.add_metric(labels, p["bytes"])
                capacity.add_metric(labels, p["max_bytes"])
                held.add_metric(labels, p.get("bytes_held", 0))
                appended.add_metric(labels, p["appended_total"])
                dropped.add_metric(labels, p["dropped_total"])
                compactions.add_metric(labels, p.get("compactions_total", 0))
                compacted.add_metric(labels, p.get("compacted_bytes_total", 0))
                if "dirty_ratio" in p:
                    dirty.add_metric(labels, p["dirty_ratio"])
            for group, g in sorted(st["groups"].items()):
                lag.add_metric([name, group], sum(g["lag"].values()))
                members.add_metric([name, group], g["members"])
                for p, n in sorted(g["lag"].items()):
                    part_lag.add_metric([name, group, str(p)], n)
        return [earliest, end, stable, used, capacity, held, appended, dropped, compactions, compacted, dirty, lag,
                part_lag, members]


def _shm_families():
    """/dev/shm's size and free space: one ``statvfs`` (as ``segment.free_bytes`` counts:
    the blocks an unprivileged writer may still take)."""
    size = GaugeMetricFamily("shmq_dev_shm_size_bytes", f"Size of {SHM_DIR}, where queues and streams live.",
                             unit="bytes")
    free = GaugeMetricFamily("shmq_dev_shm_free_bytes", f"Bytes {SHM_DIR} has free: what new chunks of queues and "
                             "streams can still take.", unit="bytes")
    try:
        st = os.statvfs(SHM_DIR)
    except OSError as e:  # (shmq cannot run without it: not seen)
        log.warning("metrics: %s left out of this scrape: %s", SHM_DIR, e)
    else:
        size.add_metric([], st.f_blocks * st.f_frsize)
        free.add_metric([], st.f_bavail * st.f_frsize)
    return [size, free]


def serve(metrics: Metrics, host: str, port: int, setting: str):
    """(the HTTP server, its thread, its collector) serving /metrics on ``host:port`` (0:
    any free): every queue's and stream's numbers and ``metrics``'. ShmqError, in one line
    naming ``setting`` (what chose the address), when it cannot be bound
    (``tcp.listen_error``)."""
    from .tcp import listen_error

    registry = CollectorRegistry(auto_describe=False)
    collector = ShmqCollector(Broker(metrics.namespace), metrics)
    registry.register(collector)
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, process_open_fds, ...: this process'
    try:
        httpd, thread = start_http_server(port, host, registry=registry)
    except OSError as e:
        collector.close()
        raise listen_error(e, host, port, setting) from None
    return httpd, thread, collector
