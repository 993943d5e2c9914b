"""shmq's kombu transport (shmq/kombu/) through kombu's own API, on a local attach and over
TCP: queue arguments, message expiration, redelivery, dead-letter queues made at the first
dead letter, auto-delete queues and their consumers, a consumed queue deleted under its
consumer, and a connection closed after its program deleted a queue."""

import base64
import json
import os
import signal
import subprocess
import sys

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

import shmq.kombu  # noqa: F401  registers the transport
from tests._wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_queue_arguments_become_the_queues_settings(broker, url):
    with Connection(url) as c:
        ch = c.channel()
        Queue("pq", max_priority=10, message_ttl=5, expires=60)(ch).declare()
        with c.SimpleQueue("sq", queue_opts={"max_priority": 3}) as sq:
            sq.put({"n": 1})
        Queue("parked")(ch).declare()
        Queue("dl", queue_arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "parked"})(ch).declare()
        Queue("eq", queue_arguments={"x-queue-mode": "lazy", "x-queue-type": "classic"})(ch).declare()
    pq = broker.queue("pq").settings()
    assert (pq["priorities"], pq["message_ttl"], pq["expires"], pq["auto_delete"]) == (11, 5.0, 60.0, False)
    assert broker.queue("sq").settings()["priorities"] == 4
    assert broker.queue("dl").settings()["dead_letter_queue"] == "parked"
    assert broker.queue("eq").settings()["priorities"] == 1
    # a dead-letter queue is made at the first dead letter (none yet); "parked" is the one asked for
    assert broker.list_queues() == ["dl", "eq", "parked", "pq", "sq"]


@pytest.mark.parametrize("arguments, error", [
    ({"x-max-length": 5}, r"x-max-length=5 is not supported by the shmq transport: a shmq queue is bounded in bytes"),
    ({"x-max-length-bytes": 2**20}, r"x-max-length-bytes=1048576 is not supported .* never drops its oldest"),
    ({"x-dead-letter-exchange": "dlx"}, r"x-dead-letter-exchange='dlx' is not supported .* not through an exchange"),
    ({"x-dead-letter-exchange": ""}, r"x-dead-letter-exchange='' is not supported .* x-dead-letter-routing-key=QUEUE"),
    ({"x-queue-type": "quorum"}, r"x-queue-type='quorum': not supported by the shmq transport"),
    ({"x-max-priority": 20}, r"x-max-priority=20: a shmq queue has 1 to 16 priority levels"),
    ({"x-message-ttl": 0}, r"x-message-ttl=0: milliseconds, more than 0"),
    ({"x-custom": 1}, r"x-custom=1 is not supported .* shmq knows x-expires, x-max-priority"),
])
def test_queue_arguments_shmq_cannot_honour_are_refused(broker, url, arguments, error):
    with Connection(url) as c, pytest.raises(ValueError, match=error):
        Queue("refused", queue_arguments=arguments)(c.channel()).declare()
    assert broker.list_queues() == []


def test_a_messages_expiration_is_its_ttl(broker, url):
    with Connection(url) as c, c.SimpleQueue("ttl") as q:
        q.put({"n": "brief"}, expiration=0.05)  # kombu: seconds, as AMQP's "expiration" property in ms
        q.put({"n": "kept"})
        raw = broker.queue("ttl")
        wait_for(lambda: raw.stats().oldest_ready_age_s > 0.1, 10, "the first message past its ttl")
        m = q.get(timeout=5)
        assert m.payload == {"n": "kept"}
        m.ack()
        assert raw.stats().expired_total == 1


def test_a_message_delivered_again_says_redelivered(broker, url):
    with Connection(url) as c, c.SimpleQueue("again") as q:
        q.put({"n": 1})
        first = q.get(timeout=5)
        assert first.delivery_info["redelivered"] is False
        first.requeue()  # reject(requeue=True)
        second = q.get(timeout=5)
        assert second.delivery_info["redelivered"] is True
        second.ack()
        q.put({"n": 2})
        d = broker.queue("again").get(timeout=5)  # a consumer elsewhere that gives it back (as a lease that lapsed)
        d.nack()
        third = q.get(timeout=5)
        assert (third.payload, third.delivery_info["redelivered"]) == ({"n": 2}, True)
        third.ack()
    s = broker.queue("again").stats()
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 2, 2)


