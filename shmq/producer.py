"""A batching producer for a stream, Kafka's: ``send`` returns a Future at once, and a
thread appends the records in batches.

Strategy: the producer knows only the public stream API (``append_many``, ``name``,
``partitions``, ``max_bytes``), so it works the same over a local ``Stream`` and a
remote one. ``send`` files a record into the open batch of its *route*: the
``partition`` it names, or None, where ``append_many`` routes by key (Kafka's murmur2) and sends
key-less records to one partition per call. One sender thread takes closed batches in
the order they were closed and appends them one at a time; a route has one open batch
at a time, so a key (always on one route) reaches the stream in send order, across
batches. A batch closes when its first record is ``linger_ms`` old (time), when the
unsent records of all routes reach ``batch_bytes`` (size: every open batch closes), or
before a record would make it larger than the stream's ring (``max_bytes``: a batch is
appended whole, so it must fit in a partition). ``send`` waits only while
``batch_bytes`` of unsent records wait for the sender (backpressure: a producer holds at
most about twice ``batch_bytes``: one batch being appended and one load filling).
"""

import atexit
import os
import threading
import time
from collections import deque
from concurrent.futures import Future

from .model.headers import encode_record_headers
from .engine.streams.partition import record_size
from .engine.queues.produce import as_bytes as _bytes
from .errors import ShmqError

__all__ = ["Producer"]

_mono = time.monotonic
_open_producers = set()  # closed at interpreter exit, so sent records are not lost with the process


class _Batch:
    """Records of one route, appended together by one ``append_many``."""

    __slots__ = ("partition", "due", "values", "keys", "headers", "futures", "size")

    def __init__(self, partition, due):
        self.partition, self.due = partition, due
        self.values, self.keys, self.headers, self.futures = [], [], [], []
        self.size = 0


