"""What ``shmq stats`` and ``shmq top`` show: rich tables of the queues and streams of a
broker, on either transport. The one place the numbers are formatted for people (sizes in
KiB/MiB/GiB, durations in µs/ms/s/m/h, names in natural order: ``q2`` before ``q10``).

A queue's health is three numbers: its depth (ready messages), the age of its oldest
ready message, and the depth of its dead-letter queue (DLQ). The DLQ's depth is shown on
its source's row, and the DLQ's own row comes right under its source, marked ``└``.
A queue's DLQ is its ``dead_letter_queue`` setting (``settings()``, on both transports; a
server older than the STATS reply's ``settings`` does not say, and then every queue is
listed on its own and the DLQ column is left out, with a note saying why).

``top`` samples twice and shows rates: puts and acks per second from the difference of
``enqueued_total`` and ``acked_total``, appends per second of a stream, records per second
a group commits.
"""

import os
import re
import select
import signal
import sys
import termios
import time
import tty
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .errors import QueueNotFound, StreamNotFound
from .spark.staging import STAGING

__all__ = ["Sample", "Sampler", "natural_key", "human_bytes", "human_duration", "human_rate", "human_count",
           "stats_view", "stream_stats_view", "top_view", "console", "run_top"]

UNKNOWN = object()  # a queue's DLQ when the server does not say (older than STATS's settings)
REMOTE_NOTE = "dead-letter links: not known (the server's STATS replies do not report dead_letter_queue)"


# ---------------------------------------------------------------- units
def natural_key(name: str):
    """Sort key putting ``q2`` before ``q10``: digit runs compare as numbers."""
    parts = re.split(r"(\d+)", name)
    return [int(p) if i % 2 else p.casefold() for i, p in enumerate(parts)], name


