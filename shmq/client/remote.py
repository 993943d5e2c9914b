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
from .core import BrokerCalls, DeliveryCalls, Pause, Post, QueueCalls, Receive, Run, parse_url
from .streams import ConsumerCalls, StreamCalls
from .subscription import SubscriptionCalls

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery", "RemoteSubscription", "RemoteStream", "RemoteConsumer",
           "parse_url"]

_RECEIVE_SLICE_S = 0.2  # a consume iteration waiting for pushes lets other threads in this often


class RemoteDelivery(DeliveryCalls):
    """A message leased to this connection; settle it like a local ``Delivery``."""

    __slots__ = ()

    def ack(self, wait: bool = True):
        if not wait and not self._settled:
            sub = self._sub and self._sub()
            if sub is not None and sub._keep_ack(self._tag):  # kept for its batch: nothing to send now
                self._settled = True
                return None
        return DeliveryCalls.ack(self, wait)

    ack.__doc__ = DeliveryCalls.ack.__doc__


class RemoteSubscription(SubscriptionCalls):
    """``for d in q.consume(prefetch=N)``: deliveries pushed by the server; ``close`` (or
    leaving its ``with``, or dropping it) cancels it."""

    def __iter__(self):
        return self

    def __next__(self):
        d = self._ready()  # buffered: no call to run
        if d is not None:
            return d
        d = self._q._drive(self._next())
        if d is None:
            raise StopIteration
        return d

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Cancel: no more pushes; what was pushed and not handed out is ready again."""
        broker = self._q._broker
        self._close(broker.post)

    def __del__(self):
        if not self.closed:
            try:  # never wait for the lock here: the collector may run inside a request
                self._close(lambda t, p: self._q._broker.post(t, p, blocking=False))
            except Exception:
                pass  # a closed connection released everything already


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
    _subscription_class = RemoteSubscription

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
    def _request(self, msg_type, payload=None, timeout=None) -> dict:
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

    def post(self, msg_type, payload=None, blocking=True) -> None:
        """Send one request without waiting for its reply (``ClientCore.post``); without
        ``blocking``, nothing is sent if another call holds the connection."""
        core = self._core
        if not self._lock.acquire(blocking):
            return
        try:
            data = core.post(msg_type, payload)  # raises once the connection has ended
            try:
                self._sock.settimeout(None)
                self._sock.sendall(data)
            except OSError as e:
                core.connection_lost(e)
            if core.failed:
                self.close()
        finally:
            self._lock.release()
        if core.failed:
            raise core.ended_error()

    def receive(self, sid) -> None:
        """Read until something is pushed for subscription ``sid``; in slices, so other
        threads' calls get the connection in between."""
        core = self._core
        while not core.pushes(sid):
            with self._lock:
                if core.pushes(sid):
                    break
                if not core.failed:
                    try:
                        self._sock.settimeout(_RECEIVE_SLICE_S)
                        core.receive_data(self._sock.recv(65536))
                    except TimeoutError:
                        pass
                    except OSError as e:
                        core.connection_lost(e)
                    if core.failed:
                        self.close()
            if core.failed and not core.pushes(sid):
                raise core.ended_error()

    def _drive(self, call):
        """Run one call of the core: send its requests, sleep its pauses, return its result."""
        run = Run(call)
        for step in run:
            try:
                if isinstance(step, Pause):
                    run.send(self._sleep(step.seconds))
                elif isinstance(step, Post):
                    run.send(self.post(step.msg_type, step.payload))
                elif isinstance(step, Receive):
                    run.send(self.receive(step.sid))
                else:
                    run.send(self._request(step.msg_type, step.payload))
            except Exception as e:
                run.throw(e)
        return run.result

