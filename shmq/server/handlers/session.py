"""The connection's own requests: HELLO (the token, the server's limits), PING and
BACKUP."""

import hmac
import logging

from ... import __version__
from ...errors import Unauthorized
from ...protocol.compression import CODECS
from .answers import OffLoop


def hello(conn, f):
    server = conn.server
    if server.token is not None:
        if not hmac.compare_digest(str(f.get("token") or "").encode(), server.token.encode()):
            given, peer = bool(f.get("token")), getattr(conn, "peer", None)
            logging.getLogger("shmq.server").warning(
                "%s: token refused (%s)", peer, "a wrong token" if given else "no token",
                extra={"event": "token_refused", "peer": peer, "token_given": given})
            raise Unauthorized("wrong or missing token")
        conn.authenticated()
    reply = {"server": "shmq", "version": __version__, "max_frame_bytes": server.max_frame_bytes,
             "compression": CODECS, "produce_each": True, "compact": True}
    if "heartbeat_ms" in f:  # the client wants to hear from the server while it only waits
        reply["heartbeat_ms"] = conn.beat_every(f["heartbeat_ms"])
    return reply


def ping(conn, f):
    return {}


def backup(conn, f):
    """BACKUP: every durable queue and stream, the exchanges and the Kafka listener's
    commit metadata copied into the new directory ``dest`` (server/backup.py), in a thread."""
    from ..backup import start  # (it loads persistence: only a server asked for a backup needs it)

    return OffLoop(start(conn.server, f["dest"]), _backed_up)


def _backed_up(summary):
    return summary
