"""The job runners' consumers over TCP outlive a routine server restart (issue 69, item 5):
a real ``shmq server`` SIGKILLed and started again OUTAGE_S later on the same port and
data dir, under kombu's own consumer (a ``drain_events`` loop) and the real ``celery
worker`` (its event loop), and under the real ``dramatiq`` worker, with the default
options (the client's ``max_outage``). Every job is done, every message delivered, at
least once (what was held at the kill comes again: duplicates are allowed), none lost;
the runners never see the outage as a connection error (no reconnect of their own,
which logs every try), and the client logs it once: a WARNING when it starts riding it
out, an INFO when it is back."""

import socket
import threading
import time

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

import shmq
import shmq.kombu  # noqa: F401  registers shmq://
from shmq.auth import default_token_file, read_token
from shmq.dramatiq import ShmqBroker
from tests._wait import wait_for
from tests.jobs.test_celery import Jobs
from tests.jobs.test_dramatiq import QUEUE, app_env, count, send, workers  # noqa: F401  (a fixture)
from tests.test_client_outage import OUTAGE_S, outages_logged, restartable  # noqa: F401  (a fixture)
from tests.test_client_resume import kill

N = 40  # jobs, and messages, each side of the outage


def client_lines(text: str, endpoint: str) -> tuple[int, int]:
    """(WARNINGs that an outage is ridden out, INFOs that the connection is back) in a
    worker's output (in Celery's format or Dramatiq's)."""
    lines = text.splitlines()
    lost = sum(1 for x in lines if "WARNING" in x and f"lost the connection to {endpoint}" in x and "reconnecting" in x)
    back = sum(1 for x in lines if "INFO" in x and f"reconnected to {endpoint} after " in x)
    return lost, back


class Drain:
    """kombu's own consumer of queue "drain" in a thread: a Consumer and a
    ``drain_events(timeout=1)`` loop, as programs write it; each message kept and acked."""

    def __init__(self, url, want):
        self.conn = Connection(url)
        self.got, self.failures, self.want = [], [], set(want)
        self.consumer = Consumer(self.conn, [Queue("drain", Exchange("drain"), "drain")], callbacks=[self.on_message])
        self.consumer.consume()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def on_message(self, body, message):
        self.got.append(body)
        message.ack()

    def run(self):
        try:
            while not set(self.got) >= self.want:
                try:
                    self.conn.drain_events(timeout=1)
                except socket.timeout:
                    pass
        except BaseException as e:  # noqa: BLE001 - the test says what it was
            self.failures.append(e)

    def close(self):
        self.thread.join(30)
        self.conn.close()


@pytest.mark.slow
def test_kombu_consumers_outlive_a_server_restart(broker, restartable, tmp_path, caplog):  # noqa: F811
    caplog.set_level("INFO", logger="shmq.client")
    srv = restartable()
    url = f"shmq://:{read_token(default_token_file())}@127.0.0.1:{srv.port}"
    endpoint = f"127.0.0.1:{srv.port}"
    jobs = Jobs(broker.namespace, tmp_path, broker_url=url, JOBS_CLIENT_LOG="1")
    app = jobs.app()
    drained = [f"d{i}" for i in range(2 * N)]
    done = [f"j{i}" for i in range(2 * N)]

    def publish(first, last):
        with Connection(url) as c:
            producer = Producer(c)
            for body in drained[first:last]:
                producer.publish(body, exchange=Exchange("drain"), routing_key="drain",
                                 declare=[Queue("drain", Exchange("drain"), "drain")])
        for job in done[first:last]:
            app.send_task("tests.jobs.celery_app.record", (job,))

    drain = None
    try:
        w = jobs.worker(concurrency=2)
        publish(0, N)
        drain = Drain(url, drained)
        wait_for(lambda: (len(drain.got) >= N // 2 and len(jobs.count("done")) >= N // 2) or drain.failures, 60,
                 "both consumers to get some")
        assert not drain.failures, drain.failures
        kill(srv)
        time.sleep(OUTAGE_S)  # the outage itself, by design
        srv = restartable()
        publish(N, 2 * N)
        wait_for(lambda: set(drain.got) >= set(drained) or drain.failures, 60, "every message drained")
        assert not drain.failures, drain.failures
        wait_for(lambda: set(jobs.count("done")) >= set(done), 60, "every job done")
        wait_for(lambda: broker.queue("celery").stats().in_flight == 0, 30, "every job acked")
        assert w.poll() is None, jobs.output()
        jobs.stop(w)
        assert w.returncode == 0, jobs.output()
        out = jobs.output()
        assert "Connection to broker lost" not in out and "Cannot connect" not in out, out[-3000:]  # Celery's own
        assert client_lines(out, endpoint) == (1, 1), out[-3000:]
        assert outages_logged(caplog, endpoint) == (1, 1)  # the drain loop's handle
        assert set(drain.got) == set(drained)  # every one, none lost (some may come twice)
        assert set(jobs.count("done")) == set(done)
        s = broker.queue("drain").stats()
        assert (s.ready, s.in_flight) == (0, 0)
        app.close()
    finally:
        if drain is not None:
            drain.close()
        jobs.close()
    assert srv.stop() == 0


@pytest.mark.slow
def test_a_dramatiq_worker_outlives_a_server_restart(namespace, restartable, workers, tmp_path):  # noqa: F811
    srv = restartable()
    endpoint = f"127.0.0.1:{srv.port}"
    log = tmp_path / "jobs.log"
    want = [f"j{i}" for i in range(2 * N)]
    producer = ShmqBroker(srv.url)
    try:
        for job in want[:N]:
            send(producer, "work", job)
        w = workers(app_env(log, url=srv.url), processes=1, threads=2)
        wait_for(lambda: len(count(log, "done")) >= N // 2, 60, "the worker to do some")
        kill(srv)
        time.sleep(OUTAGE_S)  # the outage itself, by design
        srv = restartable()
        for job in want[N:]:
            send(producer, "work", job)
        wait_for(lambda: set(count(log, "done")) >= set(want), 60, "every job done")
        with shmq.connect(srv.url) as c:
            wait_for(lambda: (c.queue(QUEUE).stats().ready, c.queue(QUEUE).stats().in_flight) == (0, 0), 30,
                     "every job acked")
        assert w.proc.poll() is None, w.err.read_text()[-3000:]
        assert w.stop() == 0
        err = w.err.read_text()
        assert "connection error" not in err, err[-3000:]  # Dramatiq's restart of its consumer, every try
        assert client_lines(err, endpoint) == (1, 1), err[-3000:]
        assert set(count(log, "done")) == set(want)  # every one, none lost (some may run twice)
    finally:
        producer.close()
    assert srv.stop() == 0
