"""What a TCP handle is told when it connects: where (``split_url``: host, port, and the
token a URL may carry) and how (``ConnectOptions``: timeouts, reconnecting).

Strategy: both transports take these facts from here and only apply them, so the
blocking and the asyncio client time out and come back alike. A token in a URL is taken
out of it at once: the URL a handle keeps, shows in its repr and names in its errors
never holds it (nor does an error about a bad URL).
"""

import random
import re
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from ..busypoll import DEFAULT_BUSY_POLL_US, check_busy_poll_us
from ..protocol import MsgType

__all__ = ["Endpoint", "split_url", "redacted", "parse_url", "ConnectOptions", "DEFAULT_PORT",
           "DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_MAX_OUTAGE_S", "tls_context"]

DEFAULT_PORT = 7878
DEFAULT_CONNECT_TIMEOUT_S = 10.0  # connect and HELLO, when neither connect_timeout nor timeout is given
DEFAULT_HEARTBEAT_S = 15.0  # a quiet connection's PING; well under the server's --idle-timeout (300 s)
# how long a long-lived consumer (a consume() iteration, a group member's loop, kombu's and
# Dramatiq's consumers) keeps reconnecting after its connection is lost: a routine restart
# of its server, and a slow one, is ridden out (Kafka's clients retry for as long as they run)
DEFAULT_MAX_OUTAGE_S = 300.0
_HIDDEN = "***"


class Endpoint(NamedTuple):
    """A broker URL taken apart: ``url`` is the one given without its token."""

    host: str
    port: int
    token: str | None
    url: str


def redacted(url: str) -> str:
    """``url`` with whatever may be a token (user info, query values) hidden."""
    url = re.sub(r"(//)[^/?#]*@", rf"\g<1>{_HIDDEN}@", url)
    return re.sub(r"([?&][^=&#]*=)[^&#]*", rf"\g<1>{_HIDDEN}", url)


def split_url(url: str) -> Endpoint:
    """``tcp://[[user]:TOKEN@]host[:port][?token=TOKEN]`` taken apart (the user name, as
    redis-py's ``redis://user:password@``, is ignored; ``tcps://``: the same over TLS, see
    ``tls_context``); ValueError for anything else."""
    if not isinstance(url, str):
        raise TypeError(f"a broker url is a str, not {type(url).__name__}")
    parts = urlsplit(url)
    shown = redacted(url)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"broker url {shown!r} has a bad port") from None
    if parts.scheme not in ("tcp", "tcps") or not parts.hostname:
        raise ValueError(f"unsupported broker url {shown!r}: use tcp://host:port (tcps://host:port: TLS)")
    query = parse_qs(parts.query, keep_blank_values=True)
    if set(query) - {"token"}:
        raise ValueError(f"broker url {shown!r}: unknown parameter {sorted(set(query) - {'token'})[0]!r} "
                         "(a url takes only token=)")
    tokens = [unquote(t) for t in query.get("token", [])]
    if parts.password is not None:
        tokens.append(unquote(parts.password))
    elif parts.username:
        raise ValueError(f"broker url {shown!r}: put the token after a colon, tcp://:TOKEN@host:port")
    if len(set(tokens)) > 1:
        raise ValueError(f"broker url {shown!r} gives two different tokens")
    if tokens and (not tokens[0] or any(c.isspace() for c in tokens[0])):
        raise ValueError(f"broker url {shown!r}: a token is not empty and has no spaces")
    where = parts.netloc.rpartition("@")[2]
    return Endpoint(parts.hostname, port, tokens[0] if tokens else None,
                    urlunsplit((parts.scheme, where, parts.path, "", parts.fragment)))


def parse_url(url: str) -> tuple[str, int]:
    """(host, port) of a broker url (``split_url``)."""
    where = split_url(url)
    return where.host, where.port


def _check_ssl(value):
    if value is None or value is True:
        return
    import ssl

    if not isinstance(value, ssl.SSLContext):
        raise ValueError(f"ssl must be an ssl.SSLContext or True, not {value!r}")


def tls_context(url: str, options: "ConnectOptions"):
    """The ``ssl.SSLContext`` a connection to ``url`` is wrapped in (a ``tcps://`` url, or
    ``ssl=`` given; ``shmq.tls.client_context``), or None: plain TCP. ValueError in one
    line when the files it names cannot be used."""
    if options.ssl is None and not url.startswith("tcps:"):
        return None
    from ..tls import client_context

    return client_context(options.ssl)