class Producer:
    """Batches the records sent to ``stream`` and appends them from a thread.

    ``linger_ms``: how long a batch waits for more records after its first one.
    ``batch_bytes``: how many bytes of unsent records (as each takes in a partition:
    a 48-byte header, key, encoded headers and value) send a batch before its time; a
    record that large goes in a batch of its own, and no batch grows past the stream's
    ``max_bytes``. ``compression`` goes to ``append_many`` (the wire's; locally
    ignored). Close it (or use it as a context manager): close flushes; producers still
    open at interpreter exit are closed then.
    """

    def __init__(self, stream, linger_ms: float = 5, batch_bytes: int = 64 * 2**10, compression=None):
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, (int, float)) or not 0 <= linger_ms < 10**9:
            raise ValueError(f"linger_ms must be a number of milliseconds >= 0, not {linger_ms!r}")
        if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int) or batch_bytes < 1:
            raise ValueError(f"batch_bytes must be a positive int, not {batch_bytes!r}")
        stream.append_many([], compression=compression)  # checks compression; appends nothing
        self.stream = stream
        self._ring = stream.max_bytes  # a batch larger than a partition's ring could never be appended
        self.linger_ms, self.batch_bytes, self.compression = linger_ms, batch_bytes, compression
        self._linger = linger_ms / 1000
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._open = {}  # route (partition or None) -> its open _Batch
        self._ready = deque()  # closed batches, in the order they closed
        self._unsent = 0  # bytes in open and ready batches
        self._closed_count = 0  # batches ever closed
        self._done_count = 0  # batches appended (or failed); they finish in the order they closed
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"shmq-producer-{stream.name}", daemon=True)
        self._thread.start()
        _open_producers.add(self)

    def __repr__(self):
        return f"<shmq.Producer {self.stream.name} linger_ms={self.linger_ms} batch_bytes={self.batch_bytes}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ the caller's side
    def send(self, value, key=None, headers=None, partition=None) -> Future:
        """File a record; returns a Future of its RecordMetadata (or of the append's
        error, shared by its whole batch). Bad arguments raise here (TypeError,
        ValueError); ShmqError once the producer is closed. Waits only while
        ``batch_bytes`` of unsent records wait for the sender. Cancelling the future
        before its batch is taken leaves the record out."""
        if value is not None:  # (None: a tombstone)
            value = _bytes(value, "value")  # bytes, or a copy: the caller may reuse its buffer
        if key is not None:
            key = _bytes(key, "key")
        hraw = encode_record_headers(headers)  # validates them here, so a bad header fails no batch
        if headers is not None:
            headers = dict(headers) if isinstance(headers, dict) else list(headers)
        size = record_size(key, hraw, value)
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise TypeError(f"partition must be an int, not {type(partition).__name__}")
            if not 0 <= partition < self.stream.partitions:
                raise ValueError(f"stream {self.stream.name!r} has partitions 0..{self.stream.partitions - 1}, "
                                 f"not {partition}")
        self._check_process()
        future = Future()
        with self._cond:
            self._check_usable()
            if threading.current_thread() is not self._thread:  # a callback never waits for its own thread
                while self._unsent >= self.batch_bytes and not self._closing:
                    self._cond.wait()
                self._check_usable()
            batch = self._open.get(partition)
            if size >= self.batch_bytes or (batch is not None and batch.size + size > self._ring):
                self._close_open()  # a big record goes alone (if it is too big, it fails no one else)
                batch = None
            if batch is None:
                batch = self._open[partition] = _Batch(partition, _mono() + self._linger)
                self._cond.notify_all()  # the sender's next wake-up may be sooner now
            batch.values.append(value)
            batch.keys.append(key)
            batch.headers.append(headers)
            batch.futures.append(future)
            batch.size += size
            self._unsent += size
            if self._unsent >= self.batch_bytes:
                self._close_open()
        return future

    def flush(self) -> None:
        """Send every open batch now, and return once every record sent before this call
        is appended or failed (see the futures for which)."""
        self._check_not_sender("flush")
        self._check_process()
        with self._cond:
            self._close_open()
            target = self._closed_count
            while self._done_count < target:
                self._cond.wait()

    def close(self) -> None:
        """Flush, then stop the sender thread. Later sends raise ShmqError; closing
        again does nothing. In a forked child it only forgets the parent's producer."""
        self._check_not_sender("close")
        if os.getpid() != self._pid:
            _open_producers.discard(self)
            return
        with self._cond:
            self._closing = True
            self._close_open()
            self._cond.notify_all()
        self._thread.join()
        _open_producers.discard(self)

    def _check_usable(self):
        if self._closing:
            raise ShmqError(f"producer of stream {self.stream.name!r} is closed")

    def _check_process(self):
        """A forked child has no sender thread, and the lock may have been held at the fork."""
        if os.getpid() != self._pid:
            raise ShmqError(f"producer of stream {self.stream.name!r} belongs to process {self._pid}: "
                            "make one in this process")

    def _check_not_sender(self, what):
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"Producer.{what}() from a future's callback would wait for itself")

    def _close_open(self):
        """Move every open batch to the sender's queue. Lock held."""
        if self._open:
            self._ready.extend(self._open.values())
            self._closed_count += len(self._open)
            self._open.clear()
            self._cond.notify_all()

    # ------------------------------------------------------------------ the sender thread
    def _run(self):
        while (batch := self._next_batch()) is not None:
            self._append(batch)
            with self._cond:
                self._done_count += 1
                self._cond.notify_all()

    def _next_batch(self):
        """The next closed batch (closing those whose linger is over), or None once
        the producer is closed and everything is sent."""
        with self._cond:
            while True:
                if self._ready:
                    batch = self._ready.popleft()
                    self._unsent -= batch.size
                    self._cond.notify_all()  # senders waiting for room
                    return batch
                if self._open:
                    now = _mono()
                    due = [b for b in self._open.values() if b.due <= now]
                    if not due:
                        self._cond.wait(min(b.due for b in self._open.values()) - now)
                        continue
                    for b in due:
                        del self._open[b.partition]
                    self._ready.extend(due)
                    self._closed_count += len(due)
                elif self._closing:
                    return None
                else:
                    self._cond.wait()

    def _append(self, batch):
        live = [i for i, f in enumerate(batch.futures) if f.set_running_or_notify_cancel()]  # not cancelled
        if not live:
            return
        values = [batch.values[i] for i in live]
        keys = [batch.keys[i] for i in live]
        headers = [batch.headers[i] for i in live]
        try:
            metas = self.stream.append_many(values, keys=None if keys.count(None) == len(keys) else keys,
                                            headers=None if headers.count(None) == len(headers) else headers,
                                            partition=batch.partition, compression=self.compression)
        except Exception as e:
            for i in live:
                batch.futures[i].set_exception(e)
        else:
            for i, meta in zip(live, metas):
                batch.futures[i].set_result(meta)




@atexit.register
def _close_open_producers():
    for producer in list(_open_producers):
        producer.close()
