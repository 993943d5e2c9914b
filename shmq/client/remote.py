"""The blocking TCP client: ``shmq.connect("tcp://host:port")``.

Strategy: the calls and the connection's state are the sans-IO core's
(``shmq.client.core``); this module moves their bytes over one socket per broker. A call
runs in its caller's thread (``_drive``); each request holds a lock from its send to its
reply, so threads may share a broker. Socket errors become BrokerUnavailable naming the
endpoint. Handles pickle as their url and name, and connect again where they land.
"""

import socket
import threading
import time

from ..errors import BrokerUnavailable
from .core import BrokerCalls, DeliveryCalls, Pause, QueueCalls, Run, parse_url
from .streams import ConsumerCalls, StreamCalls

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery", "RemoteStream", "RemoteConsumer", "parse_url"]


class RemoteDelivery(DeliveryCalls):
    """A message leased to this connection; settle it like a local ``Delivery``."""

    __slots__ = ()


class _Handle:
    """What a queue or stream handle over TCP has besides its calls: nothing of its own to
    release (the connection is the broker's), and it pickles as its url and name."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (self._reattach, (self._broker.url, self._broker.token, self.name))

    def close(self) -> None:
        """Nothing to release: the connection belongs to the broker."""


class RemoteQueue(_Handle, QueueCalls):
    """A queue reached over TCP: the methods and errors of the local ``Queue``."""

    _delivery_class = RemoteDelivery

    def __repr__(self):
        return f"<shmq.RemoteQueue {self._broker.url}/{self.name}>"

    @staticmethod
    def _reattach(url, token, name):
        return RemoteQueue(RemoteBroker(url, token), name)


class RemoteConsumer(ConsumerCalls):
    """A member of a consumer group, held for this connection by the server: the methods
    and errors of the local ``Consumer``; leaves on ``close`` or when the connection ends."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RemoteStream(_Handle, StreamCalls):
    """A stream reached over TCP: the methods and errors of the local ``Stream``."""

    _consumer_class = RemoteConsumer

    @staticmethod
    def _reattach(url, token, name):
        return RemoteBroker(url, token).stream(name)

    def producer(self, linger_ms: float = 5, batch_bytes: int = 64 * 2**10, compression=None):
        """A batching producer of this stream (``shmq.producer.Producer``, appending from
        its thread over this connection); close it."""
        from ..producer import Producer
        return Producer(self, linger_ms=linger_ms, batch_bytes=batch_bytes, compression=compression)



class RemoteBroker(BrokerCalls):
    """A broker reached over TCP; the same methods as the local ``Broker``."""

    _queue_class = RemoteQueue
    _stream_class = RemoteStream
    _sleep = staticmethod(time.sleep)  # a call's pauses

    def __init__(self, url: str, token: str | None = None, connect_timeout: float = 10.0):
        super().__init__(url, token)
        self.namespace = None
        self._lock = threading.Lock()
        self._sock = None
        try:
            self._sock = socket.create_connection((self.host, self.port), timeout=connect_timeout)
        except OSError as e:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {e.strerror or e}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)
        try:
            self.server_info = self._hello("shmq-python", self._sock.getsockname(), self._sock.getpeername())
        except BaseException:
            self.close()
            raise

    def __repr__(self):
        return f"<shmq.RemoteBroker {self.url}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (RemoteBroker, (self.url, self.token))

    def close(self) -> None:
        self._core.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # ---------------------------------------------------------------- transport
    def request(self, msg_type, payload=None, timeout=None) -> dict:
        """Send one request and return its reply payload (or raise its error)."""
        core = self._core
        with self._lock:
            sock = self._sock  # None only once closed: then send raises
            msg_id, data = core.send(msg_type, payload)  # raises once the connection has ended
            try:
                sock.settimeout(timeout)
                sock.sendall(data)
                while not core.done(msg_id):
                    core.receive_data(sock.recv(65536))
            except OSError as e:
                core.connection_lost(e)
            if core.failed:
                self.close()
        return core.result(msg_id)

    def _drive(self, call):
        """Run one call of the core: send its requests, sleep its pauses, return its result."""
        run = Run(call)
        for step in run:
            try:
                if isinstance(step, Pause):
                    run.send(self._sleep(step.seconds))
                else:
                    run.send(self.request(step.msg_type, step.payload))
            except Exception as e:
                run.throw(e)
        return run.result

