"""systemd's readiness protocol (sd_notify), without libsystemd: a service of
``Type=notify`` says ``READY=1`` once it serves and ``STOPPING=1`` when it stops.

Strategy: one datagram of ``KEY=VALUE`` lines to the unix socket named by
``$NOTIFY_SOCKET`` (a path, or an abstract name written with a leading ``@``); nothing
when it is unset, so a server not run by systemd pays nothing. A socket that cannot be
reached is logged, never fatal: the broker serves anyway (systemd then times the start
out, which says more than a crash would).
"""

import logging
import os
import socket

__all__ = ["notify", "NOTIFY_ENV"]

NOTIFY_ENV = "NOTIFY_SOCKET"

log = logging.getLogger("shmq.server")


def _address(value: str) -> str | None:
    """The socket address for ``$NOTIFY_SOCKET``'s value, or None for a kind this does not
    speak (systemd's vsock addresses)."""
    if value.startswith("@"):
        return "\0" + value[1:]  # Linux's abstract namespace
    return value if value.startswith("/") else None


def notify(**fields: str) -> bool:
    """Send ``fields`` (``READY="1"``, ``STATUS="..."``) to systemd when ``$NOTIFY_SOCKET``
    is set; True if sent. An unusable socket is logged at warning (once per call)."""
    value = os.environ.get(NOTIFY_ENV)
    if not value:
        return False
    address = _address(value)
    message = "".join(f"{k}={' '.join(str(v).splitlines())}\n" for k, v in fields.items()).encode()
    try:
        if address is None:
            raise OSError(f"not a unix socket address: {value!r}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(message)
        return True
    except OSError as e:
        log.warning("cannot tell systemd %s through $%s=%s: %s", ", ".join(fields), NOTIFY_ENV, value,
                    e.strerror or e, extra={"event": "notify_failed", "socket": value})
        return False
