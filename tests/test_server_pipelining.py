"""Pipelined requests against a real ``shmq server``: the replies to the requests of one
read leave together (``Connection.flush``), in request order, each once, an error reply
in its place; a fatal frame's error comes after the replies before it; and a client that
sends many requests without reading their replies holds the server small (the replies
leave every WRITE_BATCH bytes, so the transport's pause stops the requests behind them)."""

import socket

import psutil

from shmq.protocol import MsgType, Status, encode_request
from tests.test_server_tcp import _closed, _read_frames, _sock

MiB = 2**20
BODY = b"b" * (16 * 1024)


def test_pipelined_replies_come_back_in_order_each_once(servers, broker):
    server = servers(broker.namespace, "--no-persist")
    broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=2**20)
    broker.queue("q").put_many([BODY] * 10)
    s = _sock(server.port)
    requests = []
    for i in range(1, 301):  # 100 PEEKs of 160 KiB: the replies of one read cross WRITE_BATCH many times
        kind = i % 3
        if kind == 0:
            requests.append(encode_request(MsgType.PEEK, i, {"queue": "q", "max": 10}))
        elif kind == 1:
            requests.append(encode_request(MsgType.PRODUCE_BATCH, i, {"queue": "q", "messages": [{"body": b"%d" % i}]}))
        else:
            requests.append(encode_request(MsgType.CONSUME, i, {"queue": "q", "max": "ten"}))  # BAD_REQUEST
    s.sendall(b"".join(requests))  # one write: the server reads them in a few reads
    frames = _read_frames(s, 300, timeout=30)
    assert [(f.msg_id, f.status) for f in frames] == [(i, Status.BAD_REQUEST if i % 3 == 2 else Status.OK)
                                                     for i in range(1, 301)]
    peeked = [f.payload["messages"] for f in frames if f.msg_id % 3 == 0]
    assert len(peeked) == 100 and all([m["body"] for m in p] == [BODY] * 10 for p in peeked)
    ids = [f.payload["ids"][0] for f in frames if f.msg_id % 3 == 1]
    assert ids == list(range(11, 111))  # after the 10 put first, in request order
    s.close()
    assert broker.queue("q").stats().ready == 110
    assert server.stop() == 0


def test_the_replies_before_a_fatal_frame_come_before_its_error(servers, namespace):
    server = servers(namespace, "--no-persist")
    s = _sock(server.port)
    s.sendall(b"".join(encode_request(MsgType.PING, i) for i in range(1, 51)) + b"GET / HTTP/1.1\r\n\r\n")
    frames = _read_frames(s, 51)
    assert [(f.msg_id, f.status) for f in frames[:50]] == [(i, Status.OK) for i in range(1, 51)]
    assert frames[50].status == Status.BAD_FRAME and "bad magic" in frames[50].payload["error"]
    assert _closed(s)
    s.close()
    assert server.stop() == 0


def test_a_client_that_does_not_read_its_replies_keeps_the_server_small(servers, broker):
    server = servers(broker.namespace, "--no-persist")
    broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=2**20)
    broker.queue("q").put_many([BODY] * 10)
    proc = psutil.Process(server.proc.pid)
    s = _sock(server.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # little room in the kernel for replies
    rss0 = proc.memory_info().rss
    # 1000 PEEKs in 40 KB (one read): 160 MB of replies if the server took them all
    s.sendall(b"".join(encode_request(MsgType.PEEK, i, {"queue": "q", "max": 10}) for i in range(1, 1001)))
    server.wait_for_line(lambda line: "does not read its replies" in line)
    assert proc.memory_info().rss - rss0 < 32 * MiB  # it stopped taking requests
    frames = _read_frames(s, 1000, timeout=60)  # read now: it takes them again, and answers each
    assert [f.msg_id for f in frames] == list(range(1, 1001))
    assert all(len(f.payload["messages"]) == 10 for f in frames)
    s.close()
    assert server.stop() == 0
