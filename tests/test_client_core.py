"""The clients' sans-IO core (shmq/client/core.py), fed bytes directly: no socket, no
server, no sleep. ``Loopback`` is the blocking client with a fake server in place of its
socket and a fake clock in place of time."""

import pytest

import shmq
from shmq.client.core import CONSUME_SLICE_MS, PUT_RETRY_S, BrokerCalls, ClientCore
from shmq.client.remote import RemoteBroker, RemoteDelivery, RemoteQueue
from shmq.engine.queues.delivery import QueueStats
from shmq.protocol import (EXCEPTIONS, FrameDecoder, MsgType, PushType, Status, encode_error, encode_reply,
                           encode_request)

ENDPOINT = "127.0.0.1:7878"
MESSAGE = {"id": 4, "delivery": 17, "body": b"m", "headers": {"k": "v"}, "attempt": 2}
STATS = {"ready": 1, "in_flight": 2, "oldest_ready_age_ms": 1500, "bytes_used": 64, "max_bytes": 4096,
         "enqueued_total": 5, "acked_total": 3, "redelivered_total": 1, "dead_lettered_total": 0}


def decode(data):
    decoder = FrameDecoder()
    decoder.feed(data)
    (frame,) = decoder.frames()
    return frame


class Loopback(RemoteBroker):
    """The blocking client's calls and driver; a request's bytes go to ``answer(self,
    frame)``, whose reply bytes come back one byte at a time; pauses advance ``now``."""

    def __init__(self, answer=lambda b, f: encode_reply(f.type, f.msg_id, {})):
        BrokerCalls.__init__(self, f"tcp://{ENDPOINT}")
        self.answer = answer
        self.sent = []  # (bytes, frame) of each request
        self.pauses = []
        self.now = 1000.0

    def _clock(self):
        return self.now

    def _sleep(self, seconds):
        self.pauses.append(seconds)
        self.now += seconds

    def _drive(self, call):
        return self._run(call, None)

    def _exchange(self, link, msg_type, payload=None, limit=None):
        msg_id, data = self._core.send(msg_type, payload)
        frame = decode(data)
        self.sent.append((data, frame))
        reply = self.answer(self, frame)
        for i in range(len(reply)):
            self._core.receive_data(reply[i : i + 1])
        return self._core.result(msg_id)


def replying(payload):
    return lambda b, f: encode_reply(f.type, f.msg_id, payload)


def refusing(status, text):
    return lambda b, f: encode_error(f.type, f.msg_id, status, text)


# ---------------------------------------------------------------- requests
def test_a_call_sends_the_bytes_of_its_request():
    b = Loopback(replying({"id": 7}))
    assert RemoteQueue(b, "q").put(b"x", headers={"k": "v"}) == 7
    assert b.sent[0][0] == encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"x", "headers": {"k": "v"}})


