"""Dramatiq's results in shmq's keyed store: ``broker.add_middleware(Results(backend=ShmqResultBackend()))``.

Strategy: each result is a key of the store ``dramatiq-results`` (``engine/store.py``;
over TCP the server's) named by Dramatiq's message key, with the actor's ``result_ttl``
as its TTL, as Dramatiq's Redis backend keeps them: any process reads any message's
result, asking twice gives the same result, and an unclaimed one expires. A blocking
``get_result`` is the store's waiting read (it wakes as the result is written), not
Dramatiq's polling with backoff.
"""

from __future__ import annotations

import os
import threading
import time

from dramatiq.results import ResultBackend, ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing

from .broker import open_broker

__all__ = ["ShmqResultBackend", "STORE"]

STORE = "dramatiq-results"  # the store's name in the namespace


class ShmqResultBackend(ResultBackend):
    """Results in the keyed store (see the module's Strategy). ``url`` / ``namespace`` /
    ``token`` / ``connect_options`` as ShmqBroker's (the same defaults: use the same as
    the broker's); ``store``: the store's name."""

    def __init__(self, url: str | None = None, *, namespace: str | None = None, token: str | None = None,
                 connect_options: dict | None = None, store: str = STORE, encoder=None,
                 results_namespace: str = "dramatiq-results"):
        super().__init__(namespace=results_namespace, encoder=encoder)
        self.url, self.shmq_namespace, self.token = url, namespace, token
        self.connect_options = dict(connect_options or {})
        self.store_name = store
        self._lock = threading.Lock()
        self._pid = self._client = self._kv = None

    def _shmq(self):
        """The store handle of this process (a child of fork opens its own)."""
        with self._lock:
            if self._pid != os.getpid():
                self._client = open_broker(self.url, self.shmq_namespace, self.token, self.connect_options)
                self._kv, self._pid = self._client.store(self.store_name), os.getpid()
            return self._kv

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid() and self._client is not None:
                self._kv.close()
                self._client.close()
            self._pid = self._client = self._kv = None

    def get_result(self, message, *, block: bool = False, timeout: int | None = None):
        """The result of ``message``, from any process. ResultMissing when it has not
        come (``block=False``); ResultTimeout after ``timeout`` ms (default 10 s)."""
        key = self.build_message_key(message)
        if not block:
            data = self._shmq().get(key)
            if data is None:
                raise ResultMissing(message)
        else:
            deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
            data = self._shmq().get(key, timeout=max(deadline - time.monotonic(), 0.0))
            if data is None:
                raise ResultTimeout(message)
        return self.unwrap_result(self.encoder.decode(data))

    def _get(self, message_key: str):
        data = self._shmq().get(message_key)
        return Missing if data is None else self.encoder.decode(data)

    def _store(self, message_key: str, result, ttl: int) -> None:
        self._shmq().set(message_key, self.encoder.encode(result), ttl=ttl / 1000)