def test_close_after_deleting_a_queue_holding_an_unacked_message(broker, url):
    """kombu's memory-transport test: a message taken and not acked, its queue deleted and
    declared again; closing the connection settles nothing of the queue gone, and raises
    nothing."""
    c = Connection(url)
    ch = c.channel()
    ex = Exchange("ex_memory")
    q = Queue("held", exchange=ex, routing_key="held")
    producer = Producer(ch, ex)
    q(ch).declare()
    for i in range(3):
        producer.publish({"foo": i}, routing_key="held")
    assert q(ch).get().payload == {"foo": 0}  # unacked
    q(ch).delete()
    q(ch).declare()
    assert q(ch).get() is None
    c.close()
    assert broker.queue("held").stats().ready == 0


def test_the_dead_letter_queue_is_made_at_the_first_dead_letter(broker, url):
    with Connection(url) as c, c.SimpleQueue("work") as q:
        q.put({"n": 1})
        q.put({"n": 2})
        assert broker.list_queues() == ["work"]
        q.get(timeout=5).reject()  # reject(requeue=False): dead-lettered
        assert broker.list_queues() == ["work", "work.dlq"]
        assert broker.queue("work").settings()["dead_letter_queue"] == "work.dlq"
        q.get(timeout=5).reject()
    dlq = broker.queue("work.dlq")
    dead = [dlq.get(timeout=5) for _ in range(2)]
    assert [base64.b64decode(json.loads(d.body)["body"]) for d in dead] == [b'{"n": 1}', b'{"n": 2}']
    dlq.ack_many(dead)
    s = broker.queue("work").stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total) == (0, 0, 2)


def test_with_max_deliveries_the_dead_letter_queue_is_made_at_the_declare(broker, url):
    """The engine dead-letters a message delivered ``max_deliveries`` times by itself: its
    dead-letter queue must be there already."""
    with Connection(url, transport_options={"max_deliveries": 2}) as c, c.SimpleQueue("capped") as q:
        assert broker.list_queues() == ["capped", "capped.dlq"]
        q.put({"n": 1})
        q.get(timeout=5).requeue()
        q.get(timeout=5).requeue()  # its second delivery: dead-lettered
        wait_for(lambda: broker.queue("capped.dlq").stats().ready == 1, 10, "the message dead-lettered")
    assert broker.queue("capped").stats().dead_lettered_total == 1


def test_no_dead_letter_queue_when_the_option_says_none(broker, url):
    with Connection(url, transport_options={"dead_letter_queue": None}) as c, c.SimpleQueue("plain") as q:
        q.put({"n": 1})
        q.get(timeout=5).reject()
    assert broker.list_queues() == ["plain"]
    assert broker.queue("plain").stats().ready == 0


def _consume(c, name, **queue_options):
    """A consumer of queue ``name`` on connection ``c`` (declared), consuming."""
    consumer = Consumer(c.channel(), [Queue(name, **queue_options)], callbacks=[lambda body, m: m.ack()])
    consumer.consume()
    return consumer


def test_an_auto_delete_queue_goes_with_its_last_consumer(broker, url):
    """RabbitMQ's rule: not when one of its consumers goes, nor when its declarer does."""
    with Connection(url) as one, Connection(url) as two:
        a = _consume(one, "shared", auto_delete=True)
        b = _consume(two, "shared", auto_delete=True)
        assert broker.queue("shared").stats().consumers == 2
        a.cancel()
        assert broker.list_queues() == ["shared"]
        assert broker.queue("shared").stats().consumers == 1
        one.close()  # the connection that declared it first
        assert broker.list_queues() == ["shared"]
        b.cancel()
        assert broker.list_queues() == []