CALLS = [  # (call on broker b, queue q of b, delivery d of q; request type and payload; reply; result)
    (lambda b, q, d: b.ping(), MsgType.PING, {}, {}, None),
    (lambda b, q, d: b.list_queues(), MsgType.LIST, {}, {"queues": ["a", "q"]}, ["a", "q"]),
    (lambda b, q, d: b.delete_queue("a"), MsgType.DELETE, {"queue": "a"}, {}, None),
    (lambda b, q, d: b.queue("a").name, MsgType.STATS, {"queue": "a"}, STATS, "a"),
    (lambda b, q, d: b.create_queue("a", max_bytes=4096, dead_letter_queue="dlq", durability="wal").name,
     MsgType.CREATE, {"queue": "a", "max_bytes": 4096, "visibility_timeout_ms": 30000, "exist_ok": False,
                      "dead_letter_queue": "dlq", "durability": "wal", "priorities": 1, "message_ttl": None,
                      "dedup_window": 300.0, "retry_delay": 0.0, "retry_backoff": 1.0, "retry_delay_max": None,
                      "priority_aging": 60.0}, {}, "a"),
    (lambda b, q, d: q.put_nowait(b"x"), MsgType.PRODUCE, {"queue": "q", "body": b"x"}, {"id": 3}, 3),
    (lambda b, q, d: q.put_many([b"x", b"y"], headers=[None, {"n": 1}]), MsgType.PRODUCE_BATCH,
     {"queue": "q", "messages": [{"body": b"x"}, {"body": b"y", "headers": {"n": 1}}]}, {"ids": [1, 2]}, [1, 2]),
    (lambda b, q, d: q.get(), MsgType.CONSUME, {"queue": "q", "max": 1, "wait_ms": CONSUME_SLICE_MS},
     {"messages": [MESSAGE]}, "delivery"),
    (lambda b, q, d: q.get_nowait(visibility_timeout=2.5), MsgType.CONSUME,
     {"queue": "q", "max": 1, "visibility_ms": 2500, "wait_ms": 0}, {"messages": [MESSAGE]}, "delivery"),
    (lambda b, q, d: q.get_many(10, timeout=0.25), MsgType.CONSUME, {"queue": "q", "max": 10, "wait_ms": 250},
     {"messages": [MESSAGE, MESSAGE]}, ["delivery", "delivery"]),
    (lambda b, q, d: q.ack_many([d]), MsgType.ACK, {"queue": "q", "deliveries": [17]}, {"acked": 1}, 1),
    (lambda b, q, d: q.stats(), MsgType.STATS, {"queue": "q"}, STATS,
     QueueStats(ready=1, in_flight=2, oldest_ready_age_s=1.5, bytes_used=64, max_bytes=4096, enqueued_total=5,
                acked_total=3, redelivered_total=1, dead_lettered_total=0, consumers_waiting=0,
                producers_waiting=0, delayed=0, purged_total=0, ready_by_priority=(1,))),  # (an older server's reply)
    (lambda b, q, d: q.purge(), MsgType.PURGE, {"queue": "q"}, {"purged": 3}, 3),
    (lambda b, q, d: d.ack(), MsgType.ACK, {"queue": "q", "deliveries": [17]}, {"acked": 1}, None),
    (lambda b, q, d: d.nack(delay=0.25), MsgType.NACK,
     {"queue": "q", "deliveries": [17], "requeue": True, "delay_ms": 250}, {}, None),
    (lambda b, q, d: d.nack(requeue=False), MsgType.NACK,
     {"queue": "q", "deliveries": [17], "requeue": False}, {}, None),
    (lambda b, q, d: d.reject(), MsgType.REJECT, {"queue": "q", "deliveries": [17]}, {}, None),
    (lambda b, q, d: d.extend(60), MsgType.EXTEND, {"queue": "q", "deliveries": [17], "visibility_ms": 60000},
     {}, None),
]


@pytest.mark.parametrize("call, msg_type, payload, reply, result", CALLS)
def test_each_call_is_one_request_and_its_reply(call, msg_type, payload, reply, result):
    b = Loopback(replying(reply))
    q = RemoteQueue(b, "q")
    d = RemoteDelivery(q, MESSAGE)
    got = call(b, q, d)
    ((data, frame),) = b.sent
    assert (frame.type, frame.msg_id, frame.payload) == (msg_type, 1, payload)
    assert data == encode_request(msg_type, 1, payload)
    if isinstance(got, RemoteDelivery) or (isinstance(got, list) and got and isinstance(got[0], RemoteDelivery)):
        for one in got if isinstance(got, list) else [got]:
            assert (one.queue, one.id, one.body, one.headers, one.attempt, one._tag) == ("q", 4, b"m", {"k": "v"},
                                                                                          2, 17)
        got = ["delivery"] * len(got) if isinstance(got, list) else "delivery"
    assert got == result


def test_hello_presents_the_token_and_names_it_when_refused():
    b = Loopback(replying({"server": "shmq"}))
    b.token = "s3cret"
    assert b._hello("shmq-python", None, None) == {"server": "shmq"}
    assert b.sent[0][1].payload == {"client": "shmq-python", "token": "s3cret"}
    b.answer = refusing(Status.UNAUTHORIZED, "wrong or missing token")
    with pytest.raises(shmq.Unauthorized, match=f"^{ENDPOINT} refused the token given: wrong or missing token$"):
        b._hello("shmq-python", None, None)


