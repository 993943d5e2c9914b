"""The ``shmq`` command line's work-queue options end to end (issue 13): create with
priorities, TTL, dedup window and retry policy; produce with priority, delay, ttl, group
and dedup id; peek; redrive; ``stats`` showing the new numbers; bad values in one line."""

import json
import re

import pytest

from tests.test_cli import shmq_cli, target  # noqa: F401  (a fixture)


def _rows(stdout):
    lines = stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    body = lines[1:lines.index("")] if "" in lines else lines[1:]
    return header, {cells[0]: dict(zip(header, cells)) for cells in (re.split(r"\s{2,}", line) for line in body)}


def test_create_with_the_work_queue_options(target, broker):
    r = shmq_cli("create", "jobs", "--priorities", "3", "--message-ttl", "60", "--dedup-window", "10",
                 "--retry-delay", "0.5", "--retry-backoff", "2", "--retry-delay-max", "5", "--priority-aging", "0",
                 *target)
    assert (r.returncode, r.stdout, r.stderr) == (0, "created jobs\n", "")
    s = broker.queue("jobs").settings()
    assert {k: s[k] for k in ("priorities", "message_ttl", "dedup_window", "retry_delay", "retry_backoff",
                              "retry_delay_max", "priority_aging")} == {
        "priorities": 3, "message_ttl": 60, "dedup_window": 10, "retry_delay": 0.5, "retry_backoff": 2,
        "retry_delay_max": 5, "priority_aging": None}  # --priority-aging 0: strict
    shmq_cli("create", "plain", *target)
    s = broker.queue("plain").settings()
    assert (s["priorities"], s["message_ttl"], s["dedup_window"], s["priority_aging"]) == (1, None, 300, 60)


def test_produce_options_peek_and_stats(target, broker):
    shmq_cli("create", "jobs", "--priorities", "3", "--priority-aging", "0", *target)
    assert shmq_cli("produce", "jobs", "-m", "low", *target).returncode == 0
    r = shmq_cli("produce", "jobs", "--priority", "2", "-m", "high", "-m", "high too", "--json", *target)
    assert json.loads(r.stdout) == {"queue": "jobs", "ids": [2, 3]}
    r = shmq_cli("produce", "jobs", "--group", "g", "--dedup-id", "order-7", "--ttl", "3600", "-m", "once", "--json",
                 *target)
    assert json.loads(r.stdout)["ids"] == [4]
    r = shmq_cli("produce", "jobs", "--dedup-id", "order-7", "-m", "twice", "--json", *target)
    assert json.loads(r.stdout)["ids"] == [4]  # deduplicated: the first put's id
    assert shmq_cli("produce", "jobs", "--delay", "3600", "-m", "later", *target).returncode == 0

    r = shmq_cli("peek", "jobs", "-n", "3", *target)
    assert (r.returncode, r.stdout) == (0, "high\nhigh too\nlow\n")
    peeked = [json.loads(line) for line in shmq_cli("peek", "jobs", "--json", *target).stdout.splitlines()]
    assert [(m["id"], m["body"], m["priority"], m["group"], m["attempt"]) for m in peeked] == [
        (2, "high", 2, None, 0), (3, "high too", 2, None, 0), (1, "low", 0, None, 0), (4, "once", 0, "g", 0)]
    assert all(isinstance(m["enqueued_at"], float) for m in peeked)
    s = broker.queue("jobs").stats()
    assert (s.ready, s.delayed, s.ready_by_priority) == (4, 1, (2, 0, 2))  # peek took nothing

    r = shmq_cli("stats", *target)
    header, rows = _rows(r.stdout)
    assert header[:3] == ["queue", "ready", "by priority"]  # shown: a queue has levels
    assert rows["jobs"]["by priority"] == "2:2 1:0 0:2" and rows["jobs"]["delayed"] == "1"
    assert "expired" not in header  # nothing expired: no column
    stats = json.loads(shmq_cli("stats", "jobs", "--json", *target).stdout)["queues"]["jobs"]
    assert (stats["ready_by_priority"], stats["expired_total"], stats["dead_letter_depth"]) == ([2, 0, 2], 0, None)


def test_stats_without_levels_or_expiry_keeps_its_columns(target, broker):
    broker.create_queue("q").put(b"x")
    header, _rows_ = _rows(shmq_cli("stats", *target).stdout)
    assert "by priority" not in header and "expired" not in header


def test_redrive(target, broker):
    broker.create_queue("dead")
    broker.create_queue("other")
    q = broker.create_queue("q", dead_letter_queue="dead")
    q.put_many([b"1", b"2", b"3"])
    for d in q.get_many(3):
        d.reject()
    r = shmq_cli("redrive", "dead", "-n", "2", *target)
    assert (r.returncode, r.stdout) == (0, "redrove 2 message(s) from dead\n")
    r = shmq_cli("redrive", "dead", "--to", "other", "--json", *target)
    assert json.loads(r.stdout) == {"queue": "dead", "redriven": 1}
    assert (q.stats().ready, broker.queue("other").stats().ready, broker.queue("dead").stats().ready) == (2, 1, 0)


@pytest.mark.parametrize("args, message", [
    (["produce", "q", "--priority", "7", "-m", "x"], "shmq: error: queue 'q' has no priority levels"),
    (["produce", "q", "--ttl", "0", "-m", "x"], "shmq: error: ttl must be > 0 seconds"),
    (["produce", "q", "--delay", "-1", "-m", "x"], "shmq: error: delay must be >= 0"),
    (["produce", "q", "--group", "", "-m", "x"], "shmq: error: group must be 1 to 255 bytes"),
    (["produce", "q", "--dedup-id", "d", "-m", "x", "-m", "y"], "shmq: error: --dedup-id names one message, not 2"),
    (["create", "x", "--priorities", "0"], "shmq: error: priorities must be an int in 1..16, not 0"),
    (["create", "x", "--message-ttl", "-1"], "shmq: error: message_ttl must be > 0 seconds"),
    (["create", "x", "--retry-backoff", "0.5"], "shmq: error: retry_backoff must be a number in 1..1000"),
    (["peek", "q", "-n", "0"], "shmq: error: max_messages must be a positive int, not 0"),
    (["peek", "missing"], "shmq: error: no queue 'missing'"),
    (["redrive", "missing"], "shmq: error: no queue 'missing'"),
])
def test_bad_values_are_one_line_errors(target, broker, args, message):
    broker.create_queue("q")
    r = shmq_cli(*args, *target)
    assert r.returncode == 1
    assert r.stderr.startswith(message), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert broker.queue("q").stats().enqueued_total == 0 and "x" not in broker.list_queues()
