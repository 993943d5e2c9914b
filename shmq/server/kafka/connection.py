"""One Kafka client connection: frames in, one request at a time, responses out.

Strategy: Kafka answers a connection's requests in the order they came, and a broker
reads the next one only once the last is answered (it mutes the channel): so does this
one, with one task per connection running ``serve`` and the reading paused while the
decoder holds more than a frame. Before SASL (where the listener wants the token) only
ApiVersions, SaslHandshake and SaslAuthenticate are taken, in frames of at most
``PRE_AUTH_MAX_FRAME_BYTES``, as the DEADBEEF port takes only HELLO. Whatever breaks the
protocol closes the connection with a logged reason; a request of an API or version
not served is answered UNSUPPORTED_VERSION where its response has a place for it. The
DEADBEEF port's deadlines (``limits.Clocks``) hold here too: a frame must be whole
within the frame timeout of its first byte, and a connection without a request in
progress (a Fetch's long poll, a JoinGroup waiting for the rebalance are in progress)
is closed after the idle timeout — after the frame timeout before SASL. Kafka has no
error frame for either: the connection just closes, with the reason in the log.
"""

import asyncio
import logging

from ...kafka import ErrorCode, FrameDecoder, KafkaProtocolError, build, encode_response, frame, parse_request
from ...kafka.messages import api_name, response_class
from ...logs import peer_text
from ..limits import PRE_AUTH_MAX_FRAME_BYTES, Clocks
from .handlers import API_VERSIONS, PRE_AUTH, api_versions_data, check_plain

__all__ = ["KafkaConnection"]

FAILED_AUTH_CLOSE_DELAY_S = 0.1

log = logging.getLogger("shmq.server")


