"""The blocking TCP client: ``shmq.connect("tcp://host:port")``.

Strategy: the calls and the connection's state are the sans-IO core's
(``shmq.client.core``); this module moves their bytes over one socket per broker, which
the threads using the broker share. A call runs in its caller's thread (``_drive``). A
request is written under a lock; then whichever waiting thread finds nobody reading
reads for all, the others wait on a condition, and the core matches replies to requests
by msg id: a long get in one thread holds back no other thread's calls. A call runs on
one connection from start to end, so nothing is ever sent twice; a call that finds the
connection lost (before it sends: a server that closed it while it was idle is noticed
then) connects again first, with the retries and backoff of ``options.ConnectOptions``.
Socket errors and timeouts become BrokerUnavailable naming the endpoint (OutcomeUnknown
for a request sent and left unanswered). Handles pickle as their url and name, and
connect again where they land. A child of fork() never touches its parent's connection
(``forks``): ``_forked`` closes the child's copy of the socket without a shutdown and
leaves the handle to connect on its first call there. A plain get, put and
ack(wait=False) — the calls of every message — take a fast path (``_get_plain``,
``_put_plain``, ``_post_shaped``): their frames made from the queue's shapes
(``protocol.shapes``), sent and answered without the call machinery, with the same
bytes, checks and errors; anything else, or a connection to make again, takes the
general one.
"""

import contextlib
import dataclasses
import select
import socket
import ssl
import threading
import time
import weakref

from ..busypoll import Window, spin_until_readable
from ..model import faces
from ..errors import BrokerUnavailable
from ..tls import describe, note_refused
from ..protocol import MsgType
from ..protocol.payloads import message_fields
from . import forks
from .connection import Outbox
from .heartbeat import DEAD, PING, Beat
from .core import BrokerCalls, DeliveryCalls, Post, QueueCalls, came_back, parse_url
from .plain import PlainQueueCalls
from .options import ConnectOptions, tls_context
from .multiconsumer import MultiConsumerCalls
from .streams import ConsumerCalls, StreamCalls
from .stores import StoreCalls
from .transactions import TransactionalCalls
from .subscription import SubscriptionCalls
from .transport_sync import SyncTransport, _one, _polled, _resuming

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery", "RemoteSubscription", "RemoteStream", "RemoteConsumer",
           "RemoteMultiConsumer", "RemoteStore", "parse_url"]

_READ_BYTES = 65536
_NO_OPTIONS = {}  # a plain put's options (never changed)
LINGER_S = 0.001  # the longest a request sent without waiting stays unwritten
# a fast path peeks for a close that came while the connection was idle (``_read_idle``)
# only when its last read is older than this: within it, the connection is not idle
HEARD_S = 0.001


class RemoteDelivery(DeliveryCalls):
    """A message leased to this connection; settle it like a local ``Delivery``."""

    __slots__ = ()

    def ack(self, wait: bool = True):
        if not wait and not self._settled:
            sub = self._sub and self._sub()
            if sub is not None:
                if sub._keep_ack(self._tag):  # kept for its batch: nothing to send now
                    self._settled = True
                    return None
            else:
                q = self._q
                link = q._broker._link
                if link is not None and self._conn is link.core and not self._conn.failed and not q.closed:
                    self._settled = True  # the plain case: the ack encoded from the queue's shape
                    q._broker._post_shaped(link, q._ack_shape, self._tag)
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
        d = _resuming(self, lambda: self._q._drive(self._next()))
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
            try:  # never wait for a lock here: the collector may run inside a request
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