def human_bytes(n: int) -> str:
    """1023 B, 1.5 KiB, 64 MiB, 2.3 GiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    text = f"{value:.1f}" if value < 10 else f"{value:.0f}"
    return f"{text.removesuffix('.0')} {unit}"


def human_duration(s: float) -> str:
    """350µs, 12ms, 1.5s, 42s, 4m05s, 2h03m, 3d04h."""
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1:
        return f"{s * 1e3:.0f}ms"
    if s < 9.95:
        return f"{s:.1f}s"
    if s < 59.5:
        return f"{s:.0f}s"
    whole = int(s + 0.5)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def human_rate(r) -> str:
    """Per second: 0, 0.4, 7.5, 120, 1.2k, 15k, 3.4M; ``-`` when not known (yet)."""
    if r is None:
        return "-"
    if r == 0:
        return "0"
    for scale, unit in ((1e6, "M"), (1e3, "k")):
        if r >= scale * 0.9995:
            v = r / scale
            return f"{v:.1f}{unit}" if v < 9.95 else f"{v:.0f}{unit}"
    return f"{r:.1f}" if r < 9.95 else f"{r:.0f}"


def human_count(n: int) -> str:
    return f"{n:,}"


# ---------------------------------------------------------------- samples
@dataclass
class Sample:
    """One look at a broker: the stats of its queues and streams, at ``at`` (monotonic)."""

    at: float
    queues: dict  # name: QueueStats
    dlq: dict  # name: its DLQ's name, None, or UNKNOWN
    others: dict = field(default_factory=dict)  # QueueStats of DLQs not listed (stats NAME)
    streams: dict = field(default_factory=dict)  # name: Stream.stats() (+ "staged": {writer: records})

    def dlq_depth(self, name):
        """Messages held by ``name``'s DLQ (ready, leased and delayed); None: it has none,
        UNKNOWN: not known, "gone": it names a queue that does not exist."""
        target = self.dlq.get(name, UNKNOWN)
        if target is None or target is UNKNOWN:
            return target
        s = self.queues.get(target) or self.others.get(target)
        return "gone" if s is None else s.ready + s.in_flight + s.delayed

    @property
    def links_known(self) -> bool:
        return all(v is not UNKNOWN for v in self.dlq.values())


class Sampler:
    """Samples a broker, keeping its queue and stream handles open between samples (``top``)."""

    def __init__(self, broker):
        self.broker = broker
        self._queues = {}
        self._streams = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for h in (*self._queues.values(), *self._streams.values()):
            h.close()
        self._queues.clear()
        self._streams.clear()

    def sample(self, queues=None, streams=None) -> Sample:
        """Stats of ``queues`` and ``streams`` (None: every one; a name gone since it was
        listed is left out), and of the DLQs they name."""
        queues = self.broker.list_queues() if queues is None else queues
        out = Sample(time.monotonic(), {}, {})
        for name in queues:
            got = self._queue_stats(name)
            if got is not None:
                out.queues[name], out.dlq[name] = got
        for target in {t for t in out.dlq.values() if isinstance(t, str)} - set(out.queues):
            got = self._queue_stats(target)
            if got is not None:
                out.others[target] = got[0]
        self._forget(self._queues, set(queues) | set(out.others))
        if streams is None:
            streams = self.broker.list_streams()
        for name in streams:
            st = self._stream_stats(name)
            if st is not None:
                out.streams[name] = st
        self._forget(self._streams, set(streams))
        for name, st in out.streams.items():  # what a Spark sink staged for it, as shmq.spark.staging counts it
            if STAGING not in name:
                prefix = name + STAGING
                staged = {n[len(prefix):]: held(s) for n, s in out.streams.items() if n.startswith(prefix)}
                if staged:
                    st["staged"] = staged
        out.at = (out.at + time.monotonic()) / 2  # the middle of the look
        return out

    @staticmethod
    def _forget(handles, keep):
        for name in set(handles) - keep:
            handles.pop(name).close()

    def _queue_stats(self, name):
        for _ in range(2):  # a cached handle on a queue deleted (and made again) since: once more
            h = self._queues.get(name)
            try:
                if h is None:
                    h = self._queues[name] = self.broker.queue(name)
                return h.stats(), h.settings().get("dead_letter_queue", UNKNOWN)  # {}: an older server
            except QueueNotFound:
                if h is not None:
                    self._queues.pop(name).close()
        return None

    def _stream_stats(self, name):
        for _ in range(2):
            h = self._streams.get(name)
            try:
                if h is None:
                    h = self._streams[name] = self.broker.stream(name)
                if getattr(h, "deleted", False) is True:
                    raise StreamNotFound(name)
                return h.stats()
            except StreamNotFound:
                if h is not None:
                    self._streams.pop(name).close()
        return None


def held(stream_stats) -> int:
    """Records a stream holds: end - earliest, over its partitions."""
    return sum(p["end"] - p["earliest"] for p in stream_stats["partitions"])


# ---------------------------------------------------------------- tables
class Fitted:
    """A table without borders (it reads well piped into a file, a pager or grep), the
    first ``left`` columns to the left, the numbers to the right, that fits the width it is
    drawn at: when too wide, it leaves out its least needed columns (``drop``: header ->
    rank, 1 goes first). Piped, ``console()`` is wide enough for every column."""

    def __init__(self, *headers, left=1, drop=None):
        self.headers, self.left, self.drop, self.rows = list(headers), left, drop or {}, []

    def add_row(self, *cells):
        self.rows.append(cells)

    def table(self, keep=None) -> Table:
        keep = self.headers if keep is None else keep
        t = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
        for i, h in enumerate(self.headers):
            if h in keep:
                t.add_column(h, justify="left" if i < self.left else "right", no_wrap=True, overflow="ellipsis")
        for row in self.rows:
            t.add_row(*(cell for h, cell in zip(self.headers, row) if h in keep))
        return t

    def __rich_console__(self, console, options):
        keep = list(self.headers)
        t = self.table(keep)
        unbounded = options.update(max_width=2**20)  # a measure at options.max_width is clamped to it
        for h in sorted((h for h in self.drop if h in keep), key=self.drop.get):  # (optional columns may be absent)
            if console.measure(t, options=unbounded).maximum <= options.max_width:
                break
            keep.remove(h)
            t = self.table(keep)
        yield t


def _queue_order(sample: Sample, keys):
    """The queues in display order: each in the order of ``keys`` (a sort key per name),
    its DLQ (and the DLQ's DLQ...) right under it, marked with its depth in the tree."""
    parent = {}
    for name in sorted(sample.queues, key=natural_key):
        target = sample.dlq.get(name)
        if isinstance(target, str) and target in sample.queues and target != name and target not in parent:
            up = name  # no cycles: a queue is not put under one of its own dead-letter descendants
            while up in parent and up != target:
                up = parent[up]
            if up != target:
                parent[target] = name
    children = {}
    for child, p in parent.items():
        children.setdefault(p, []).append(child)
    order = []

    def walk(name, level):
        order.append((name, level))
        for child in sorted(children.get(name, ()), key=keys):
            walk(child, level + 1)

    for name in sorted((n for n in sample.queues if n not in parent), key=keys):
        walk(name, 0)
    return order


def _label(name, level):
    return name if not level else "  " * (level - 1) + "└ " + name


def _dlq_cell(sample, name):
    d = sample.dlq_depth(name)
    return "-" if d is None else d if isinstance(d, str) else human_count(d)


def _oldest(s):
    return human_duration(s.oldest_ready_age_s) if s.ready else "-"


def _by_priority(s) -> str:
    """Ready messages per priority level, highest first (``2:5 1:0 0:3``); ``-`` for one level."""
    levels = s.ready_by_priority
    return "-" if len(levels) < 2 else " ".join(f"{p}:{human_count(levels[p])}" for p in reversed(range(len(levels))))


def queue_stats_table(sample: Sample) -> Fitted:
    """``shmq stats``: every queue's counters, DLQs under their sources, in natural order.
    Columns shown only where they say something: ready by priority (a queue with
    priority levels), consumers (a queue with consumers registered), expired (a message
    dropped for its TTL)."""
    links = sample.links_known
    levels = any(len(s.ready_by_priority) > 1 for s in sample.queues.values())
    expired = any(s.expired_total for s in sample.queues.values())
    consumers = any(s.consumers for s in sample.queues.values())
    t = Fitted("queue", "ready", *(["by priority"] if levels else []), *(["consumers"] if consumers else []),
               "in flight", "delayed", "oldest",
               *(["dlq"] if links else []), "used", "memory", "max", "put", "acked", "redelivered",
               "dead-lettered", *(["expired"] if expired else []),
               drop={"max": 1, "redelivered": 2, "expired": 3, "dead-lettered": 4, "acked": 5, "put": 6, "used": 7,
                     "delayed": 8, "by priority": 9, "memory": 10})
    for name, level in _queue_order(sample, natural_key):
        s = sample.queues[name]
        t.add_row(_label(name, level), human_count(s.ready), *([_by_priority(s)] if levels else []),
                  *([human_count(s.consumers)] if consumers else []), human_count(s.in_flight), human_count(s.delayed), _oldest(s),
                  *([_dlq_cell(sample, name)] if links else []), human_bytes(s.bytes_used),
                  human_bytes(s.bytes_held), human_bytes(s.max_bytes), human_count(s.enqueued_total), human_count(s.acked_total),
                  human_count(s.redelivered_total), human_count(s.dead_lettered_total),
                  *([human_count(s.expired_total)] if expired else []))
    return t


def _visible(stream_stats):
    """The streams to list: the Spark staging streams are shown as what they stage for."""
    return {n: st for n, st in stream_stats.items() if STAGING not in n}


def stream_tables(stream_stats, per_partition=False, previous=None, dt=None, sort="name") -> list:
    """Streams (a row each, or a row per partition), then what Spark sinks staged for them,
    then their groups with members and total lag (``shmq group lag`` has it per partition).
    With a ``previous`` sample ``dt`` seconds before: appends/s and records committed/s."""
    streams = _visible(stream_stats)
    if not streams:
        return []
    rates = previous is not None

    def rate(now, before):
        return None if before is None or now < before or not dt else (now - before) / dt

    out = []
    if per_partition:
        compacted = any(streams[n].get("compact") for n in streams)
        t = Fitted("stream", "partition", "earliest", "end", "bytes", "memory", "max", "appended", "dropped",
                   *(["dirty"] if compacted else []), drop={"max": 1, "dropped": 2, "appended": 3, "memory": 4})
        for name in sorted(streams, key=natural_key):
            for p in streams[name]["partitions"]:
                dirty = [f"{100 * p['dirty_ratio']:.0f}%" if "dirty_ratio" in p else "-"] if compacted else []
                t.add_row(name, str(p["partition"]), human_count(p["earliest"]), human_count(p["end"]),
                          human_bytes(p["bytes"]), human_bytes(p.get("bytes_held", 0)), human_bytes(p["max_bytes"]),
                          human_count(p["appended_total"]), human_count(p["dropped_total"]), *dirty)
    else:
        def appended(st):
            return sum(p["appended_total"] for p in st["partitions"])

        rows = []
        for name, st in streams.items():
            before = (previous or {}).get(name)
            r = rate(appended(st), appended(before)) if before is not None else None
            rows.append((name, st, r))
        if sort == "rate":
            rows.sort(key=lambda row: (-(row[2] or 0), natural_key(row[0])))
        elif sort == "depth":
            rows.sort(key=lambda row: (-held(row[1]), natural_key(row[0])))
        else:
            rows.sort(key=lambda row: natural_key(row[0]))
        t = Fitted("stream", "partitions", "records", "bytes", "memory", "max", *(["append/s"] if rates else []),
                   "appended", "dropped", drop={"max": 1, "dropped": 2, "appended": 3, "memory": 4, "bytes": 5})
        for name, st, r in rows:
            parts = st["partitions"]
            t.add_row(name, str(len(parts)), human_count(held(st)), human_bytes(sum(p["bytes"] for p in parts)),
                      human_bytes(sum(p.get("bytes_held", 0) for p in parts)),
                      human_bytes(sum(p["max_bytes"] for p in parts)), *([human_rate(r)] if rates else []),
                      human_count(appended(st)), human_count(sum(p["dropped_total"] for p in parts)))
    out.append(t)
    staged = [(n, w, records) for n in sorted(streams, key=natural_key)
              for w, records in sorted(streams[n].get("staged", {}).items(), key=lambda i: natural_key(i[0]))]
    if staged:
        t = Fitted("stream", "staged by", "records", left=2)
        for n, w, records in staged:
            t.add_row(n, w, human_count(records))
        out.append(t)
    groups = []
    for n in sorted(streams, key=natural_key):
        for g, info in streams[n]["groups"].items():
            r = None
            before = ((previous or {}).get(n) or {}).get("groups", {}).get(g)
            if before is not None:
                r = rate(sum(info["committed"].values()), sum(before["committed"].values()))
            groups.append((n, g, info["members"], sum(info["lag"].values()), r))
    groups.sort(key=lambda row: natural_key(row[1]))
    groups.sort(key=lambda row: natural_key(row[0]))
    if sort in ("depth", "age", "dlq"):
        groups.sort(key=lambda row: -row[3])
    elif sort == "rate":
        groups.sort(key=lambda row: -(row[4] or 0))
    if groups:
        t = Fitted("stream", "group", "members", "lag", *(["commit/s"] if rates else []), left=2)
        for n, g, members, lag, r in groups:
            t.add_row(n, g, str(members), human_count(lag), *([human_rate(r)] if rates else []))
        out.append(t)
    return out


def _spaced(renderables):
    """Renderables one under the other, a blank line between."""
    items = []
    for r in renderables:
        if items:
            items.append(Text(""))
        items.append(r)
    return Group(*items)


def stats_view(sample: Sample, stream_stats) -> Group:
    """``shmq stats``: the queues (when there are any, or nothing at all), then the streams."""
    parts = []
    if sample.queues or not _visible(stream_stats):
        parts.append(queue_stats_table(sample))
        if not sample.links_known and sample.queues:
            parts.append(Text(REMOTE_NOTE, style="dim"))
    parts += stream_tables(stream_stats)
    return _spaced(parts)


def stream_stats_view(stream_stats) -> Group:
    """``shmq stream stats``: a row per partition, staged records, groups."""
    return _spaced(stream_tables(stream_stats, per_partition=True))


# ---------------------------------------------------------------- top
def _queue_rates(before: Sample, now: Sample):
    """{queue: (put/s, ack/s)}; None where not known (new since, or counters went back)."""
    dt = now.at - before.at
    out = {}
    for name, s in now.queues.items():
        b = before.queues.get(name)
        if b is None or dt <= 0 or s.enqueued_total < b.enqueued_total or s.acked_total < b.acked_total:
            out[name] = (None, None)
        else:
            out[name] = ((s.enqueued_total - b.enqueued_total) / dt, (s.acked_total - b.acked_total) / dt)
    return out


def top_queue_table(before: Sample, now: Sample, sort="depth") -> Fitted:
    rates = _queue_rates(before, now)
    links = now.links_known

    def dlq_sort(name):
        d = now.dlq_depth(name)
        return d if isinstance(d, int) else -1

    numeric = {
        "depth": lambda n: now.queues[n].ready,
        "age": lambda n: now.queues[n].oldest_ready_age_s if now.queues[n].ready else -1.0,
        "dlq": dlq_sort,
        "rate": lambda n: sum(r or 0 for r in rates[n]),
    }.get(sort)
    keys = natural_key if numeric is None else (lambda n: (-numeric(n), natural_key(n)))
    t = Fitted("queue", "ready", "in flight", "delayed", "oldest", *(["dlq"] if links else []), "put/s", "ack/s",
               "used", "memory", "full", drop={"full": 1, "used": 2, "delayed": 3, "memory": 4})
    for name, level in _queue_order(now, keys):
        s = now.queues[name]
        put, ack = rates[name]
        t.add_row(_label(name, level), human_count(s.ready), human_count(s.in_flight), human_count(s.delayed),
                  _oldest(s), *([_dlq_cell(now, name)] if links else []), human_rate(put), human_rate(ack),
                  human_bytes(s.bytes_used), human_bytes(s.bytes_held),
                  f"{100 * s.bytes_used / s.max_bytes:.0f}%" if s.max_bytes else "-")
    return t


def top_view(before: Sample, now: Sample, where: str, sort="depth", live=False) -> Group:
    """One frame of ``shmq top``: a header line, the queues, the streams and their groups."""
    streams = _visible(now.streams)
    head = Text.assemble(
        ("shmq top", "bold"), f"  {where}  ", f"{len(now.queues)} queue(s), {len(streams)} stream(s)  ",
        f"sort: {sort}  ", f"rates over {now.at - before.at:.1f}s  " if now is not before else "rates: next frame  ",
        time.strftime("%H:%M:%S"), ("  (q quits)" if live else ""))
    parts = [head]
    if now.queues or not streams:
        parts.append(top_queue_table(before, now, sort))
        if not now.links_known and now.queues:
            parts.append(Text(REMOTE_NOTE, style="dim"))
    parts += stream_tables(now.streams, previous=before.streams, dt=now.at - before.at, sort=sort)
    return _spaced(parts)


def console(file=None) -> Console:
    """A console on stdout: on a terminal, its width and colors; piped, plain text whose
    lines are never cut or wrapped."""
    file = file or sys.stdout
    c = Console(file=file, highlight=False, soft_wrap=False)
    if not c.is_terminal:
        c = Console(file=file, highlight=False, soft_wrap=False, width=1000, color_system=None)
    return c


@contextmanager
def _keys():
    """The terminal on stdin in cbreak mode (single keys; its mode restored after), its
    descriptor yielded; None without a terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield None
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextmanager
def _stop_asked():
    """Ctrl-C (SIGINT) and SIGTERM as a request to stop, answered between samples: their
    handler only notes it and wakes the wait (``signal.set_wakeup_fd``). A KeyboardInterrupt
    raised inside a sample could land between a lock taken and the ``try`` that lets it go
    (the engine's Python paths take it in one call and give it back in another), or
    half-way through a frame's drawing. Yields
    ``wait(seconds, keys) -> True`` once a stop is asked or q (or EOF) is read from ``keys``
    (a terminal's descriptor, or None)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    asked = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: asked.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    old_fd = signal.set_wakeup_fd(w)

    def wait(seconds, keys=None):
        deadline = time.monotonic() + seconds
        fds = [r] if keys is None else [r, keys]
        while not asked and (left := deadline - time.monotonic()) > 0:
            ready = select.select(fds, [], [], left)[0]
            if r in ready:
                os.read(r, 512)  # (the signals' bytes: the handler has noted them)
            if keys is not None and keys in ready:
                key = os.read(keys, 64)
                if not key or b"q" in key.lower():
                    return True  # q, Q, or the terminal went away
        return bool(asked)

    try:
        yield wait
    finally:
        signal.set_wakeup_fd(old_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(r)
        os.close(w)


def run_top(broker, where, sort="depth", interval=1.0, once=False, out=None):
    """``shmq top``: sample every ``interval`` seconds and show the frame, until q, Ctrl-C
    or SIGTERM (then return: exit 0; asked between samples, ``_stop_asked``); with
    ``once``, two samples ``interval`` apart, one frame. Piped (no terminal), it prints a
    frame per interval, one after the other."""
    con = console(out)
    with _stop_asked() as wait, Sampler(broker) as sampler:
        before = sampler.sample()
        if once:
            if not wait(interval):  # the interval the rates are measured over
                con.print(top_view(before, sampler.sample(), where, sort))
            return
        if not con.is_terminal:
            while not wait(interval):
                now = sampler.sample()
                con.print(top_view(before, now, where, sort))
                con.print()
                con.file.flush()  # a frame at a time, for tail -f
                before = now
            return
        from rich.live import Live

        with _keys() as keys, Live(console=con, screen=True, auto_refresh=False,
                                   redirect_stdout=False, redirect_stderr=False) as live:
            live.update(top_view(before, before, where, sort, live=True), refresh=True)  # no rates yet
            while not wait(interval, keys):
                now = sampler.sample()
                live.update(top_view(before, now, where, sort, live=True), refresh=True)
                before = now
