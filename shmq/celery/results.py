"""Celery's results in shmq's keyed store: ``Celery(..., backend="shmq://")``.

    Celery("proj", broker="shmq://", backend="shmq://")        # local attach ($SHMQ_NAMESPACE)
    Celery("proj", broker="shmq:///jobs", backend="shmq:///jobs")
    Celery("proj", broker=url, backend="shmq://:TOKEN@host:7878")  # a shmq server (shmqs://: TLS)

Strategy: a key-value backend, as Celery's Redis backend is one, on the store
``celery`` of the namespace (``engine/store.py``; over TCP the server's): a task's meta
under ``celery-task-meta-ID`` with ``result_expires`` as its TTL, so any process reads
any task's result; groups saved the same way; chords counted in the store. A chord
part counts by its task id (a set in the store, not a bare counter), so a part that
runs twice — its worker SIGKILLed after it counted, the task delivered again — counts
once and the chord fires when the last distinct part ends: a part lost to a kill is
never missing from the count, and a repeat never fires it early. (A kill between the
callback's send and the part's ack may send the callback twice: at least once, as
every acks_late task.) ``AsyncResult.get()`` waits on the store's waiting read, so a
result wakes its waiter as it is written, with no polling interval.
"""

from __future__ import annotations

import os
import threading
import time

from celery import states
from celery.backends.base import KeyValueStoreBackend
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.utils.encoding import bytes_to_str

__all__ = ["ShmqBackend", "STORE"]

STORE = "celery"  # the store's name in the namespace
_SETTLE_S = 0.1  # the longest nap while a task's meta exists but is not ready (STARTED, RETRY)


def _open(url: str | None, ssl=None):
    """The shmq broker of ``url``, read as the kombu transport reads a broker url."""
    from kombu import Connection

    from ..kombu import open_endpoint  # (and shmq:// registered with kombu)

    return open_endpoint(Connection(url or "shmq://", ssl=ssl).transport.endpoint)


