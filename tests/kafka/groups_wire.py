"""A Kafka client of a few lines for the group tests: one socket, requests written as kio
objects and answered in order, so a test can hold a JoinGroup open (``send`` now, ``recv``
later) and send what no real client sends (a stale generation, a stranger's member id)."""

import dataclasses
import datetime
import io
import socket
import struct
import typing

from kio.serial import entity_reader, entity_writer

from shmq.kafka import frame
from shmq.kafka.messages import request_class, response_class

__all__ = ["Wire", "subscription", "produce", "fetch_records"]

JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH, FIND, DESCRIBE, LIST = 11, 14, 12, 13, 8, 9, 10, 15, 16


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0 naming ``topics`` (no user data)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def assignment(parts: dict) -> bytes:
    """A ConsumerProtocolAssignment v0 of {topic: [partition]}."""
    out = struct.pack(">hi", 0, len(parts))
    for t, ps in parts.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps)) + b"".join(
            struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


def _make(cls, fields: dict):
    """A kio ``cls`` of ``fields``; nested structs and arrays of them given as dicts and
    lists of dicts (fields left out take their defaults)."""
    hints = typing.get_type_hints(cls)
    kw = {}
    for name, value in fields.items():
        tp = hints[name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) is not tuple and args:
            tp = args[0]
        many = typing.get_origin(tp) is tuple
        inner = typing.get_args(tp)[0] if many else tp
        if value is not None and dataclasses.is_dataclass(inner):
            value = tuple(_make(inner, v) for v in value) if many else _make(inner, value)
        elif many and value is not None:
            value = tuple(value)
        kw[name] = value
    return cls(**kw)


class Wire:
    """One connection to a Kafka listener on 127.0.0.1:``port``."""

    def __init__(self, port: int, client_id: str = "wire", timeout: float = 30.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.client_id = client_id
        self.sent = []  # (correlation id, response class), oldest first
        self.correlation = 0

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, api_key: int, version: int, **fields) -> None:
        cls = request_class(api_key, version)
        self.correlation += 1
        head = cls.__header_schema__(request_api_key=api_key, request_api_version=version,
                                     correlation_id=self.correlation, client_id=self.client_id)
        out = io.BytesIO()
        entity_writer(type(head))(out, head)
        entity_writer(cls)(out, _make(cls, fields))
        self.sock.sendall(frame(out.getvalue()))
        self.sent.append((self.correlation, response_class(api_key, version)))

    def recv(self):
        """The response to the oldest request not yet read."""
        correlation, cls = self.sent.pop(0)
        (n,) = struct.unpack(">i", self._read(4))
        data = self._read(n)
        head, used = entity_reader(cls.__header_schema__)(data, 0)
        assert head.correlation_id == correlation, (head, correlation)
        body, _n = entity_reader(cls)(data, used)
        return body

    def call(self, api_key: int, version: int, **fields):
        self.send(api_key, version, **fields)
        return self.recv()

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the listener closed the connection"
            buf += chunk
        return buf


def produce(w: Wire, topic: str, records: bytes, acks: int = 1):
    """A Produce v9 of ``records`` (record batches) to partition 0 of ``topic``: its
    partition's response."""
    r = w.call(0, 9, transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=30), topic_data=[
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}])
    return r.responses[0].partition_responses[0]


def fetch_records(w: Wire, topic: str, offset: int, max_bytes: int = 2**20, isolation: int = 0, partition: int = 0):
    """A Fetch v12 of ``partition`` of ``topic`` from ``offset``, not waiting (``isolation``
    1: read_committed): the partition's response."""
    r = w.call(1, 12, cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
               max_bytes=max_bytes, isolation_level=isolation, session_id=0, session_epoch=-1, topics=[
                   {"topic": topic, "partitions": [
                       {"partition": partition, "fetch_offset": offset, "partition_max_bytes": max_bytes,
                        "current_leader_epoch": -1, "log_start_offset": -1, "last_fetched_epoch": -1}]}],
               forgotten_topics_data=[], rack_id="")
    return r.responses[0].partitions[0]