class RemoteQueue(_Handle, PlainQueueCalls):
    """A queue reached over TCP: the methods and errors of the local ``Queue``."""

    _delivery_class = RemoteDelivery
    _subscription_class = RemoteSubscription
    close = QueueCalls.close

    def __repr__(self):
        return f"<shmq.RemoteQueue {self._broker.url}/{self.name}>"

    def put(self, body, headers=None, timeout=None, *, priority=0, delay=0.0, ttl=None, group=None, dedup_id=None,
            wait=True):
        options = self._options_given(priority, delay, ttl, group, dedup_id)
        if wait:
            if self._plain_put(body, headers, timeout, options):
                return self._broker._put_plain(self, body)
        elif not (self.closed or self.serializer is not None or options):
            self._broker._posted(self.name, body, headers)  # a plain put sent without waiting
            return None
        return QueueCalls.put(self, body, headers, timeout, priority=priority, delay=delay, ttl=ttl, group=group,
                              dedup_id=dedup_id, wait=wait)

    put.__doc__ = QueueCalls.put.__doc__

    def ack_many(self, deliveries, wait: bool = True):
        link = self._broker._ready_link()
        if link is not None:
            tags = self._plain_tags(deliveries, link.core)
            if tags is not None:
                return self._broker._ack_many_plain(link, self, deliveries, tags, wait)
        return QueueCalls.ack_many(self, deliveries, wait)

    ack_many.__doc__ = QueueCalls.ack_many.__doc__

    def __reduce__(self):
        return (self._reattach, (self._broker.url, self._broker.token, self.name, self.serializer))

    @staticmethod
    def _reattach(url, token, name, serializer=None):
        return RemoteQueue(RemoteBroker(url, token), name, serializer)


