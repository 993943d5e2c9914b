"""Key routing: the partition of a keyed record, as Kafka's default partitioner picks it.

Strategy: one definition for every writer of a stream, native or Kafka (the Java
client's ``Utils.murmur2`` with seed 0x9747b28c, librdkafka's ``murmur2_random``), so a
key lands in the same partition whichever client wrote it. ``murmur2`` here is the
reference, in Python; the C extension's twin (``_fast.murmur2``, also used by the
sink's bulk routing ``key_partitions``) is a stream handle's when it runs the C paths
(``paths.PartitionPaths.murmur2``), and ``murmur2`` here where it is built; a test holds
the two equal.
"""

import struct

from ..shm import cpaths

__all__ = ["SEED", "murmur2", "murmur2_python", "partition_of"]

SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2_python(data) -> int:
    """MurmurHash2 of ``data`` (bytes-like) as Kafka's Java client computes it: a signed
    32-bit int (Java's ``int``), little-endian words, seed ``SEED``."""
    data = bytes(data)
    n = len(data)
    h = (SEED ^ n) & _MASK
    words = n >> 2
    for k in struct.unpack_from(f"<{words}I", data) if words else ():
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = n & 3
    if tail:
        rest = data[words << 2:]
        if tail == 3:
            h ^= rest[2] << 16
        if tail >= 2:
            h ^= rest[1] << 8
        h = ((h ^ rest[0]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


murmur2 = cpaths.C.murmur2 if cpaths.C is not None else murmur2_python  # the same numbers: C's where built


def partition_of(key, partitions: int, hash=None) -> int:
    """The partition of ``key`` (bytes-like) among ``partitions``: Kafka's default
    partitioner, ``(murmur2(key) & 0x7fffffff) % partitions`` (stable across processes,
    versions and clients, unlike ``hash()``). ``hash``: the murmur2 to use (a handle's
    paths'; None: ``murmur2``)."""
    return ((hash or murmur2)(key) & 0x7FFFFFFF) % partitions