class KafkaConnection(asyncio.Protocol):
    """The per-connection context a handler gets (``ctx``): ``server`` (the listener),
    ``client_id``, ``peer``, ``authed``, ``mechanism`` (after a SaslHandshake), ``raw_sasl``
    (after a SaslHandshake v0, till its token came)."""

    def __init__(self, server):
        self.server = server
        self.transport = None
        self.peer = None
        self.client_id = None
        self.authed = server.token is None
        self.mechanism = None
        self.raw_sasl = False  # after a SaslHandshake v0: the next frame is a raw SASL token
        self.decoder = FrameDecoder(server.max_frame_bytes if self.authed else PRE_AUTH_MAX_FRAME_BYTES)
        self.closing = False
        self.close_after = None  # a reason: close once the response in hand is written
        self.paused = False
        self.gone = False  # the client closed its side: serve what it sent, then end
        self.handling = False  # a handler runs (it may wait: a Fetch's long poll)
        self.requests = 0
        self.clocks = Clocks(server.limits, server.loop.time())
        self._wake = asyncio.Event()
        self._task = None

    def authenticated(self):
        """SASL done: every API, and frames up to the server's ``max_frame_bytes``."""
        self.authed = True
        self.decoder.max_frame_bytes = self.server.max_frame_bytes

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport):
        self.transport = transport
        self.peer = peer_text(transport.get_extra_info("peername"))
        if not self.server.admit(self):
            log.warning("%s: Kafka connection refused: %d open, the limit", self.peer, len(self.server.connections))
            self.closing = True
            transport.abort()
            return
        self._task = self.server.loop.create_task(self._serve())

    def data_received(self, data):
        if self.closing:
            return
        self.decoder.receive_data(data)
        self.clocks.received(self.server.loop.time(), *self.decoder.scan())
        if self.decoder.buffered > self.decoder.max_frame_bytes + 4 and not self.paused:
            self.paused = True  # a whole frame is in: read on once it is taken
            self.transport.pause_reading()
        self._wake.set()

    def eof_received(self):
        return False  # the transport closes: connection_lost

    def connection_lost(self, exc):
        """The client left: the requests it sent before are still served (a Produce with
        acks=0 and a close right after loses nothing), answered into the void; one waiting
        for data (a Fetch) is given up."""
        self.gone = True
        self.server.connection_gone(self)
        self._wake.set()
        if self.handling and self._task is not None and not self._task.done():
            self._task.cancel()

    def close(self, reason, level=logging.WARNING):
        """Close after what is written is sent; ``reason`` logged at ``level``."""
        if self.closing:
            return
        self.closing = True
        log.log(level, "%s: Kafka connection closed: %s", self.peer, reason,
                extra={"event": "kafka_connection_closed", "peer": self.peer, "reason": reason,
                       "client_id": self.client_id})
        self._wake.set()
        if self.transport is not None:
            self.transport.close()

    def check_clocks(self, now):
        """Called by the listener's sweeper: close on a frame past its deadline, or when
        idle (no request in progress)."""
        if self.closing:
            return
        overdue = self.clocks.overdue(now, self.authed, self.handling)
        if overdue is None:
            return
        frame_late, reason = overdue
        if frame_late is not None:
            self.close(reason)
        elif self.authed:
            self.close(reason, logging.INFO)
        else:
            limits = self.server.limits
            self.close(f"no SASL authentication within {min(limits.frame_timeout, limits.idle_timeout):g}s; closing")

    def write(self, data: bytes):
        if not self.closing and not self.transport.is_closing():
            self.transport.write(data)

    # ------------------------------------------------------------------ requests
    async def _serve(self):
        try:
            while not self.closing:
                try:
                    body = self.decoder.next_frame()
                except KafkaProtocolError as e:
                    self.close(str(e))
                    return
                if body is None:
                    if self.gone:
                        return
                    if self.paused:
                        self.paused = False
                        if self.clocks.frame_started is not None:  # its clock ran while this side did not read
                            self.clocks.frame_started = self.server.loop.time()
                        self.transport.resume_reading()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self.handling = True
                try:
                    await self.handle(body)
                finally:
                    self.handling = False
                if self.authed:  # before SASL, requests do not hold the connection open
                    self.clocks.last_active = self.server.loop.time()
                if self.close_after is not None:  # after a delay, as Kafka's
                    # connection.failed.authentication.delay.ms: the client reads the error before the close
                    self.transport.pause_reading()
                    self.server.loop.call_later(FAILED_AUTH_CLOSE_DELAY_S, self.close, self.close_after)
                    return
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug must cost this connection, never the server
            log.exception("%s: internal error in the Kafka listener; closing", self.peer)
            self.closing = True
            self.transport.abort()

    async def handle(self, body: bytes):
        """Answer one request frame (or close, saying why)."""
        self.requests += 1
        if self.raw_sasl:  # (also where no token is wanted: the client sends one all the same)
            self._raw_token(body)
            return
        try:
            req = parse_request(body, self.server.versions)
        except KafkaProtocolError as e:
            self._refuse(e)
            return
        self.client_id = req.client_id
        if not self.authed and req.api_key not in PRE_AUTH:
            self.close(f"{api_name(req.api_key)} before SASL authentication (this listener wants SASL/PLAIN "
                       f"with the server's token as the password)")
            return
        response = await self.server.handlers[req.api_key](self, req.header, req.body)
        if response is not None:  # None: Produce with acks=0 (no response)
            self.write(encode_response(req.correlation_id, response))

    def _raw_token(self, body: bytes):
        """The SASL/PLAIN token after a SaslHandshake v0, in a frame with no request header:
        answered with an empty frame, or (Kafka has no error to send here) a close."""
        self.raw_sasl = False
        if check_plain(self, body):
            self.write(frame(b""))
        else:
            self.close_after = "SASL authentication failed (a raw token after SaslHandshake v0)"

    def _refuse(self, e: KafkaProtocolError):
        """A request this listener does not take: answered where Kafka answers it."""
        what = getattr(e, "request", None)
        if what is None:
            self.close(str(e))
            return
        api_key, version, correlation_id = what
        if e.code != ErrorCode.unsupported_version:  # read, and did not parse
            self.close(str(e))
            return
        if api_key == API_VERSIONS:  # KIP-511: an unknown version is answered in v0's form, with the versions
            response = build(response_class(API_VERSIONS, 0),
                             {**api_versions_data(self.server), "error_code": ErrorCode.unsupported_version})
            self.write(encode_response(correlation_id, response))
            return
        cls = response_class(api_key, version)
        if cls is None or "error_code" not in cls.__dataclass_fields__:
            self.close(f"{e} (and its response has no place for an error)")
            return
        log.info("%s: %s; answered UNSUPPORTED_VERSION", self.peer, e,
                 extra={"event": "kafka_unsupported", "peer": self.peer, "api_key": api_key, "api_version": version})
        self.write(encode_response(correlation_id, build(cls, {"error_code": ErrorCode.unsupported_version})))