class _Member:
    """What a remote group member adds to its calls: ``with`` (leaves on exit) and
    iteration, which comes back by itself after a reconnect (``_resuming``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        return self

    def __next__(self):
        """The next record, polling (and waiting) as needed; StopIteration once closed."""
        if self._closed:
            raise StopIteration
        return _resuming(self, lambda: self._drive(self._next_record()))

    def poll(self, max_records: int = 500, timeout: float = 1.0):
        """Records from the partitions this member owns and has not paused, from where it
        is on; waits up to ``timeout`` seconds for some, returns [] if none came. Calls
        on_revoke / on_assign first when the assignment moved, and commits when
        auto-commit is due. While its connection is lost it reconnects within ``timeout``
        (and returns [] if the server is not back by then), joining again when it is;
        BrokerUnavailable once the outage has lasted ``max_outage`` (``shmq.connect``)."""
        if not self._outlasts():  # (the connection is up)
            try:
                return super().poll(max_records, timeout)
            except BrokerUnavailable:
                if not self._outlasts():
                    raise
        return _polled(self, super().poll, max_records, timeout)


class RemoteConsumer(_Member, ConsumerCalls):
    """A member of a consumer group, held for this connection by the server: the methods
    and errors of the local ``Consumer``; leaves on ``close`` or when the connection ends."""


class RemoteMultiConsumer(_Member, MultiConsumerCalls):
    """A member of a consumer group on several streams (``broker.consumer``): the methods
    and errors of the local ``MultiConsumer``; leaves on ``close`` or when the connection ends."""


class RemoteStream(_Handle, StreamCalls):
    """A stream reached over TCP: the methods and errors of the local ``Stream``."""

    _consumer_class = RemoteConsumer

    @staticmethod
    def _reattach(url, token, name):
        return RemoteBroker(url, token).stream(name)

    def producer(self, linger_ms: float = 5, batch_bytes: int = 64 * 2**10, compression=None):
        """A batching producer of this stream (``shmq.producer.Producer``, appending from
        its thread over this connection); close it."""
        return faces.producer(self, linger_ms=linger_ms, batch_bytes=batch_bytes, compression=compression)



class RemoteTransactional(TransactionalCalls):
    """A transactional producer over TCP (``broker.transactional``); ``with p.transaction():``
    commits at the end of the block, or aborts if it raises."""

    @contextlib.contextmanager
    def transaction(self):
        self.begin()
        try:
            yield self
        except BaseException:
            self.abort()
            raise
        self.commit()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RemoteStore(_Handle, StoreCalls):
    """A keyed store reached over TCP: the methods and errors of the local ``Store``."""

    @staticmethod
    def _reattach(url, token, name):
        return RemoteBroker(url, token).store(name)


class _Link:
    """One connection: its socket and core, the lock its requests are written under, and
    the condition its callers wait on while one of them reads for all (``_wait``).

    Requests nobody waits for (``ack(wait=False)``, ``put(wait=False)``) are not written
    at once: they wait in ``pending`` for the next request that is waited for, which
    takes them along in its write (an ack and the next get: one write, one read at the
    server, one write back), or for ``LINGER_S`` (the ``flusher`` thread), or until
    ``PENDING_BYTES`` of them gathered."""

    __slots__ = ("sock", "core", "writing", "mutex", "cond", "sleepers", "reading", "heard", "readable", "pending",
                 "flusher", "spin")

    def __init__(self, sock, core, busy_poll_us=0):
        self.sock = sock  # None: not connected in this process (a child of fork(), ``_forked``; ``never``)
        self.core = core
        self.writing = threading.Lock()  # held while ``pending`` changes or bytes are written
        # held while the core changes: ``with mutex`` where nothing waits or is woken (a C
        # call, where the Condition's ``with`` is two Python ones), ``cond`` otherwise
        self.mutex = threading.Lock()
        self.cond = threading.Condition(self.mutex)
        self.sleepers = 0  # threads in ``cond.wait`` (``_wait``): none, and a read wakes nobody
        self.reading = False  # a thread is in recv (outside the lock)
        self.heard = 0.0  # time.monotonic() of the last read that brought bytes (``_wait``)
        self.readable = select.poll()  # used under ``cond`` only
        if sock is not None:
            self.readable.register(sock, select.POLLIN)
        self.pending = Outbox()  # posted requests' bytes not written yet (under ``writing``)
        self.flusher = None  # the thread that writes what is pending after LINGER_S (started on need)
        self.spin = Window(busy_poll_us)  # how long a read looks for its bytes awake first (``_wait``)

    @property
    def never(self) -> bool:
        """Not connected in this process (a child of fork()'s first call connects)."""
        return self.sock is None

    def write(self, data) -> None:
        """Write what is pending, then ``data``, in one system call. ``writing`` held."""
        self.sock.sendall(self.pending.take(data))

    def flush(self) -> None:
        """Write the puts the core gathered and what is pending, if any."""
        with self.cond:
            data = self.core.batched()
        with self.writing:
            if not (data or self.pending) or self.core.failed or self.sock is None:
                return
            try:
                self.write(data)
            except OSError as e:  # the next call finds the connection lost
                with self.cond:
                    self.core.connection_lost(e)

    def hold(self, data) -> bool:
        """Keep posted ``data`` for the next write; True when enough is pending to write
        now. ``writing`` held."""
        if self.pending.hold(data):
            return True
        flusher = self.flusher
        if flusher is None:
            flusher = self.flusher = _Flusher(self)
        flusher.posted = True
        if flusher.idle:
            flusher.idle = False
            flusher.due.set()
        return False


class _Flusher:
    """Writes a link's pending posts at most ``LINGER_S`` after they were posted, unless a
    call's write took them along first; one daemon thread per link, started on its first post.

    Strategy: a post wakes the thread only while it is idle. Awake, it looks every
    ``LINGER_S``, writes what is pending, and goes idle after a look that found no post
    since the one before: a stream of posts (an ack after each get, taken along by the
    next get) costs the thread a look each ``LINGER_S``, not a wake-up each."""

    __slots__ = ("link", "due", "idle", "posted")

    def __init__(self, link):
        self.link = link
        self.due = threading.Event()
        self.idle = True  # waiting on ``due``: the next post sets it (else it looks every LINGER_S)
        self.posted = False  # a post since the thread's last look
        threading.Thread(target=self._run, name="shmq-flusher", daemon=True).start()

    def _run(self):
        link = self.link
        while not link.core.failed:
            if not self.due.wait(1.0):
                continue
            self.due.clear()
            self.posted = False
            while not link.core.failed:
                time.sleep(LINGER_S)
                if link.pending or link.core.gathering:
                    link.flush()  # (a post between the look and the flush waits for the next look)
                elif not self.posted:
                    break
                self.posted = False
            self.idle = True
            if link.pending or link.core.gathering:  # posted as it went idle
                self.idle = False
                self.due.set()


def _recv_now(link):
    """What came on ``link``, without waiting (BlockingIOError: nothing yet). ``cond`` held
    and nobody reading. A TLS socket takes no MSG_DONTWAIT: it is made non-blocking for the
    reads (one TLS record each, as many as came), while no thread writes (``writing``
    held: else they are left for the next read)."""
    sock = link.sock
    if not isinstance(sock, ssl.SSLSocket):
        return sock.recv(_READ_BYTES, socket.MSG_DONTWAIT)
    if not link.writing.acquire(False):
        raise BlockingIOError
    timeout, chunks, size = sock.gettimeout(), [], 0
    try:
        sock.settimeout(0)
        while size < _READ_BYTES:
            chunks.append(sock.recv(_READ_BYTES))
            if not chunks[-1]:
                break  # closed (after what came before, if anything: the next read says it again)
            size += len(chunks[-1])
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
        if not chunks:
            raise BlockingIOError from None
    finally:
        sock.settimeout(timeout)
        link.writing.release()
    return b"".join(chunks)


class _Heart:
    """A broker's heartbeat (``heartbeat.Beat``): a daemon thread that looks at its
    connection every ``options.heartbeat`` seconds, PINGs, and drops a dead one (the
    calls waiting on it raise, subscriptions and group members come back on the next).
    It holds the broker weakly: a handle dropped unclosed ends it."""

    def __init__(self, broker):
        self.broker = weakref.ref(broker)
        self.every = broker.options.heartbeat
        self.stop = threading.Event()
        threading.Thread(target=self._run, name="shmq-heartbeat", daemon=True).start()

    def _run(self):
        self.beat = None
        while not self.stop.wait(self.every):
            if not self._look(self.broker()):
                return

    def _look(self, broker) -> bool:
        """One look at ``broker``'s connection; False once the broker is gone or closed."""
        if broker is None or broker._closed:
            return False
        link = broker._link
        if link.sock is None or link.core.failed:
            return True
        if self.beat is None or self.beat.core is not link.core:
            self.beat = Beat(link.core)
            return True
        broker._read_idle(link)  # what came while no call read (a PING's reply, a HEARTBEAT)
        what = None if link.core.failed else self.beat.look()
        if what == PING:
            try:
                broker._post(link, MsgType.PING, {})
            except Exception:
                return True  # ended meanwhile: the next call reconnects
            self.beat.posted()
        elif what == DEAD:
            with link.cond:
                link.core.heart_stopped(self.every)
                broker._shut(link)
                link.cond.notify_all()
        return True


def _reopened(url, token, options):
    return RemoteBroker(url, token, **{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})


class RemoteBroker(SyncTransport, BrokerCalls):
    """A broker reached over TCP; the same methods as the local ``Broker``. ``options``
    are ``shmq.connect``'s: timeouts and reconnecting (``options.ConnectOptions``)."""

    _queue_class = RemoteQueue
    _stream_class = RemoteStream
    _store_class = RemoteStore
    _transactional_class = RemoteTransactional
    _multi_consumer_class = RemoteMultiConsumer
    _sleep = staticmethod(time.sleep)  # a call's pauses, and a reconnect's
    _link = None  # the connection (a ``_Link``; None until the first is made)

    def __init__(self, url: str, token: str | None = None, **options):
        super().__init__(url, token)
        self.options = ConnectOptions(**options)
        self.namespace = None
        self.server_info = None
        self._closed = False
        self._opening = threading.Lock()  # one thread reconnects, the others wait for its outcome
        self._rounds = 0  # reconnects given up, and the error of the last one
        self._gave_up = None
        self._link = self._connect(self._core)
        self._heart = None if self.options.heartbeat is None else _Heart(self)
        forks.track(self)

    def __repr__(self):
        return f"<shmq.RemoteBroker {self.url}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (_reopened, (self.url, self.token, self.options))

    def close(self) -> None:
        """Close the connection; the handle never reconnects after this."""
        self._closed = True
        forks.untrack(self)
        if self._heart is not None:
            self._heart.stop.set()
        link = self._link
        link.flush()  # what was sent without waiting goes before the close
        with link.cond:
            link.core.close()
            self._shut(link)
            link.cond.notify_all()

    def _forked(self, parent: int) -> None:
        """In a child of fork() (only this thread runs): the connection is process
        ``parent``'s. Its replies go to whoever reads first, so the child never reads
        or writes it, nor shuts it down (that would end it for the parent too): the
        child's copy of its descriptor is closed (else a parent that dies without
        closing it would leave the server holding its leases while the child lives),
        what was bound to it ends (``ClientCore.forked``), and the first call connects
        anew, with the same url, token and options. Locks another thread held at the
        fork would stay held for ever: the child takes fresh ones."""
        self._opening = threading.Lock()
        self._heart = None  # the parent's thread does not run here: the first connection starts one
        old = self._link
        old.core.forked(parent)
        if old.sock is not None:
            try:
                old.sock.close()  # the child's descriptor only: no shutdown
            except OSError:
                pass
        self._link = _Link(None, old.core)

    # ---------------------------------------------------------------- connecting
    def _connect(self, core) -> _Link:
        """A new connection with ``core`` for its state, HELLO said, both within the
        connect limit; BrokerUnavailable if the endpoint cannot be reached."""
        limit = self.options.connect_limit
        try:
            sock = socket.create_connection((self.host, self.port), timeout=limit)  # the HELLO's limit too
        except OSError as e:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {e.strerror or e}") from None
        sock = self._secured(sock)
        try:
            link = _Link(sock, core, self.options.busy_poll_us)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ends = sock.getsockname(), sock.getpeername()
        except OSError as e:
            sock.close()
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {e.strerror or e}") from None
        try:
            self.server_info = self._run(BrokerCalls._hello.__wrapped__(self, "shmq-python", *ends), link, limit)
            core.greeted(self.server_info)
        except BaseException as e:
            with link.cond:
                core.close()
                self._shut(link)
            note_refused(e, isinstance(sock, ssl.SSLSocket))
            raise
        sock.settimeout(self.options.timeout)
        return link

    def _secured(self, sock):
        """``sock`` in TLS, its handshake done within the connect limit, for a ``tcps://``
        url or ``ssl=`` (``options.tls_context``); else ``sock`` itself. BrokerUnavailable
        naming the endpoint and what failed (``certificate verify failed: ...``)."""
        try:
            ctx = tls_context(self.url, self.options)
            return sock if ctx is None else ctx.wrap_socket(sock, server_hostname=self.host)
        except OSError as e:
            sock.close()
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {describe(e, self.options.ssl)}") from None
        except BaseException:
            sock.close()
            raise

    def _close_lost(self, lost) -> None:
        """Shut ``lost`` before another connection is made (``transport``'s reconnects)."""
        with lost.cond:
            self._shut(lost)

    def _installed(self, link, lost) -> None:
        """``link`` is the connection from now on, instead of ``lost``. ``_opening`` held."""
        link.core.carry_over(lost.core)
        self._link, self._core = link, link.core
        if self._heart is None and self.options.heartbeat is not None:  # (a child of fork())
            self._heart = _Heart(self)
        came_back(self, lost.core)

    # ---------------------------------------------------------------- transport
    def _drive(self, call):
        """Run one call of the core on the connection, made again first if it was lost."""
        link = self._link
        if not link.core.failed and not link.reading:
            self._read_idle(link)
        if link.core.failed:
            link = self._reconnected(link)
        return self._run(call, link)

    def _post_step(self, link, step) -> None:
        """A call's Post step: ``post`` on ``link``."""
        return self._post(link, step.msg_type, step.payload)

    def _exchange(self, link, msg_type, payload=None, limit=None) -> dict:
        """Send one request on ``link`` and return its reply's payload (or raise its error)."""
        core = link.core
        with link.mutex:
            msg_id, data = core.send(msg_type, payload)  # raises once the connection has ended
        self._write(link, data, msg_id)
        if limit is None:
            limit = self.options.reply_limit(msg_type, payload)
        self._wait(link, core.answered, msg_id, limit, msg_type)
        with link.mutex:
            return core.result(msg_id, msg_type)

    def _exchange_shaped(self, link, shape, value, limit, raw=False) -> dict:
        """``_exchange`` of a request of ``shape`` (``protocol.shapes``) with ``value``
        (``raw``: its reply's payload as its bytes, ``ClientCore.send_shaped``)."""
        core = link.core
        with link.mutex:
            msg_id, data = core.send_shaped(shape, value, raw)  # raises once the connection has ended
        self._write(link, data, msg_id)
        self._wait(link, core.answered, msg_id, limit, shape.msg_type)
        with link.mutex:
            return core.result(msg_id, shape.msg_type)

    def _ready_link(self):
        """The connection a fast path runs on, as ``_drive`` finds it (what came while nobody
        read taken in, unless it was read within HEARD_S: not idle); None if it has ended:
        the call takes the general path, which connects again."""
        link = self._link
        if link is None:
            return None
        if not link.reading and not link.core.failed and time.monotonic() - link.heard > HEARD_S:
            self._read_idle(link)
        return None if link.core.failed else link

    def _ack_many_plain(self, link, q, deliveries, tags, wait):
        """``q.ack_many(deliveries, wait)`` of checked ``tags`` (``PlainQueueCalls._plain_tags``)
        on ``link``: an ACK encoded from the queue's shape; without ``wait``, held for the
        next write as a plain ``ack(wait=False)`` is."""
        shape = q._shapes()[1]
        if wait:
            return self._exchange_shaped(link, shape, tags, self.options.reply_limit(MsgType.ACK, None))["acked"]
        self._post_shaped(link, shape, tags)
        for d in deliveries:
            d._settled = True
        return None

    def _post_shaped(self, link, shape, value) -> None:
        """A request of ``shape`` with ``value`` sent without waiting (a plain
        ``ack(wait=False)``), held for the next write as ``_post`` holds it; nothing once
        the connection has ended (the server gave back what it settles)."""
        core = link.core
        with link.mutex:
            if core.failed:
                return
            data = core.post_shaped(shape, value)
        with link.writing:
            full = link.hold(data)
        if full:
            self._read_idle(link)  # (the replies to what was written before must not fill the buffers)
            self._write(link, b"")

    def _posted(self, queue, body, headers) -> None:
        """A plain ``put(wait=False)`` of ``body`` and ``headers`` to ``queue``, gathered
        by the core (a bytes body alone, to a server that says ``compact``; else its
        message's wire form). What ``_drive`` does first (the replies come meanwhile read,
        a lost connection made again) only when the core wrote something, so a run of them
        costs no system call each."""
        link = self._link
        core = link.core
        if core.compact and type(body) is bytes and headers is None:
            message = body
        else:
            message = message_fields(body, headers)
        if core.failed or link.sock is None or not core.gathers:
            if type(message) is bytes:
                message = {"body": message}
            return self._drive(_one(Post(MsgType.PRODUCE, {"queue": queue, **message})))
        with link.cond:
            data = core.gather(queue, message, _NO_OPTIONS)
        if data:
            self._read_idle(link)  # (the replies to what was written before must not fill the buffers)
        with link.writing:
            full = link.hold(data)
        if full:
            self._write(link, b"")
        return None

    def post(self, msg_type, payload=None, blocking=True) -> None:
        """Send one request without waiting for its reply (``ClientCore.post``)."""
        self._post(self._link, msg_type, payload, blocking)

    def _post(self, link, msg_type, payload=None, blocking=True) -> None:
        """``post`` on ``link``; without ``blocking`` (a finalizer, which may run inside a
        call of this thread that holds a lock), nothing is sent if a lock is held."""
        core = link.core
        if blocking:
            with link.cond:
                data = core.post(msg_type, payload)  # raises once the connection has ended
            with link.writing:
                full = link.hold(data)
            if full:
                self._write(link, b"")
            if core.failed:
                raise core.ended_error()
            return
        if not link.writing.acquire(False):
            return
        try:
            if not link.cond.acquire(False):
                return
            try:
                data = core.post(msg_type, payload)
            finally:
                link.cond.release()
            link.hold(data)  # written by the next call, or the flusher
        finally:
            link.writing.release()

    def _write(self, link, data, msg_id=None) -> None:
        """Send ``data`` (request ``msg_id``'s); a failed write ends the connection, and
        the request, not sent whole, was never read by the server (``not_sent``)."""
        try:
            with link.writing:
                link.write(data)
        except OSError as e:
            with link.cond:
                link.core.connection_lost(e)
                if msg_id is not None:
                    link.core.not_sent(msg_id)
                self._shut(link)
                link.cond.notify_all()

    def _receive(self, link, step) -> None:
        """Wait until something is pushed for subscription ``step.sid``."""
        core, sid = step.core, step.sid
        if core is link.core:
            self._wait(link, core.pushes, sid, None, None)
        if not core.pushes(sid):
            raise core.ended_error()

    def _wait(self, link, done, arg, seconds, msg_type) -> None:
        """Until ``done(arg)`` holds or the connection ends: read for all if no other thread
        reads, else wait for the one who does to wake this one. Past ``seconds`` (None:
        never) the connection is dropped (``ClientCore.timed_out``)."""
        core, cond = link.core, link.cond
        if link.pending.parts or core.gathering:  # what it waits for may need them (a subscription's acks)
            link.flush()
        until = None if seconds is None else time.monotonic() + seconds
        with link.mutex:
            while not done(arg) and not core.failed:
                left = None
                if until is not None:
                    left = until - time.monotonic()
                    if left <= 0:
                        core.timed_out(msg_type, seconds)
                        self._shut(link)
                        cond.notify_all()
                        return
                if link.reading:
                    link.sleepers += 1
                    try:
                        cond.wait(left)
                    finally:
                        link.sleepers -= 1
                    continue
                link.reading = True
                cond.release()
                try:
                    awake = spin_until_readable(link.readable, link.spin)  # looked for awake a while first
                    data = link.sock.recv(_READ_BYTES)  # its timeout: options.timeout, to look at the clock
                    if not awake:
                        link.spin.came()
                except TimeoutError:
                    data = None
                except OSError as e:
                    data = e
                finally:
                    cond.acquire()
                    link.reading = False
                    if link.sleepers:
                        cond.notify_all()
                if isinstance(data, OSError):
                    core.connection_lost(data)
                elif data is not None:
                    link.heard = time.monotonic()
                    core.receive_data(data)
                if core.failed:
                    self._shut(link)

    def _read_idle(self, link) -> None:
        """Before a call sends, read what came while nobody read (the replies to requests
        sent without waiting, which would otherwise fill the buffers until the server stops
        reading) and see whether the server closed the connection meanwhile (as redis-py
        checks a pooled connection): then the call connects again instead of failing.
        One poll: a system call, no read while nothing came."""
        core = link.core
        if not link.cond.acquire(False):
            return  # another thread is at it: it would find out as well
        try:
            if link.reading or core.failed or not link.readable.poll(0):
                return
            try:
                data = _recv_now(link)
            except BlockingIOError:
                return
            except OSError as e:
                core.connection_lost(e)
            else:
                core.receive_data(data)  # b"": closed by the server
                if not core.failed:
                    link.cond.notify_all()  # (a reply another thread waits for may be in it)
                    return
            self._shut(link)
            link.cond.notify_all()
        finally:
            link.cond.release()

    @staticmethod
    def _shut(link) -> None:
        """Wake a thread reading ``link``, and close its socket once none does (the
        caller holds ``link.cond``)."""
        if link.sock is None:
            return  # never connected in this process
        try:
            link.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if not link.reading:
            link.sock.close()