# ---------------------------------------------------------------- replies
def test_replies_are_matched_by_msg_id_in_any_order_and_any_chunking():
    core = ClientCore(ENDPOINT)
    ids = [core.send(MsgType.PING)[0] for _ in range(3)]
    assert ids == [1, 2, 3]
    stream = encode_reply(MsgType.PING, 3, {"n": 3}) + encode_reply(MsgType.PING, 1, {"n": 1})
    done = []
    for i in range(len(stream)):
        done += core.receive_data(stream[i : i + 1])
    assert done == [3, 1]
    assert (core.done(1), core.done(2), core.done(3)) == (True, False, True)
    assert (core.result(1), core.result(3)) == ({"n": 1}, {"n": 3})
    assert core.receive_data(encode_reply(MsgType.PING, 2, {"n": 2}) + encode_reply(MsgType.PING, 9)) == [2]
    assert core.result(2) == {"n": 2}  # and the reply nobody waits for (9) is dropped


def test_msg_ids_never_use_0_which_speaks_for_the_connection():
    core = ClientCore(ENDPOINT)
    core._last_id = 0xFFFFFFFE
    assert [core.send(MsgType.PING)[0] for _ in range(3)] == [0xFFFFFFFF, 1, 2]


@pytest.mark.parametrize("status, cls", sorted(EXCEPTIONS.items()))
def test_an_error_reply_raises_its_exception_with_the_servers_text(status, cls):
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.PING)
    core.receive_data(encode_error(MsgType.PING, msg_id, status, "the reason"))
    with pytest.raises(cls, match="^the reason$") as caught:
        core.result(msg_id)
    assert type(caught.value) is cls
    if cls is shmq.ProtocolError:
        assert (caught.value.status, caught.value.msg_id) == (status, msg_id)
    core.send(MsgType.PING)  # the connection goes on


def test_an_error_with_msg_id_0_ends_every_waiting_and_later_request():
    core = ClientCore(ENDPOINT)
    first, second = core.send(MsgType.PING)[0], core.send(MsgType.CONSUME, {"queue": "q"})[0]
    stream = encode_reply(MsgType.PING, first) + encode_reply(0, 0, {"ignored": True})  # status OK: not an end
    assert core.receive_data(stream) == [first]
    assert core.receive_data(encode_error(0, 0, Status.LIMIT_EXCEEDED, "a frame must arrive whole within 30s")) \
        == [second]
    assert core.result(first) == {}
    errors = []
    for attempt in (lambda: core.result(second), lambda: core.send(MsgType.PING), lambda: core.send(MsgType.PING)):
        with pytest.raises(shmq.LimitExceeded, match=r"^a frame must arrive whole within 30s$") as caught:
            attempt()
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == 3  # a fresh exception each time, no shared traceback
    core.receive_data(b"")  # the close that follows does not change the reason
    with pytest.raises(shmq.LimitExceeded):
        core.send(MsgType.PING)


def test_an_error_with_msg_id_0_before_any_request_ends_the_first_one():
    core = ClientCore(ENDPOINT)
    assert core.receive_data(encode_error(0, 0, Status.LIMIT_EXCEEDED, "too many connections")) == []
    with pytest.raises(shmq.LimitExceeded, match="^too many connections$"):
        core.send(MsgType.HELLO, {"client": "x"})


def test_the_servers_close_ends_the_connection():
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.PRODUCE, {"queue": "q", "body": b"x"})
    assert core.receive_data(b"") == [msg_id]
    message = f"^lost the connection to {ENDPOINT}: connection closed by the server"
    with pytest.raises(shmq.OutcomeUnknown,  # sent, unanswered: it may have landed
                       match=message + r" \(the PRODUCE was sent: whether it was carried out is unknown\)$"):
        core.result(msg_id, MsgType.PRODUCE)
    with pytest.raises(shmq.BrokerUnavailable, match=message + "$") as caught:  # never sent: not carried out
        core.send(MsgType.PING)
    assert type(caught.value) is shmq.BrokerUnavailable


def test_a_request_whose_write_failed_was_not_carried_out():
    core = ClientCore(ENDPOINT)
    sent, _ = core.send(MsgType.PRODUCE, {"queue": "q", "body": b"x"})
    unsent, _ = core.send(MsgType.PRODUCE, {"queue": "q", "body": b"y"})
    assert core.connection_lost(BrokenPipeError(32, "Broken pipe")) == [sent, unsent]
    core.not_sent(unsent)
    with pytest.raises(shmq.OutcomeUnknown, match=r"\(the PRODUCE was sent: whether it was carried out is unknown\)$"):
        core.result(sent, MsgType.PRODUCE)
    with pytest.raises(shmq.BrokerUnavailable, match=r"^lost the connection to .*: \[Errno 32\] Broken pipe$") as caught:
        core.result(unsent, MsgType.PRODUCE)
    assert type(caught.value) is shmq.BrokerUnavailable


