"""shmq: a message broker for processes on one host, with queues in shared memory.

    import shmq
    with shmq.connect() as broker:
        q = broker.create_queue("orders", exist_ok=True)
        q.put(b"order #42")
        d = q.get()
        d.ack()

The local engine's names (Broker, Queue, Stream, ...) are loaded on first use, so that
``import shmq.client`` and ``shmq.connect("tcp://...")`` load no shared-memory code.
"""

import importlib

from . import errors
from .errors import *  # noqa: F403 (every exception: errors.__all__ is the one list of them)
from .model import faces
from .model.keepalive import Keepalive
from .model.messages import Message, QueueStats
from .model.records import Record, RecordMetadata, TopicPartition

# the names of the local engine (and of the producer, which sizes records as it does):
# the module each is imported from on first use, by __getattr__ below
_ON_USE = {
    "destroy_namespace": "engine.shm.segment",
    "Broker": "engine.broker",
    "default_namespace": "engine.broker",
    "Queue": "engine.queues.queue",
    "Delivery": "engine.queues.queue",
    "Stream": "engine.streams.stream",
    "Consumer": "engine.streams.consumer",
    "MultiConsumer": "engine.streams.multiconsumer",
    "Store": "engine.store",
    "Producer": "producer",
}

__version__ = "0.1.0"

__all__ = [
    "connect",
    "destroy_namespace",
    "Broker",
    "Queue",
    "Delivery",
    "Keepalive",
    "Message",
    "QueueStats",
    *errors.__all__,  # (the exceptions, as errors.py lists them)
    "Store",
    "Stream",
    "Record",
    "RecordMetadata",
    "Consumer",
    "MultiConsumer",
    "TopicPartition",
    "Producer",
    "__version__",
]


def connect(url: str | None = None, *, namespace: str | None = None, token: str | None = None, create: bool = True,
            **options):
    """Open a broker.

    With no url, attach locally to ``namespace`` (default: $SHMQ_NAMESPACE, else
    "shmq"). Connecting makes nothing: a namespace is made by the first create_queue,
    create_stream or create_exchange in it (until then it lists nothing); with
    ``create=False`` a namespace that does not exist is refused (NamespaceNotFound).
    ``tcp://host:port`` URLs are for remote clients of ``shmq server`` (whose namespace
    exists while it runs: ``create`` changes nothing there); their
    token is ``token``, else the url's (``tcp://:TOKEN@host:port`` or ``?token=``), else
    $SHMQ_TOKEN, else the one of your own server at that endpoint on this host, found in
    its runtime file (see shmq.auth). ``options``, for tcp:// only: ``timeout``,
    ``connect_timeout``, ``reconnect``, ``retries``, ``backoff``, ``ssl``
    (shmq.client.options.ConnectOptions). ``tcps://host:port``: the same over TLS
    (docs/OPERATIONS.md, "TLS"). The asyncio client is ``shmq.aio.connect``.
    """
    if url is None:
        if options:
            raise ValueError(f"{', '.join(sorted(options))}: options of tcp:// urls, not of a local attach")
        from .engine.broker import Broker, default_namespace

        _with_engine()
        return Broker(default_namespace() if namespace is None else namespace, create=create)
    if isinstance(url, str) and url.startswith(("tcp://", "tcps://")):
        from .client.remote import RemoteBroker

        return RemoteBroker(url, token=token, **options)
    from .client.options import redacted

    raise ValueError(f"unsupported broker url {redacted(str(url))!r}: use no url (local), tcp://host:port or "
                     "tcps://host:port (TLS)")


def __getattr__(name):
    if name == "aio":  # the asyncio client (shmq/aio.py), imported on first use: ``import shmq`` loads no asyncio
        return importlib.import_module(".aio", __name__)
    home = _ON_USE.get(name)
    if home is None:
        raise AttributeError(f"module 'shmq' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f".{home}", __name__), name)
    _with_engine()
    return value


def _with_engine():
    """With the local engine loaded, the stream producer too (a local ``Stream.producer``
    is its commonest use, and its first batch should not wait for the import)."""
    importlib.import_module(".producer", __name__)


# what the handles below hand out from above them (model/faces.py): each loads its module on first call
def _producer(stream, **options):
    from .producer import Producer

    return Producer(stream, **options)


def _transactional(broker, transactional_id, timeout=60.0):
    from .transactional import local  # (loads the TCP client: only when asked for)

    return local(broker, transactional_id, timeout)


async def _transactional_async(namespace, transactional_id, timeout=60.0):
    from .transactional import local_async

    return await local_async(namespace, transactional_id, timeout)


faces.producer, faces.transactional, faces.transactional_async = _producer, _transactional, _transactional_async


def __dir__():
    return sorted(set(globals()) | set(__all__))
