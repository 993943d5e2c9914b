"""The TCP front of ``shmq server`` (``TcpServer``): listening, the registry of
connections and of cached queue and stream handles with their lines of waiting
requests (``AttachedHandles``), the sweeper of deadlines, and a stop that answers what is in
flight.

Strategy: one asyncio event loop, one protocol object per connection
(``connection.Connection``), no task per client; the loop only moves bytes and calls
handlers (``handlers.HANDLERS``), which call the engine's public, non-blocking API. The
modules beside this one hold the rest, by concern: ``limits`` (what clients may cost:
Limits, the buffer budget, deadlines, descriptors), ``waiters`` (the per-queue and per-stream lines
of waiting CONSUMEs, READs and POLLs), ``leases`` (the deliveries a connection holds),
``members`` (the consumer-group members it holds), ``handlers`` (one function per
request type), ``connection`` (bytes in, frames out), ``appenders`` (one thread per
stream with retention="block", for the appends that wait for room: the one wait the
engine cannot give up at once).

Connections are accepted here (``Acceptor``), not by the loop's ``create_server``: a
process out of descriptors (EMFILE) fails each ``accept``, which asyncio's loop then
retries up to its backlog at every turn with a traceback each (CPython gh-151615), and
libuv (uvloop) closes each waiting connection without a word -- or, once it cannot
reopen its spare descriptor, stops listening for good. Here one line is said per such
episode, a spare descriptor is let go to answer each waiting connection with
LIMIT_EXCEEDED, and nothing spins.
"""

import asyncio
import errno
import logging
import os
import socket

from ..busypoll import LoopSpin
from ..engine.broker import Broker
from ..errors import QueueNotFound, ShmqError, StreamNotFound
from ..protocol import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE, Status, encode_error
from .appenders import Appender
from .connection import READ_CHUNK, Connection
from .limits import MAX_LINGERING, PRE_AUTH_MAX_FRAME_BYTES, SMALL_FRAME_BYTES, Budget, Limits, open_fds, sweep
from .metrics import NO_METRICS
from .plain import plain_server
from .stores import StoreHandles
from .waiters import NOTHING, QueueWaiters, StreamWaiters

__all__ = ["TcpServer", "Acceptor", "listen_error", "tls_options", "Limits", "SMALL_FRAME_BYTES",
           "PRE_AUTH_MAX_FRAME_BYTES", "LOCK_TIMEOUT_S", "TLS_SHUTDOWN_S"]

log = logging.getLogger("shmq.server")

LOCK_TIMEOUT_S = 0.25  # the longest the loop waits for a queue's lock (then LOCK_TIMEOUT)
TLS_SHUTDOWN_S = 1.0  # a TLS connection being closed waits this long for the client's close_notify, then drops


