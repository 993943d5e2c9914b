"""``shmq dlq``: the dead-letter queues seen from the queues they serve, locally and over TCP."""

import json

import pytest

from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and TCP)


def _dead_letter(broker, n):
    q = broker.queue("jobs")
    for _ in range(n):
        q.get(timeout=5).reject()


def test_lists_the_links_shows_why_each_died_and_redrives(target, broker):  # noqa: F811
    broker.create_queue("jobs.dlq")
    broker.create_queue("jobs", dead_letter_queue="jobs.dlq", max_deliveries=3)
    broker.create_queue("plain")
    broker.queue("jobs").put_many([b"first", b"second", b"third"])
    _dead_letter(broker, 2)

    r = shmq_cli("dlq", *target)
    assert r.returncode == 0 and r.stdout.splitlines() == ["QUEUE  DEAD-LETTER QUEUE  DEAD LETTERS",
                                                           "jobs   jobs.dlq                      2"]
    assert json.loads(shmq_cli("dlq", "--json", *target).stdout) == [
        {"queue": "jobs", "dead_letter_queue": "jobs.dlq", "dead_letters": 2}]

    r = shmq_cli("dlq", "jobs", *target)
    assert r.returncode == 0 and r.stdout.splitlines() == ["DIED IN  REASON    DELIVERIES  ID  BODY",
                                                           "jobs     rejected           1   1  first",
                                                           "jobs     rejected           1   2  second"]
    letters = [json.loads(line) for line in shmq_cli("dlq", "jobs", "-n", "1", "--json", *target).stdout.splitlines()]
    assert [(m["body"], m["headers"]["x-death-reason"]) for m in letters] == [("first", "rejected")]

    r = shmq_cli("dlq", "jobs", "--redrive", *target)
    assert (r.returncode, r.stdout) == (0, "redrove 2 message(s) from jobs.dlq, each to the queue it died in\n")
    assert shmq_cli("dlq", "jobs", *target).stdout == "jobs.dlq: no dead letters\n"
    assert sorted(bytes(m.body) for m in broker.queue("jobs").peek(10)) == [b"first", b"second", b"third"]


@pytest.mark.parametrize("args, code, message", [
    (["dlq", "nope"], 1, "shmq: error: no queue 'nope'"),
    (["dlq", "plain"], 1, "shmq: error: queue 'plain' has no dead-letter queue"),
    (["dlq", "--redrive"], 2, "shmq: error: --redrive needs the QUEUE whose dead letters go back"),
])
def test_bad_requests_are_one_line(broker, args, code, message):
    broker.create_queue("plain")
    r = shmq_cli(*args, "--namespace", broker.namespace)
    assert r.returncode == code and r.stderr.startswith(message) and len(r.stderr.splitlines()) == 1
    assert r.stdout == ""


def test_no_links_at_all(broker):
    assert shmq_cli("dlq", "--namespace", broker.namespace).stdout == "no queue has a dead-letter queue\n"
