"""The Kafka listener of ``shmq server`` (``--kafka-port``): Kafka clients produce to and
fetch from the namespace's streams (docs/KAFKA.md).

Strategy: beside the DEADBEEF front (``shmq.server.tcp``), on the same event loop and
the same engine API: ``listener`` (the socket, the cached stream handles with their
lines of waiting fetches), ``connection`` (frames in, one request at a time, responses
out, SASL state), ``handlers`` (the table of APIs and versions, and the small ones),
``produce`` (appends and idempotent producers' sequences), ``fetch`` (reads and the long
poll), ``groups`` (Kafka's consumer groups). The codec is ``shmq.kafka``, sans-IO.
"""

from .listener import KafkaListener

__all__ = ["KafkaListener"]