class ShmqBackend(KeyValueStoreBackend):
    """Celery's result backend on shmq (see the module's Strategy). The url is the
    broker's form (``shmq://``, ``shmq:///NS``, ``shmq://:TOKEN@HOST:PORT``, ``shmqs://``);
    ``result_backend_transport_options={"store": NAME}`` picks another store."""

    key_t = staticmethod(bytes_to_str)
    implements_incr = True
    supports_native_join = True
    supports_autoexpire = True
    persistent = False  # memory-only: results live in /dev/shm, not on disk

    def __init__(self, url=None, app=None, **kwargs):
        super().__init__(app=app, url=url, **kwargs)
        self.url = url
        options = self.app.conf.get("result_backend_transport_options") or {}
        self.store_name = options.get("store", STORE)
        self._ssl = self.app.conf.get("broker_use_ssl") if url and url.startswith("shmqs") else None
        self.expires = self.prepare_expires(kwargs.get("expires"), type=int)
        self._lock = threading.Lock()
        self._pid = self._broker = self._store = None
        self._part = threading.local()  # the chord part being counted (``on_chord_part_return``)

    def __reduce__(self, args=(), kwargs=None):
        return super().__reduce__(args, dict(kwargs or {}, url=self.url, expires=self.expires))

    @property
    def store(self):
        """The store handle of this process (a child of fork opens its own)."""
        with self._lock:
            if self._pid != os.getpid():
                self._broker = _open(self.url, self._ssl)
                self._store, self._pid = self._broker.store(self.store_name), os.getpid()
            return self._store

    def close(self):
        with self._lock:
            if self._pid == os.getpid() and self._broker is not None:
                self._store.close()
                self._broker.close()
            self._pid = self._broker = self._store = None

    def as_uri(self, include_password=False):
        url = self.url or "shmq://"
        if include_password or "@" not in url:
            return url
        scheme, _, rest = url.partition("://")
        return f"{scheme}://:**@{rest.partition('@')[2]}"

    # -- KeyValueStoreBackend's primitives --

    def get(self, key):
        return self.store.get(bytes_to_str(key))

    def mget(self, keys):
        return self.store.get_many([bytes_to_str(k) for k in keys])

    def set(self, key, value):
        self.store.set(bytes_to_str(key), value if isinstance(value, bytes) else str(value).encode(),
                       ttl=self.expires or None)

    def delete(self, key):
        self.store.delete(bytes_to_str(key))

    def incr(self, key):
        part = getattr(self._part, "id", None)
        if part is not None:  # a chord part: counted once by its task id
            return self.store.add(bytes_to_str(key), part, ttl=self.chord_expires or None)
        return self.store.incr(bytes_to_str(key))

    def expire(self, key, value):
        if value:  # (0: no expiry asked; the key keeps what it has)
            self.store.expire(bytes_to_str(key), value)

    def set_chord_size(self, group_id, chord_size):
        """The number of parts chord ``group_id`` waits for, counted by Celery through
        nested groups and chains (a part's own ``chord_size`` counts the header's top level
        only). Celery calls it as it sends the header's last task: parts sent before may have
        counted already, so their count stays."""
        self.store.set(bytes_to_str(self.get_key_for_group(group_id, ".s")), str(chord_size).encode(),
                       ttl=self.chord_expires or None)

    def on_chord_part_return(self, request, state, result, **kwargs):
        if request.group and request.chord:
            size = self.store.get(bytes_to_str(self.get_key_for_group(request.group, ".s")))
            if size is not None:  # the size Celery counted at the chord's apply (``set_chord_size``)
                request.chord = dict(request.chord, chord_size=int(size))
        self._part.id = request.id
        try:
            return super().on_chord_part_return(request, state, result, **kwargs)
        finally:
            self._part.id = None

    # -- waiting for results --

    def wait_for(self, task_id, timeout=None, interval=0.5, no_ack=True, on_interval=None):
        """The task's meta once it is ready: the store's waiting read wakes as it is
        written; while it is there but not ready (STARTED, RETRY), naps up to 0.1 s.
        ``on_interval`` runs after every read (``AsyncResult.get`` re-raises a failed
        parent's error there)."""
        self._ensure_not_eager()
        key = bytes_to_str(self.get_key_for_task(task_id))
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = 0.001
        while True:
            left = interval if deadline is None else min(interval, deadline - time.monotonic())
            raw = self.store.get(key, timeout=max(left, 0))
            if on_interval:  # (after the read, ready or not, as Celery's async backends: a
                on_interval()  # parent that failed first raises its own error, not the ChordError)
            if raw is not None:
                meta = self.decode_result(raw)
                if meta["status"] in states.READY_STATES:
                    self._cache[task_id] = meta
                    return meta
            if deadline is not None and time.monotonic() >= deadline:
                raise CeleryTimeout("The operation timed out.")
            if raw is not None:  # there, not ready: the waiting read would not wait
                time.sleep(min(nap, max(deadline - time.monotonic(), 0) if deadline else nap))
                nap = min(nap * 2, _SETTLE_S)

    def get_many(self, task_ids, timeout=None, interval=0.5, no_ack=True, on_message=None, on_interval=None,
                 max_iterations=None, READY_STATES=states.READY_STATES):
        """Celery's, but between two reads a waiting read of a result still missing
        (so a group's results are taken as they come, not once per interval)."""
        ids = set(task_ids)
        for task_id in list(ids):
            cached = self._cache.get(task_id)
            if cached is not None and cached["status"] in READY_STATES:
                ids.discard(task_id)
                yield bytes_to_str(task_id), cached
        deadline = None if timeout is None else time.monotonic() + timeout
        iterations = 0
        while ids:
            keys = list(ids)
            got = self._mget_to_results(self.mget([self.get_key_for_task(k) for k in keys]), keys, READY_STATES)
            self._cache.update(got)
            for task_id, meta in got.items():
                ids.discard(task_id)
                if on_message is not None:
                    on_message(meta)
                yield task_id, meta
            if not ids:
                return
            left = interval if deadline is None else min(interval, deadline - time.monotonic())
            if left <= 0:
                raise CeleryTimeout(f"Operation timed out ({timeout})")
            if on_interval:
                on_interval()
            iterations += 1
            if max_iterations and iterations >= max_iterations:
                return
            raw = self.store.get(bytes_to_str(self.get_key_for_task(next(iter(ids)))), timeout=left)
            if raw is not None and self.decode_result(raw)["status"] not in READY_STATES:
                time.sleep(min(_SETTLE_S, left))  # there, not ready: the read did not wait
