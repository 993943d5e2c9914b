"""The seam for the server's plain requests in C (``_plain.c``): ``plain_server(server)`` is the
``Plain`` a ``TcpServer`` serves the plain frames at the start of each read with, or None where
it is not built or not wanted (then every request goes through ``handlers``, as it always may).

Strategy: the engine's ``cpaths`` once more: the C extension is optional, chosen once per server,
and handed the few Python objects whose facts it must not keep a copy of — the server's queue
handles and how to attach one, the connections' lease tags, Python's reply of a CONSUME whose
messages have headers, the error reply of a settle the engine refused, the keepalives that make
an ack Python's. ``SHMQ_PURE_PYTHON=1`` (or a server whose handles run Python's paths) leaves it
out.
"""

from ..engine import maintenance
from ..engine.shm import cpaths
from ..model import keepalive
from .connection import error_frame
from .handlers import consumed_frame
from .leases import tag_counter
from .limits import SMALL_FRAME_BYTES

try:
    from . import _plain
except ImportError:  # pragma: no cover - depends on the build
    _plain = None

__all__ = ["plain_server", "BUILT"]

BUILT = _plain is not None


def plain_server(server):
    """The ``Plain`` of ``server`` (a TcpServer with its queues' handles), or None."""
    if _plain is None or not cpaths.enabled():
        return None
    plain = _plain.Plain(server.queues.handles, server.queues.get, tag_counter(), consumed_frame, error_frame,
                         keepalive.live(), maintenance, server.max_frame_bytes)
    count = getattr(server.metrics, "count", None)  # (NO_METRICS counts nothing)
    if count is not None:
        plain.timed(count)
    if server.loop is not None:  # a read served whole in C (``Connection.take``'s fast path)
        plain.reads(server.rview, server.rview[:SMALL_FRAME_BYTES], server.queues.notify, server.spin.touch,
                    server.loop.time, server.queues)
    return plain