def test_an_auto_delete_queue_goes_when_its_consumers_process_exits(broker, url):
    """A process that exits consuming (as an rpc:// client does, never cancelling) takes its
    consumer along; one SIGKILLed does too (the engine reaps it; over TCP its connection
    closes)."""
    script = ("import sys, shmq.kombu; from kombu import Connection, Consumer, Queue\n"
              "c = Connection(sys.argv[1]); q = Queue(sys.argv[2], auto_delete=True)\n"
              "Consumer(c.channel(), [q], callbacks=[lambda b, m: m.ack()]).consume()\n"
              "print('consuming', flush=True)\n"
              "if sys.argv[3] == 'wait': sys.stdin.read()\n")
    done = subprocess.run([sys.executable, "-c", script, url, "replies", "exit"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stdout == "consuming\n", done.stderr
    wait_for(lambda: broker.list_queues() == [], 30, "the exited consumer's queue gone")
    p = subprocess.Popen([sys.executable, "-c", script, url, "killed", "wait"], cwd=ROOT, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "consuming\n"
        assert broker.queue("killed").stats().consumers == 1
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
        p.stdin.close()
        p.stdout.close()
    wait_for(lambda: _swept(broker) == [], 30, "the killed consumer's queue gone")


def _swept(broker):
    """The namespace's queues, after a declare (which sweeps unused auto-delete queues
    locally, at most once a second; a server sweeps by itself)."""
    broker.declare_queue("sweeper").close()
    broker.delete_queue("sweeper")
    return broker.list_queues()


@pytest.mark.parametrize("loop", ["drain", "event-loop"])
def test_a_consumed_queue_deleted_under_its_consumer_is_declared_again(broker, url, loop):
    """Deleted by someone else (``shmq delete``), the queue is declared again by its consumer
    as it was (settings, binding), which goes on receiving what is published to it."""
    from kombu.asynchronous import Hub

    got = []
    with Connection(url) as c:
        hub = None
        if loop == "event-loop":
            hub = Hub()
            c.transport.register_with_event_loop(c.connection, hub)
        ex = Exchange("topic_ex", type="topic")
        q = Queue("watched", exchange=ex, routing_key="a.*", max_priority=4)
        consumer = Consumer(c.channel(), [q], callbacks=[lambda body, m: (got.append(body), m.ack())])
        consumer.consume()
        producer = Producer(c.channel(), ex)

        def turn():
            if hub is None:
                try:
                    c.drain_events(timeout=0.05)
                except TimeoutError:
                    pass
            else:
                hub.run_once()  # (its poll waits for the loop's pipe, its timers, at most 1 s)

        producer.publish({"n": 1}, routing_key="a.b")
        wait_for(lambda: turn() or got == [{"n": 1}], 10, "the first message")
        broker.delete_queue("watched")
        assert "watched" not in broker.list_queues()
        wait_for(lambda: turn() or "watched" in broker.list_queues(), 10, "the queue declared again")
        assert broker.queue("watched").settings()["priorities"] == 5
        assert broker.queue("watched").stats().consumers == 1
        producer.publish({"n": 2}, routing_key="a.c")  # through its binding, made again
        wait_for(lambda: turn() or got == [{"n": 1}, {"n": 2}], 10, "the message after")
        consumer.cancel()
        if hub is not None:
            c.transport._loop.close()
            c.transport._loop = None
            hub.close()
    broker.delete_exchange("topic_ex")


def test_x_expires_deletes_a_queue_unused_that_long(broker, url):
    """Celery's event and reply queues (``event_queue_expires``, ``control_queue_expires``):
    a queue with no consumer goes ``expires`` seconds after its last use; one consumed
    stays."""
    with Connection(url) as c:
        consumer = _consume(c, "consumed", expires=0.2)
        Queue("unused", expires=0.2)(c.channel()).declare()
        assert broker.queue("unused").settings()["expires"] == 0.2
        wait_for(lambda: "unused" not in _swept(broker), 30, "the unused queue expired")
        assert "consumed" in broker.list_queues()
        consumer.cancel()
        wait_for(lambda: "consumed" not in _swept(broker), 30, "the queue expired once its consumer went")


def test_a_passive_declare_only_looks(broker, url):
    from kombu.exceptions import ChannelError

    with Connection(url) as c:
        ch = c.channel()
        Queue("there", max_priority=3)(ch).declare()
        assert Queue("there")(ch).queue_declare(passive=True).queue == "there"
        assert broker.queue("there").settings()["priorities"] == 4  # not declared again with 1 level
        with pytest.raises(ChannelError, match="NOT_FOUND - no queue 'absent'"):
            Queue("absent")(ch).queue_declare(passive=True)
    assert broker.list_queues() == ["there"]