def test_a_lost_socket_and_a_close_end_it_too():
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.PING)
    assert core.connection_lost(ConnectionResetError(104, "Connection reset by peer")) == [msg_id]
    with pytest.raises(shmq.OutcomeUnknown, match=r"^lost the connection to .*: \[Errno 104\] Connection reset"):
        core.result(msg_id)
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.PING)
    assert core.close() == [msg_id]
    with pytest.raises(shmq.OutcomeUnknown, match=f"^connection to {ENDPOINT} is closed \\(the request was sent: "):
        core.result(msg_id)
    with pytest.raises(shmq.BrokerUnavailable, match=f"^connection to {ENDPOINT} is closed$"):
        core.send(MsgType.PING)


def test_bytes_that_are_not_frames_end_the_connection_with_a_protocol_error():
    core = ClientCore(ENDPOINT)
    core.send(MsgType.PING)
    assert core.receive_data(encode_reply(MsgType.PING, 1)) == [1]
    msg_id, _ = core.send(MsgType.PING)
    assert core.receive_data(b"\x00" * 16) == [msg_id]
    for attempt in (lambda: core.result(msg_id), lambda: core.send(MsgType.PING)):
        with pytest.raises(shmq.ProtocolError, match="^bad magic 0x00000000") as caught:
            attempt()
        assert caught.value.status == Status.BAD_FRAME


def test_a_forgotten_request_keeps_no_reply():
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.CONSUME, {"queue": "q"})
    core.forget(msg_id)
    assert core.receive_data(encode_reply(MsgType.CONSUME, msg_id, {"messages": []})) == []
    assert core._replies == {} and not core.done(msg_id)


def frames(data):
    decoder = FrameDecoder()
    decoder.feed(data)
    return [(f.type, f.payload) for f in decoder.frames()]


CONSUMED = {"messages": [{**MESSAGE, "delivery": 5}, {**MESSAGE, "id": 5, "delivery": 6}]}


@pytest.mark.parametrize("late", [True, False], ids=["answered after", "answered before"])
def test_the_messages_a_forgotten_consume_leased_are_given_back(late):
    core = ClientCore(ENDPOINT)
    fields = {"queue": "q", "max": 2, "wait_ms": 5000}
    msg_id, _ = core.send(MsgType.CONSUME, fields)
    if late:
        core.forget(msg_id, MsgType.CONSUME, fields)
    assert core.receive_data(encode_reply(MsgType.CONSUME, msg_id, CONSUMED)) == ([] if late else [msg_id])
    if not late:
        core.forget(msg_id, MsgType.CONSUME, fields)
    assert core._replies == {} and core._abandoned == {}
    nack = core.outgoing()
    assert frames(nack) == [(MsgType.NACK, {"queue": "q", "deliveries": [5, 6], "unseen": True})]
    assert core.outgoing() == b""
    core.receive_data(encode_error(MsgType.NACK, decode(nack).msg_id, Status.NO_SUCH_QUEUE, "no such queue"))
    core.send(MsgType.PING)  # the give-back's error is nobody's to raise (its queue went: nothing to give back)


def test_a_forgotten_subscribe_is_cancelled_and_a_forgotten_join_leaves():
    core = ClientCore(ENDPOINT)
    sub_id, _ = core.send(MsgType.SUBSCRIBE, {"queue": "q", "prefetch": 4})
    join_id, _ = core.send(MsgType.JOIN, {"stream": "s", "group": "g"})
    empty_id, _ = core.send(MsgType.CONSUME, {"queue": "q"})
    ping_id, _ = core.send(MsgType.PING)
    core.forget(sub_id, MsgType.SUBSCRIBE, {"queue": "q", "prefetch": 4})
    core.forget(join_id, MsgType.JOIN, {"stream": "s", "group": "g"})
    core.forget(empty_id, MsgType.CONSUME, {"queue": "q"})
    core.forget(ping_id, MsgType.PING, {})
    pushed = encode_reply(PushType.DELIVER, 0, {"subscription": 3, "messages": [MESSAGE]})
    assert core.receive_data(encode_reply(MsgType.SUBSCRIBE, sub_id, {"subscription": 3}) + pushed
                             + encode_reply(MsgType.JOIN, join_id, {"member": 9, "partitions": [0]})
                             + encode_reply(MsgType.CONSUME, empty_id, {"messages": []})
                             + encode_reply(MsgType.PING, ping_id)) == []
    assert frames(core.outgoing()) == [(MsgType.CANCEL, {"subscription": 3, "delivered": 0}),
                                       (MsgType.LEAVE, {"stream": "s", "member": 9})]
    assert core._pushes == {} and core._replies == {}