def _seconds(name, value, zero_ok=False):
    if type(value) not in (int, float) or not (value >= 0 if zero_ok else value > 0) or value != value:
        raise ValueError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} number of seconds, "
                         f"not {value!r}")


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """How a TCP handle connects, waits and comes back: ``shmq.connect``'s keywords for
    ``tcp://`` urls, the same for the blocking and the asyncio client.

    ``timeout``: seconds a request may wait for its reply beyond what it asks the server
    to wait (a ``get(timeout=T)`` waits up to T plus this); None: for ever. Past it the
    connection is dropped (a late reply would come to nobody) and the call raises
    BrokerUnavailable. ``connect_timeout``: for the TCP connect and the HELLO (None:
    ``timeout``, else 10 s). ``reconnect``: after the connection is lost, the next call
    connects again, trying ``retries`` more times after a first failure, each pause drawn
    at random between 0 and ``backoff[0] * 2**attempt`` capped at ``backoff[1]`` (full
    jitter); subscriptions and group members come back on the new connection; without
    it every call after the loss raises BrokerUnavailable. ``max_outage``: what a
    long-lived consumer rides out instead (a ``consume()`` iteration, ``async for d in
    q``, a group member's iteration and polls, kombu's and Dramatiq's consumers): it keeps
    reconnecting, with the same jittered pauses capped at ``backoff[1]``, until this many
    seconds after the loss, and raises only then (None: for ever); a poll, or a wait of
    kombu's or Dramatiq's, that ends meanwhile returns nothing. ``heartbeat``: seconds between
    looks at a quiet connection (a PING when nothing was sent; dead when a PING got
    nothing back by the next look); None: no heartbeats. ``ssl``: an ``ssl.SSLContext`` to connect with over
    TLS (a ``tcps://`` url without it: ``shmq.tls.client_context``'s), or True: TLS with
    that default even for a ``tcp://`` url. ``busy_poll_us``: after sending a request, look
    for its reply this many microseconds at most without sleeping (``shmq.busypoll``: the
    window adapts down when replies come late, and the spin yields to any process that
    wants the CPU); 0: sleep at once.
    """

    timeout: float | None = None
    connect_timeout: float | None = None
    reconnect: bool = True
    retries: int = 5
    backoff: tuple[float, float] = (0.1, 2.0)
    max_outage: float | None = DEFAULT_MAX_OUTAGE_S
    heartbeat: float | None = DEFAULT_HEARTBEAT_S
    ssl: object = None
    busy_poll_us: int = DEFAULT_BUSY_POLL_US

    def __post_init__(self):
        for name in ("timeout", "connect_timeout", "heartbeat"):
            if getattr(self, name) is not None:
                _seconds(name, getattr(self, name))
        if self.max_outage is not None:
            _seconds("max_outage", self.max_outage, zero_ok=True)
        if type(self.reconnect) is not bool:
            raise ValueError(f"reconnect must be True or False, not {self.reconnect!r}")
        if type(self.retries) is not int or self.retries < 0:
            raise ValueError(f"retries must be a non-negative int, not {self.retries!r}")
        if not isinstance(self.backoff, (tuple, list)) or len(self.backoff) != 2:
            raise ValueError(f"backoff must be (first, most) seconds, not {self.backoff!r}")
        for value in self.backoff:
            _seconds("backoff", value, zero_ok=True)
        if self.backoff[0] > self.backoff[1]:
            raise ValueError(f"backoff must be (first, most) with first <= most, not {self.backoff!r}")
        object.__setattr__(self, "backoff", tuple(self.backoff))
        _check_ssl(self.ssl)
        check_busy_poll_us(self.busy_poll_us)

    @property
    def connect_limit(self) -> float:
        """Seconds the TCP connect, and then the HELLO's reply, may take."""
        if self.connect_timeout is not None:
            return self.connect_timeout
        return DEFAULT_CONNECT_TIMEOUT_S if self.timeout is None else self.timeout

    def pauses(self, rng=random, forever: bool = False):
        """The pause before each attempt of a reconnect: none before the first, then
        ``retries`` of them with full jitter (AWS's "Exponential Backoff And Jitter",
        redis-py's ExponentialWithJitterBackoff): the n-th (from 0) is
        ``rng.uniform(0, min(backoff[1], backoff[0] * 2**n))``, so clients a restart
        dropped together do not knock again together. ``forever``: as many as asked
        (a long-lived consumer's, which ``max_outage`` bounds in time)."""
        yield 0.0
        base, most = self.backoff
        n = 0
        while forever or n < self.retries:
            yield rng.uniform(0, min(most, base * 2 ** min(n, 64)))
            n += 1

    def outage_end(self, since: float) -> float | None:
        """When a long-lived consumer whose connection was lost at ``since`` (monotonic)
        stops riding the outage out (None: never)."""
        return None if self.max_outage is None else since + self.max_outage

    def reply_limit(self, msg_type, fields) -> float | None:
        """Seconds a request may wait for its reply: ``timeout`` plus what it asks the
        server to wait (``wait_ms``, a REQUEST's ``timeout_ms``); None: for ever (no
        ``timeout``, or a REQUEST that waits for ever)."""
        if self.timeout is None:
            return None
        fields = fields or {}
        if msg_type == MsgType.REQUEST and "timeout_ms" not in fields:
            return None
        return self.timeout + (fields.get("wait_ms", 0) + fields.get("timeout_ms", 0)) / 1000
