"""The server's own metrics for ``shmq server --metrics HOST:PORT`` (docs/METRICS.md):
its requests, counted by the loop in plain dicts (no lock on the request path), and the
switch: with metrics off the server holds ``NO_METRICS``, whose hook is the dispatch
itself. What a scrape reads and serves is ``exporter``'s, imported only when metrics are
on (``prometheus_client`` is not a cost of a server without them)."""

import functools
from bisect import bisect_left
from time import perf_counter

__all__ = ["Metrics", "NO_METRICS", "parse_address", "LATENCY_BUCKETS", "DEFAULT_PORT"]

DEFAULT_PORT = 9464  # the port the docs name (nothing listens by default)
# Request latency buckets, seconds: most requests take tens of microseconds.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BUCKETS = len(LATENCY_BUCKETS) + 1  # a latency histogram's buckets, +Inf's the last


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` or ``PORT`` -> (host, port); the host
    defaults to 127.0.0.1. ValueError, in one line, for anything else."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if (":" in host and not bracketed) or not (port.isascii() and port.isdigit()) or int(port) > 65535 \
            or value != value.strip():
        raise ValueError(f"--metrics must be HOST:PORT (like 127.0.0.1:{DEFAULT_PORT}; port 0: any free), "
                         f"not {value!r}")
    return host or "127.0.0.1", int(port)


class NoMetrics:
    """Metrics off: a connection's request hook is its dispatch itself, no call between."""

    __slots__ = ()

    @staticmethod
    def timing(dispatch):
        return dispatch

    def watch(self, server, snapshotter=None):
        pass

    def close(self):
        pass


NO_METRICS = NoMetrics()


class Metrics:
    """The server's metrics: its request counters (``timed``, on the loop) and the HTTP
    endpoint serving them with every queue's and stream's numbers (``start``)."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        # request type (int) -> [count in each bucket (not cumulative) ..., +Inf count, sum of seconds]
        self.latency = {}
        self.errors = {}  # (request type, status) -> error replies given at dispatch
        self.server = None  # the TcpServer whose connections are counted (``watch``)
        self.snapshotter = None  # the persistence.Snapshotter whose rounds are told (``watch``); None: no data dir
        self.collector = None
        self._httpd = None
        self._thread = None

    def timing(self, dispatch):
        """A connection's request hook: its ``dispatch``, counted and timed (``timed``)."""
        return functools.partial(self.timed, dispatch)

    def timed(self, dispatch, frame):
        """``dispatch(frame)`` (it returns the status it answered with, None while the
        request waits), counted and timed under the request's type."""
        t0 = perf_counter()
        status = dispatch(frame)
        return self.count(frame[0], perf_counter() - t0, status)  # (frame[0]: its type, FrameDecoder.next_parts)

    def count(self, t, seconds, status):
        """A request of type ``t`` answered in ``seconds`` with ``status`` (None: it waits),
        counted (the plain requests served in C call this one too)."""
        h = self.latency.get(t)
        if h is None:
            h = self.latency[t] = [0] * BUCKETS + [0.0]
        h[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h[-1] += seconds
        if status:
            key = (t, status)
            self.errors[key] = self.errors.get(key, 0) + 1
        return status

    def watch(self, server, snapshotter=None):
        """Count ``server``'s (a TcpServer's) open connections too, and tell what
        ``snapshotter`` (a ``persistence.Snapshotter``, or None) snapshots."""
        self.server = server
        self.snapshotter = snapshotter

    def start(self, host: str, port: int, setting: str = "--metrics") -> int:
        """Serve /metrics on ``host:port`` (0: any free) in a thread; returns the port.
        ShmqError, in one line naming ``setting`` (what chose the address), when it cannot
        be bound (``tcp.listen_error``)."""
        from .exporter import serve

        self._httpd, self._thread, self.collector = serve(self, host, port, setting)
        return self._httpd.server_port

    def close(self):
        """Stop serving; a scrape under way finishes first."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(5)
            self._httpd = None
        if self.collector is not None:
            self.collector.close()