def test_the_hello_header_ends_in_cr_lf_so_a_line_reading_peer_answers_at_once():
    core = ClientCore(ENDPOINT)
    msg_id, data = core.send(MsgType.HELLO, {"client": "x"})
    assert (msg_id, data[14:16]) == (0x0D0A, b"\r\n")
    assert core.send(MsgType.PING)[0] == 1


def test_a_peer_that_answers_no_frame_is_no_shmq_server():
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.HELLO, {"client": "x"})
    core.receive_data(b"HTTP/1.0 400 ")
    assert core.receive_data(b"Bad request syntax\r\n") == [msg_id]
    with pytest.raises(shmq.ProtocolError, match=rf"^{ENDPOINT} is not an shmq server: it answered "
                                                 r"b'HTTP/1.0 400 Bad request syntax\\r\\n' \(bad magic 0x48545450"):
        core.result(msg_id)


def test_in_a_child_of_fork_the_parents_connection_ends_and_keeps_its_first_owner():
    core = ClientCore(ENDPOINT)
    core.send(MsgType.PING)
    core.post(MsgType.PRODUCE, {"queue": "q", "body": b"x"})
    core.forked(100)
    core.forked(200)  # a grandchild, its parent having used nothing of it
    assert core.forked_from == 100
    for _ in range(2):  # the parent's unanswered put is not this process's to raise
        with pytest.raises(shmq.BrokerUnavailable, match=f"^the connection to {ENDPOINT} is process 100's, of which "
                                                         "this process is a fork: what was bound to it stays that "
                                                         "process's$") as caught:
            core.send(MsgType.PING)
        assert type(caught.value) is shmq.BrokerUnavailable


def test_a_request_past_its_time_ends_the_connection_with_broker_unavailable():
    core = ClientCore(ENDPOINT)
    msg_id, _ = core.send(MsgType.PING)
    assert core.timed_out(MsgType.PING, 1.5) == [msg_id]
    message = f"^no reply to PING from {ENDPOINT} within 1.5s; the connection is dropped"
    with pytest.raises(shmq.OutcomeUnknown, match=message + r" \(the PING was sent: whether it was carried out "):
        core.result(msg_id, MsgType.PING)
    with pytest.raises(shmq.BrokerUnavailable, match=message + "$"):
        core.send(MsgType.PING)
    core = ClientCore(ENDPOINT)
    hello, _ = core.send(MsgType.HELLO, {"client": "x"})
    core.timed_out(MsgType.HELLO, 10)
    for attempt in (lambda: core.result(hello, MsgType.HELLO), lambda: core.send(MsgType.PING)):  # a failed connect, no more
        with pytest.raises(shmq.BrokerUnavailable, match=f"^no reply to HELLO from {ENDPOINT} within 10s: is it an "
                                                         "shmq server\\?$") as caught:
            attempt()
        assert type(caught.value) is shmq.BrokerUnavailable


# ---------------------------------------------------------------- policies
def test_put_retries_a_full_queue_with_doubling_pauses_until_its_timeout():
    b = Loopback(refusing(Status.QUEUE_FULL, "queue 'q' is full"))
    with pytest.raises(shmq.QueueFull, match="^queue 'q' is full$"):
        RemoteQueue(b, "q").put(b"x", timeout=0.05)
    assert b.pauses == pytest.approx([0.0005, 0.001, 0.002, 0.004, 0.008, 0.016])  # a 7th would end past 0.05
    assert [f.type for _, f in b.sent] == [MsgType.PRODUCE] * 7
    assert b.now == pytest.approx(1000.0315)


