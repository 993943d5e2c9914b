"""What a kombu queue's declare is in shmq: its name (``shmq_name``), its arguments as
shmq settings (``queue_settings``: ``x-max-priority``, ``x-message-ttl``, ``x-expires``,
the dead-letter pair; a clear refusal of the others), a message's ``expiration`` as a
put's ttl, and the declare and delete calls."""

import re
from functools import lru_cache
from hashlib import sha1

from ..errors import ExchangeNotFound, QueueNotFound

__all__ = ["shmq_name", "declare", "delete_queue", "queue_settings", "expiration_ttl"]

_VALID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")


@lru_cache(maxsize=1024)
def shmq_name(name: str) -> str:
    """The shmq queue or exchange name of a kombu one: itself where shmq allows it, else
    its allowed characters (others as "_") and a hash of the original, so two kombu
    names never meet ("celery@host.celery.pidbox" -> "celery_host.celery.pidbox-5f0c...")."""
    if _VALID.match(name):
        return name
    clean = re.sub(r"[^A-Za-z0-9_.:-]", "_", name).lstrip(".:-")[:100] or "q"
    return f"{clean}-{sha1(name.encode()).hexdigest()[:12]}"


def declare(broker, name: str, **settings) -> None:
    """Make queue ``name`` with ``settings``, or change the live ones of the queue there."""
    q = broker.declare_queue(name, **settings)
    if q is not None and hasattr(q, "close"):
        q.close()


def delete_queue(broker, name: str) -> None:
    """Delete shmq queue ``name`` (if it is there) and its bindings."""
    try:
        broker.delete_queue(name)
    except QueueNotFound:
        pass
    for exchange in broker.list_exchanges():
        try:
            broker.unbind(exchange, name)
        except ExchangeNotFound:
            pass


# ------------------------------------------------------------------ queue arguments
def _levels(value) -> int:
    levels = int(value) + 1
    if not 1 <= levels <= 16:
        raise ValueError("a shmq queue has 1 to 16 priority levels: x-max-priority 0 to 15")
    return levels


def _ms(value) -> float:
    seconds = float(value) / 1000
    if seconds <= 0:
        raise ValueError("milliseconds, more than 0")
    return seconds


def _classic(value) -> None:
    if value != "classic":
        raise ValueError("not supported by the shmq transport: shmq queues are classic ones (one host, no replicas)")


# x- argument -> (the shmq setting it is, None: nothing to shmq; its value from the argument's)
_ARGUMENTS = {
    "x-max-priority": ("priorities", _levels),
    "x-message-ttl": ("message_ttl", _ms),
    "x-expires": ("expires", _ms),
    "x-queue-mode": (None, str),  # lazy or default: where RabbitMQ keeps the messages
    "x-queue-type": (None, _classic),
}
# those shmq cannot honour, and why; x-dead-letter-* in ``_dead_letter_argument``
_REFUSED = {
    "x-max-length": "a shmq queue is bounded in bytes (the transport option max_bytes), and a full one makes "
                    "publishers wait: it never drops or refuses messages by count",
    "x-max-length-bytes": "a full shmq queue makes publishers wait, it never drops its oldest messages "
                          "(x-overflow=drop-head) nor refuses new ones; its size is the transport option max_bytes",
    "x-overflow": "a full shmq queue makes publishers wait (the transport option max_bytes)",
    "x-single-active-consumer": "shmq hands a queue's messages to all its consumers",
    "x-delivery-limit": "use the transport option max_deliveries",
}


def _refused(key, value, why) -> ValueError:
    return ValueError(f"queue argument {key}={value!r} is not supported by the shmq transport: {why}")


def _dead_letter_argument(exchange, routing_key) -> str:
    """The dead-letter queue of ``x-dead-letter-exchange`` / ``-routing-key``: the default
    exchange ("") and a routing key, which names the queue; ValueError for the others."""
    if exchange is None:
        raise _refused("x-dead-letter-routing-key", routing_key, "it goes with x-dead-letter-exchange=''")
    if exchange != "":
        raise _refused("x-dead-letter-exchange", exchange, "shmq dead-letters into a queue, not through an exchange: "
                       "give x-dead-letter-exchange='' and x-dead-letter-routing-key=QUEUE, or use the transport "
                       "option dead_letter_queue")
    if not routing_key:
        raise _refused("x-dead-letter-exchange", exchange, "give x-dead-letter-routing-key=QUEUE too (a dead "
                       "letter keeping its own routing key is not supported)")
    return shmq_name(routing_key)


def queue_settings(arguments) -> dict:
    """The shmq settings of a kombu queue's ``arguments`` (``_ARGUMENTS``; the dead-letter
    ones: ``_dead_letter_argument``); ValueError naming one it cannot honour."""
    args = dict(arguments or {})
    out = {}
    dlx, dlk = args.pop("x-dead-letter-exchange", None), args.pop("x-dead-letter-routing-key", None)
    if dlx is not None or dlk is not None:
        out["dead_letter_queue"] = _dead_letter_argument(dlx, dlk)
    for key, value in args.items():
        if key not in _ARGUMENTS:
            raise _refused(key, value, _REFUSED.get(key, "shmq knows " + ", ".join(sorted(_ARGUMENTS))
                                                    + " and x-dead-letter-exchange / -routing-key"))
        setting, convert = _ARGUMENTS[key]
        if value is None:
            continue
        try:
            value = convert(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"queue argument {key}={value!r}: {exc}") from None
        if setting is not None:
            out[setting] = value
    return out


def expiration_ttl(props):
    """A message's ``expiration`` property (AMQP's: milliseconds, a string) as a put's ``ttl``
    (seconds; None: none). "0" expires it unless it is taken at once: the least a ttl is."""
    value = props.get("expiration")
    if value in (None, ""):
        return None
    try:
        return max(float(value) / 1000, 0.001)
    except (TypeError, ValueError):
        raise ValueError(f"message property expiration={value!r}: milliseconds, as a number") from None
