"""Dramatiq's results in shmq: ``broker.add_middleware(Results(backend=ShmqResultBackend()))``.

Strategy: results travel as messages, as Celery's ``rpc://`` results do. A process that
sends a message whose result is stored (or a pipeline) has a reply queue of its own,
made at its first such send; ShmqBroker names it in the message (the option
``shmq_reply_to``, also in a pipeline's next messages), and the worker that finishes the
message puts the result there with the message's result key in a header and the result
TTL as the message's ``ttl``, so an unclaimed result expires in the queue.
``get_result`` moves what its reply queue holds into a dict of this process, kept until
each result's TTL ends (asking twice gives the same result), and waits on the queue
itself: a waiting caller wakes as the result is put, with no polling. One thread at a
time takes from the queue; the others wait for what it takes.

So a result can be had in the process that sent the message (any of its threads), not
in another one (Celery's rpc backend has the same limit). A local reply queue is named
after its owner as request/reply's are (``_rpc.PID.START.N``): one a dead process left
is removed by the next reply queue made in the namespace, by ``broker.request`` and by
the server's housekeeper. Over TCP it is ``_dramatiq.UUID``, deleted at ``close()`` or
at exit; one left by a killed process stays until deleted (``shmq delete``).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
import weakref

from dramatiq.results import ResultBackend, ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing

from ..engine.queues.rpc import remove_orphans, reply_queue_name
from ..errors import QueueEmpty, QueueFull, QueueNotFound, ShmqError
from .broker import open_broker

__all__ = ["ShmqResultBackend"]

log = logging.getLogger(__name__)

_KEY, _EXPIRES = "dramatiq-result-key", "dramatiq-result-expires"
_PRUNE_EVERY = 1.0  # seconds between sweeps of the expired results a process holds
_HANDLES = 64  # reply queues a worker keeps open


class ShmqResultBackend(ResultBackend):
    """Results in reply queues (see the module's Strategy). ``url`` / ``namespace`` /
    ``token`` / ``connect_options`` as ShmqBroker's (the same defaults: use the same as
    the broker's); ``max_bytes``: the size of each reply queue."""

    REPLY_TO = "shmq_reply_to"

    def __init__(self, url: str | None = None, *, namespace: str | None = None, token: str | None = None,
                 connect_options: dict | None = None, max_bytes: int = 4 * 2**20, encoder=None,
                 results_namespace: str = "dramatiq-results"):
        super().__init__(namespace=results_namespace, encoder=encoder)
        self.url, self.shmq_namespace, self.token = url, namespace, token
        self.connect_options = dict(connect_options or {})
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._client = None
        self._pid = None
        self._replies = None  # this process's reply queue handle
        self._got: dict[str, tuple[float, bytes]] = {}  # key -> (expires, wall clock; the encoded result)
        self._next_prune = 0.0
        self._draining = False
        self._handles: dict = {}  # reply queue name -> handle (a worker's puts)
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- both sides --

    def _shmq(self):
        """The shmq handle of this process (a fork child starts afresh: its own reply queue)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._replies, self._got, self._handles = os.getpid(), None, {}, {}
                self._draining = False
            if self._client is None:
                self._client = open_broker(self.url, self.shmq_namespace, self.token, self.connect_options)
            return self._client

    def close(self) -> None:
        """Delete this process's reply queue (results still to come are dropped)."""
        with self._lock:
            client, replies = self._client, self._replies
            if self._pid == os.getpid() and replies is not None:
                self._replies = None
                replies.close()
                try:
                    client.delete_queue(replies.name)
                except ShmqError as e:
                    log.debug("deleting reply queue %r: %s", replies.name, e)
            for q in self._handles.values():
                q.close()
            self._handles.clear()
            if client is not None:
                self._client = None
                client.close()

    # -- the sender's side --

    def reply_to(self) -> str:
        """This process's reply queue, made on first use."""
        with self._lock:
            client = self._shmq()
            if self._replies is None:
                if self.url is None:
                    remove_orphans(client)
                    name = reply_queue_name()
                else:
                    name = f"_dramatiq.{uuid.uuid4().hex}"
                client.create_queue(name, max_bytes=self.max_bytes, durability="memory")
                self._replies = client.queue(name)
            return self._replies.name

    def tagged(self, options: dict) -> dict:
        """``options`` naming this process's reply queue, and so the pipeline's next messages."""
        out = {**options, self.REPLY_TO: options.get(self.REPLY_TO) or self.reply_to()}
        nxt = out.get("pipe_target")
        if isinstance(nxt, dict):
            out["pipe_target"] = {**nxt, "options": self.tagged(nxt.get("options") or {})}
        return out

    def get_result(self, message, *, block: bool = False, timeout: int | None = None):
        """The result of ``message`` (sent by this process). ResultMissing when it has not
        come (``block=False``); ResultTimeout after ``timeout`` ms (default 10 s)."""
        key = self.build_message_key(message)
        deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
        while True:
            with self._cond:
                self._shmq()
                data = self._held(key)
                if data is not Missing:
                    return self.unwrap_result(self.encoder.decode(data))
                left = deadline - time.monotonic()
                if self._draining:
                    if not block:
                        raise ResultMissing(message)
                    if left <= 0:
                        raise ResultTimeout(message)
                    self._cond.wait(left)
                    continue
                if self._replies is None or (block and left <= 0):
                    raise (ResultTimeout if block else ResultMissing)(message)
                self._draining = True
                replies = self._replies
            try:
                self._take(replies, left if block else 0)
            finally:
                with self._cond:
                    self._draining = False
                    self._cond.notify_all()
            if not block:
                with self._cond:
                    data = self._held(key)
                if data is Missing:
                    raise ResultMissing(message)
                return self.unwrap_result(self.encoder.decode(data))

    def _take(self, replies, timeout: float) -> None:
        """Move results from the reply queue into the dict: one waited for up to
        ``timeout`` s (0: all there are, without waiting)."""
        while True:
            try:
                d = replies.get_nowait(ack=False) if timeout == 0 else replies.get(timeout=timeout, ack=False)
            except QueueEmpty:
                return
            h = d.headers
            with self._cond:
                self._got[h[_KEY]] = (h[_EXPIRES], d.body)
                self._cond.notify_all()
            if timeout:
                return

    def _held(self, key: str):
        now = time.time()
        if now >= self._next_prune:
            self._next_prune = now + _PRUNE_EVERY
            for k in [k for k, (until, _) in self._got.items() if until <= now]:
                del self._got[k]
        got = self._got.get(key)
        return Missing if got is None or got[0] <= now else got[1]

    # -- the worker's side --

    def _store(self, message, result, ttl: int) -> None:
        name = message.options.get(self.REPLY_TO)
        if not name:
            log.warning("message %s names no reply queue (sent through a broker other than ShmqBroker?): "
                        "its result is dropped", message.message_id)
            return
        seconds = ttl / 1000
        headers = {_KEY: self.build_message_key(message), _EXPIRES: time.time() + seconds}
        try:
            self._handle(name).put(self.encoder.encode(result), headers, timeout=0, ttl=seconds)
        except QueueNotFound:
            self._handles.pop(name, None)
            log.debug("reply queue %r is gone (its sender stopped): result of %s dropped", name, message.message_id)
        except QueueFull:
            log.error("reply queue %r is full (results not taken): result of %s dropped", name, message.message_id)

    def _handle(self, name: str):
        with self._lock:
            client = self._shmq()
            q = self._handles.get(name)
            if q is None:
                if len(self._handles) >= _HANDLES:
                    self._handles.pop(next(iter(self._handles))).close()
                q = self._handles[name] = client.queue(name)
            return q

    def store_result(self, message, result, ttl: int) -> None:
        from dramatiq.results.result import wrap_result

        self._store(message, wrap_result(result), ttl)

    def store_exception(self, message, exception: Exception, ttl: int) -> None:
        from dramatiq.results.result import wrap_exception

        self._store(message, wrap_exception(exception), ttl)


def _close_at_exit(ref) -> None:
    backend = ref()
    if backend is not None:
        try:
            backend.close()
        except ShmqError as e:
            log.debug("closing %r at exit: %s", backend, e)