def test_without_a_timeout_put_retries_until_there_is_room_pausing_at_most_the_cap():
    def full_ten_times(b, f):
        if len(b.sent) <= 10:
            return encode_error(f.type, f.msg_id, Status.QUEUE_FULL, "full")
        return encode_reply(f.type, f.msg_id, {"ids": [1, 2]})

    b = Loopback(full_ten_times)
    assert RemoteQueue(b, "q").put_many([b"a", b"b"]) == [1, 2]
    first, cap = PUT_RETRY_S
    assert b.pauses == pytest.approx([first * 2**i for i in range(7)] + [cap] * 3)


def test_put_nowait_and_a_zero_timeout_do_not_retry():
    b = Loopback(refusing(Status.QUEUE_FULL, "full"))
    with pytest.raises(shmq.QueueFull):
        RemoteQueue(b, "q").put_nowait(b"x")
    with pytest.raises(shmq.QueueFull):
        RemoteQueue(b, "q").put_many([b"x"], timeout=0)
    assert (len(b.sent), b.pauses) == (2, [])


def consume_waiting(b, f):
    """An empty queue: the server waits out wait_ms, then answers no messages."""
    b.now += f.payload["wait_ms"] / 1000
    return encode_reply(f.type, f.msg_id, {"messages": []})


def test_a_blocking_get_waits_in_slices_until_its_timeout():
    b = Loopback(consume_waiting)
    with pytest.raises(shmq.QueueEmpty, match="^queue 'q' is empty$"):
        RemoteQueue(b, "q").get(timeout=12)
    assert [f.payload["wait_ms"] for _, f in b.sent] == [5000, 5000, 2000]
    b.sent.clear()
    with pytest.raises(shmq.QueueEmpty):
        RemoteQueue(b, "q").get_many(5, timeout=0)
    assert [f.payload["wait_ms"] for _, f in b.sent] == [0]


def test_without_a_timeout_a_get_waits_slice_after_slice():
    def empty_three_times(b, f):
        if len(b.sent) <= 3:
            return consume_waiting(b, f)
        return encode_reply(f.type, f.msg_id, {"messages": [MESSAGE]})

    b = Loopback(empty_three_times)
    assert RemoteQueue(b, "q").get().id == 4
    assert [f.payload["wait_ms"] for _, f in b.sent] == [CONSUME_SLICE_MS] * 4 and b.pauses == []


# ---------------------------------------------------------------- checks before a byte is sent
def test_ack_many_takes_only_deliveries_of_its_queue_on_its_connection():
    b, other = Loopback(), Loopback()
    a, q = RemoteQueue(b, "a"), RemoteQueue(b, "q")
    mine = RemoteDelivery(q, MESSAGE)
    text = r"^expected deliveries of queue 'q', got <RemoteDelivery \w#4 attempt=2 1B>$"
    for stranger in (RemoteDelivery(a, MESSAGE), RemoteDelivery(RemoteQueue(other, "q"), MESSAGE)):
        with pytest.raises(TypeError, match=text):
            q.ack_many([mine, stranger])
    with pytest.raises(TypeError, match="^expected deliveries of queue 'q', got 17$"):
        q.ack_many([17])
    assert q.ack_many([]) == 0
    assert b.sent == [] and other.sent == []


def test_bad_arguments_fail_as_the_local_engine_fails_before_a_byte_is_sent():
    b = Loopback()
    q = RemoteQueue(b, "q")
    d = RemoteDelivery(q, MESSAGE)
    cases = [
        (lambda: q.put("text"), TypeError, "message body must be bytes-like, not str"),
        (lambda: q.put(b"x", headers={"a": [1]}), TypeError, "header 'a': values must be"),
        (lambda: q.put(b"x", timeout=-1), ValueError, "timeout must be >= 0, not -1"),
        (lambda: q.put_many([b"x", ("y", None)]), TypeError, "put_many items are bodies, not tuples"),
        (lambda: q.put_many([b"x", "y"]), TypeError, "message body must be bytes-like"),
        (lambda: q.get(timeout="soon"), TypeError, "timeout must be a number of seconds, not str"),
        (lambda: q.get_many(0), ValueError, "max_messages must be a positive int, not 0"),
        (lambda: q.get(visibility_timeout=float("nan")), ValueError, "visibility_timeout must be >= 0"),
        (lambda: d.nack(delay=-1), ValueError, "delay must be >= 0, not -1"),
        (lambda: d.extend(True), TypeError, "seconds must be a number of seconds, not bool"),
    ]
    for call, cls, text in cases:
        with pytest.raises(cls, match=f"^{text}"):
            call()
    assert b.sent == []