class TcpServer:
    """Serves one namespace over TCP until ``stop``, within ``limits``."""

    port_setting = "--port"  # what chose the port, for a port in use (``listen_error``); a config file's key

    def __init__(self, broker: Broker, host="127.0.0.1", port=7878, token=None,
                 max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, on_create=None, limits: Limits | None = None,
                 metrics=None, tls=None):
        self.limits = limits if limits is not None else Limits()
        if self.limits.max_buffered_bytes < max_frame_bytes + HEADER_SIZE:
            raise ValueError(f"max_buffered_bytes ({self.limits.max_buffered_bytes}) must hold one whole frame: "
                             f"at least max_frame_bytes + {HEADER_SIZE} = {max_frame_bytes + HEADER_SIZE}")
        self.broker = broker
        self.on_create = on_create  # called with each queue this server creates
        self.metrics = metrics if metrics is not None else NO_METRICS  # requests counted (metrics.Metrics)
        self.host = host
        self.port = port
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.tls = tls  # an ssl.SSLContext (shmq.tls.server_context): every connection in TLS; None: plain TCP
        self.connections = set()
        self.lingering = 0  # refused connections not yet closed
        self.max_lingering = MAX_LINGERING  # of them, the most kept open while their error frame leaves
        self.fd_limit = None  # the connection limit its descriptors leave room for, when lower (``fit_descriptors``)
        self.fd_note = None  # and why, for the refused
        self.stopping = False
        self.budget = Budget(self.limits.max_buffered_bytes)
        self.rview = memoryview(bytearray(READ_CHUNK))  # every connection reads into it, in turn
        self.loop = None
        self.spin = LoopSpin(None, 0)  # the loop's busy poll after each read: none until ``bind``
        self.queues = AttachedHandles(self, self._attach_queue, QueueWaiters, QueueNotFound, "queue")
        self.streams = AttachedHandles(self, self._attach_stream, StreamWaiters, StreamNotFound, "stream")
        self.stores = StoreHandles(self)  # keyed stores, with their waiting GETs
        self.txns = None  # the transaction coordinator (``server/transactions``), which ``main.serve`` sets
        self.plain = None  # the plain requests in C (``plain.plain_server``): set by ``bind``
        self._appenders = {}  # stream name -> (handle, its Appender) (streams with retention="block")
        self._refused = 0  # connections refused since the cap was last reached
        self._server = None
        self._sweeper = None
        self._all_gone = None

    def queue(self, name):
        """A cached handle on queue ``name`` (re-attached after a delete + create)."""
        return self.queues.get(name)

    def forget(self, name):
        """Drop the handle on queue ``name``; whoever waits on it hears that it was deleted."""
        self.queues.forget(name)

    def notify(self, name):
        """Messages were just made ready by this loop: serve that queue's waiting CONSUMEs
        now (the doorbells are for other processes)."""
        self.queues.notify(name)

    def waiters_of(self, q):
        return self.queues.line_of(q)

    def stream(self, name):
        """A cached handle on stream ``name`` (re-attached after a delete + create)."""
        return self.streams.get(name)

    def appender(self, s):
        """The thread that makes the appends of stream handle ``s`` (retention="block")."""
        s_of, a = self._appenders.get(s.name, (None, None))
        if s_of is not s:  # new, or the stream was deleted and made again
            if a is not None:
                a.close()
            a = Appender(self.loop, s.name)
            self._appenders[s.name] = (s, a)
        return a

    # ------------------------------------------------------------------ connections
    @property
    def max_connections(self) -> int:
        """The connections it serves at once: --max-connections, or fewer where its
        descriptors leave room for fewer (``fit_descriptors``)."""
        cap = self.limits.max_connections
        return cap if self.fd_limit is None else min(cap, self.fd_limit)

    def fit_descriptors(self, fit) -> None:
        """Serve at most the connections ``fit`` (``limits.Fit``) leaves room for, and keep
        at most its lingering refused ones open (the rest of the reserve is the objects')."""
        self.max_lingering = fit.max_lingering
        if fit.lowered:
            self.fd_limit = fit.max_connections
            self.fd_note = (f"lowered from --max-connections {fit.connections} to fit its open-file limit of "
                            f"{fit.limit}: its operator raises LimitNOFILE= (ulimit -n)")
        else:
            self.fd_limit = self.fd_note = None

    def admit(self, conn) -> bool:
        if self.stopping or len(self.connections) >= self.max_connections:
            return False
        self.connections.add(conn)
        return True

    def refusal(self) -> str:
        """What a connection over the limit is told (LIMIT_EXCEEDED)."""
        if self.stopping:
            return "the server is stopping"
        why = f", {self.fd_note}" if self.fd_note and self.max_connections < self.limits.max_connections else ""
        return f"too many connections (the server's limit is {self.max_connections}{why})"

    def starved_reply(self) -> bytes | None:
        """What a connection accepted while the process is out of descriptors is sent
        before it is closed (``Acceptor``): LIMIT_EXCEEDED saying so; None over TLS."""
        if self.tls is not None:
            return None
        return encode_error(0, 0, Status.LIMIT_EXCEEDED,
                            "the server is out of file descriptors (its open-file limit: ulimit -n, LimitNOFILE=): "
                            "try again later")

    def note_refused(self):
        self._refused += 1
        if self._refused == 1:
            why = "--max-connections" if self.fd_limit is None else "lowered to fit its file descriptors"
            log.info("%d connections open, the limit (%s): refusing new ones", len(self.connections), why)

    def connection_gone(self, conn):
        self.connections.discard(conn)
        if self._refused and len(self.connections) < self.max_connections:
            log.info("accepting connections again; %d refused meanwhile", self._refused)
            self._refused = 0
        if not self.connections and self._all_gone is not None and not self._all_gone.done():
            self._all_gone.set_result(None)

    _sweep = sweep  # the connections past a deadline closed, every so often

    async def bind(self):
        """Listen on host:port, accepting no connection yet (``start``). ShmqError in one
        line when the address cannot be had (``port 7878 on 127.0.0.1 is in use``)."""
        self.loop = asyncio.get_running_loop()
        self.spin = LoopSpin(self.loop, self.limits.busy_poll_us, None, 2 * (os.cpu_count() or 1))  # (crowded: none)
        self.plain = plain_server(self)
        self._server = await listen(self, Connection)
        return self

    def unbind(self):
        """Stop listening, for a start that failed after ``bind``."""
        if self._server is not None:
            self._server.close()
            self._server = None

    async def start(self):
        """Accept connections (binding first if ``bind`` was not called)."""
        if self._server is None:
            await self.bind()
        await self._server.start_serving()
        self._sweeper = self.loop.create_task(self._sweep())
        return self

    async def stop(self):
        """Stop accepting, answer what is in flight (waiting CONSUMEs get what is
        there, possibly nothing), then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for handles in (self.queues, self.streams, self.stores):
            handles.answer_all()
        if self.connections:
            self._all_gone = self.loop.create_future()
            for conn in list(self.connections):
                conn.shut(linger=False)
            try:
                await asyncio.wait_for(asyncio.shield(self._all_gone), 5)
            except asyncio.TimeoutError:
                for conn in list(self.connections):
                    conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        for _s, a in self._appenders.values():
            a.close()
        self._appenders.clear()
        if self.plain is not None:
            self.plain.forget()
        for handles in (self.queues, self.streams):
            handles.forget_all()
        self.stores.close()

    def _attach_queue(self, name):
        q = self.broker.queue(name)
        q.lock_timeout = LOCK_TIMEOUT_S  # a stopped local lock holder stalls the loop this long at most
        return q

    def _attach_stream(self, name):
        s = self.broker.stream(name)
        s.lock_timeout = LOCK_TIMEOUT_S
        return s


def tls_options(tls, limits: Limits) -> dict:
    """``create_server``'s keywords for TLS with context ``tls`` (None: none): a handshake
    not done within the frame timeout closes the connection (a connection counts, and
    its clocks run, once it is done); a close waits ``TLS_SHUTDOWN_S`` for the client's
    close_notify (which a blocking client that is not reading never sends), not 30 s."""
    if tls is None:
        return {}
    return {"ssl": tls, "ssl_handshake_timeout": limits.frame_timeout, "ssl_shutdown_timeout": TLS_SHUTDOWN_S}


def listen_error(e: OSError, host: str, port: int, setting: str | None = None) -> ShmqError:
    """What to say when ``host:port`` cannot be listened on (the TCP front's, the Kafka
    port's, /metrics'); ``setting``: what chose the port (``--port``, a config file's key),
    named with the way out."""
    where = f"[{host}]" if ":" in str(host) else host
    by = f" ({setting})" if setting else ""
    if e.errno == errno.EADDRINUSE:
        return ShmqError(f"port {port} on {where} is in use{by}: choose another port, or stop what listens on it")
    return ShmqError(f"cannot listen on {where}:{port}{by}: {e.strerror or e}")


async def listen(listener, connection):
    """An ``Acceptor`` for ``listener`` (the DEADBEEF front or the Kafka listener) bound to
    its host and port, serving nothing yet, its connections ``connection(listener)``;
    ``listener.port`` becomes the one bound (0: any free). ShmqError in one line when the
    address cannot be had."""
    try:
        socks = await _bound(listener.loop, listener.host, listener.port)
    except OSError as e:
        raise listen_error(e, listener.host, listener.port, listener.port_setting) from None
    listener.port = socks[0].getsockname()[1]
    return Acceptor(listener, lambda: connection(listener), socks, tls_options(listener.tls, listener.limits))


BACKLOG = 1024  # connections the kernel holds for each listening socket until accepted
ACCEPT_BATCH = 256  # accepted in one turn of the loop at most (the rest: at the next)
STARVED_PAUSE_S = (0.05, 1.0)  # out of descriptors with no spare to answer with: accepting pauses this long, doubled


async def _bound(loop, host, port) -> list:
    """Sockets bound to every address of ``host`` (None or "": every interface) on
    ``port``, as ``loop.create_server`` binds them (SO_REUSEADDR; IPv6 ones v6-only),
    not listening yet (``Acceptor.start_serving``). OSError as bind says it."""
    infos = await loop.getaddrinfo(host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    socks = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(errno.EADDRNOTAVAIL, f"no address for {host!r}")
    return socks


def _spare():
    """A descriptor held in reserve, let go to accept a connection when there is no other."""
    try:
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class Acceptor:
    """Accepts the connections of ``listener`` on ``socks`` (``listen``) and hands each to
    the loop (``connect_accepted_socket``, in TLS with ``tls``: ``tls_options``), with
    the methods of the loop's Server that the listeners use (``sockets``,
    ``start_serving``, ``close``, ``wait_closed``).

    Out of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM) an ``accept`` fails and the
    socket stays readable: the first failure says one line (then nothing until a
    connection is accepted again); the spare descriptor it holds is closed, and each
    waiting connection is accepted on it, sent ``listener.starved_reply()`` (a
    LIMIT_EXCEEDED frame; over TLS or Kafka's port, nothing) and closed; then the spare
    is taken back. Without a spare, accepting pauses (``STARVED_PAUSE_S``) instead of
    spinning."""

    def __init__(self, listener, factory, socks, tls):
        self.listener = listener
        self.factory = factory
        self.sockets = socks
        self.tls = tls
        self.loop = listener.loop
        self._serving = False
        self._spare = None
        self._starved = 0  # connections answered or waiting since the episode began (0: none going on)
        self._pause = STARVED_PAUSE_S[0]
        self._handshakes = set()  # connect_accepted_socket tasks not done yet

    async def start_serving(self) -> None:
        if self._serving or not self.sockets:
            return
        self._serving = True
        self._spare = _spare()
        for sock in self.sockets:
            sock.listen(BACKLOG)
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections stay)."""
        socks, self.sockets = self.sockets, []
        for sock in socks:
            if self._serving:
                self.loop.remove_reader(sock.fileno())
            sock.close()
        self._serving = False
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    async def wait_closed(self) -> None:
        return None  # (the listeners close their connections themselves)

    def _accept(self, sock) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._out_of_descriptors(sock, e)
                else:
                    log.warning("cannot accept a connection on port %d: %s", self.listener.port, e.strerror or e)
                    self._pause_accepting(sock)
                return
            if self._starved:
                log.debug("accepting connections again on port %d; %d answered LIMIT_EXCEEDED or closed meanwhile",
                          self.listener.port, self._starved)
                self._starved, self._pause = 0, STARVED_PAUSE_S[0]
                if self._spare is None:
                    self._spare = _spare()
            conn.setblocking(False)
            task = self.loop.create_task(self.loop.connect_accepted_socket(self.factory, conn, **self.tls))
            self._handshakes.add(task)
            task.add_done_callback(self._connected)

    def _connected(self, task) -> None:
        self._handshakes.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a TLS handshake that failed or timed out
            log.debug("a connection on port %d ended before it was made: %s", self.listener.port, task.exception())

    def _out_of_descriptors(self, sock, e) -> None:
        if not self._starved:
            open_now = open_fds()
            log.warning("port %d: cannot accept connections: out of file descriptors (%s%s); each new one is "
                        "answered LIMIT_EXCEEDED and closed until some are free: raise the server's limit "
                        "(LimitNOFILE= in its systemd unit, ulimit -n) or give a lower --max-connections",
                        self.listener.port, e.strerror or e, "" if open_now is None else f", {open_now} open",
                        extra={"event": "out_of_descriptors", "port": self.listener.port, "open": open_now})
        self._starved += 1
        reply = getattr(self.listener, "starved_reply", lambda: None)()
        while self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):  # every waiting one answered
                self._spare = _spare()
                return
            except OSError:
                break
            try:
                if reply is not None:
                    conn.setblocking(False)
                    conn.send(reply)
                    conn.shutdown(socket.SHUT_WR)
                    conn.recv(65536)  # what it sent already: closing on unread bytes would reset the connection
            except OSError:
                pass
            finally:
                conn.close()
            self._starved += 1
            self._spare = _spare()
        self._pause_accepting(sock)  # no spare to answer with: look again later, not at once

    def _pause_accepting(self, sock) -> None:
        if not self._serving:
            return
        self.loop.remove_reader(sock.fileno())
        self.loop.call_later(self._pause, self._resume, sock)
        self._pause = min(self._pause * 2, STARVED_PAUSE_S[1])

    def _resume(self, sock) -> None:
        if self._serving and sock in self.sockets:
            if self._spare is None:
                self._spare = _spare()
            self.loop.add_reader(sock.fileno(), self._accept, sock)


class AttachedHandles:
    """The handles this server keeps attached, of one kind (queues or streams), by name,
    each with its ``WaitingLine`` of waiting requests (``waiters``)."""

    def __init__(self, server, attach, line_class, gone, kind):
        self.server = server
        self.attach = attach  # name -> a new handle; raises the kind's not-found error
        self.line_class = line_class
        self.gone = gone  # the error whoever waits on a deleted one hears
        self.kind = kind
        self.handles = {}
        self.lines = {}
        self.peers = [self]  # the AttachedHandles of this kind on this loop (the DEADBEEF port's, the Kafka port's)

    def join(self, other: "AttachedHandles") -> None:
        """Serve ``other``'s lines too on ``notify``, and it ours: data this loop makes under
        ``waits.serving`` owes a doorbell of either no post, so both must look."""
        self.peers += [h for h in other.peers if h not in self.peers]
        for h in self.peers:
            h.peers = self.peers

    def get(self, name):
        """The cached handle on ``name``, attached again after a delete + create."""
        h = self.handles.get(name)
        if h is not None:
            if not h.deleted:
                return h
            self.forget(name)
        h = self.handles[name] = self.attach(name)
        return h

    def forget(self, name):
        """Drop the handle on ``name``; whoever waits on it hears that it was deleted."""
        h = self.handles.pop(name, None)
        line = self.lines.pop(name, None)
        if line is not None:
            line.answer_all(self.gone(f"{self.kind} {name!r} was deleted"))
            line.retire()
        if h is not None:
            h.close()

    def notify(self, name):
        """Data for ``name`` was just made by this loop: serve its line (and its peers') at
        once, so that the answers of its waiters leave before the reply of the request that
        made the data (the consumer waiting at the other end of a ping-pong is the one in a
        hurry; the producer's reply follows in the same turn)."""
        for handles in self.peers:
            line = handles.lines.get(name)
            if line is not None and line.live:
                line.serve()

    def line_of(self, h):
        line = self.lines.get(h.name)
        if line is None or line.handle is not h:
            line = self.lines[h.name] = self.line_class(self.server.loop, h)
        return line

    def answer_all(self):
        """The stop: every waiter gets what is there now, possibly nothing."""
        for line in list(self.lines.values()):
            line.serve()
            line.answer_all(NOTHING)

    def forget_all(self):
        for name in list(self.handles):
            self.forget(name)
