"""A create with ``exist_ok`` that finds the name taken returns what is there only if it
has the settings the create asks for (those given other than their defaults); else it
refuses, naming each setting that differs with both values, as RabbitMQ refuses a
queue_declare with other arguments. On both transports, and from the command line."""

import json

import pytest

import shmq
from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and tcp)

# every setting other than its default, some not as they are held (an unaligned size,
# seconds finer than a nanosecond, aging finer than a millisecond)
ALL_QUEUE = dict(max_bytes=100_000, max_message_bytes=1000, visibility_timeout=1 / 3, max_deliveries=2,
                 dead_letter_queue="dlq", durability="memory", priorities=3, message_ttl=1 / 7,
                 dedup_window=0.123456789123, retry_delay=0.3, retry_backoff=2, retry_delay_max=7 / 3,
                 priority_aging=0.0123456, lanes=3)
ALL_STREAM = dict(partitions=3, max_bytes=10_001, max_message_bytes=100_000, retention="block",
                  retention_bytes=1e6, retention_seconds=1 / 3, group_idle_timeout=2 / 3, durability="memory")


def test_exist_ok_takes_the_queue_there_when_it_has_the_settings_asked(any_broker, broker):
    any_broker.create_queue("dlq").close()
    any_broker.create_queue("q", **ALL_QUEUE).close()
    held = broker.queue("q").settings()
    for asked in (ALL_QUEUE, held, {}, {"visibility_timeout": 30.0, "lanes": 1}):  # the last: defaults, not compared
        any_broker.create_queue("q", exist_ok=True, **asked).close()
    assert broker.queue("q").settings() == held


def test_exist_ok_refuses_a_queue_of_other_settings_naming_each_with_both_values(any_broker, broker):
    any_broker.create_queue("dlq").close()
    any_broker.create_queue("jobs", visibility_timeout=30, max_deliveries=5).close()
    with pytest.raises(shmq.QueueExists) as e:
        any_broker.create_queue("jobs", exist_ok=True, visibility_timeout=60, max_deliveries=3)
    assert str(e.value) == (f"queue 'jobs' exists in namespace '{broker.namespace}' with other settings: "
                            "visibility_timeout 30.0 (asked 60.0), max_deliveries 5 (asked 3)")
    with pytest.raises(shmq.QueueExists, match=r"settings: max_bytes 67108864 \(asked 65536\), dead_letter_queue "
                                                r"None \(asked 'dlq'\), priority_aging 60.0 \(asked None\), "
                                                r"lanes 1 \(asked 2\)$"):
        any_broker.create_queue("jobs", exist_ok=True, max_bytes=65536, dead_letter_queue="dlq",
                                priority_aging=None, lanes=2)
    assert broker.queue("jobs").settings() == {**broker.queue("dlq").settings(), "max_deliveries": 5}  # as it was


def test_exist_ok_takes_the_stream_there_when_it_has_the_settings_asked(any_broker, broker):
    any_broker.create_stream("events", **ALL_STREAM).close()
    for asked in (ALL_STREAM, {}, {"partitions": 4, "retention": "drop"}):
        with any_broker.create_stream("events", exist_ok=True, **asked) as s:
            assert (s.partitions, s.max_bytes, s.retention) == (3, 10_008, "block")


def test_exist_ok_refuses_a_stream_of_other_settings_naming_each_with_both_values(any_broker, broker):
    any_broker.create_stream("events", partitions=3, max_bytes=1 << 16).close()
    with pytest.raises(shmq.StreamExists) as e:
        any_broker.create_stream("events", exist_ok=True, partitions=2, retention_seconds=60, durability="wal")
    assert str(e.value) == (f"stream 'events' exists in namespace '{broker.namespace}' with other settings: "
                            "partitions 3 (asked 2), retention_seconds None (asked 60.0), durability 'snapshot' "
                            "(asked 'wal')")
    with broker.stream("events") as s:
        assert (s.partitions, s.retention_seconds, s.durability) == (3, None, "snapshot")


def test_the_command_line_refuses_other_settings_in_one_line(target, broker):  # noqa: F811
    assert shmq_cli("create", "jobs", "--max-deliveries", "5", *target).returncode == 0
    assert shmq_cli("create", "jobs", "--exist-ok", "--max-deliveries", "5", *target).stdout == (
        "queue jobs exists (settings match)\n")
    r = shmq_cli("create", "jobs", "--exist-ok", "--visibility-timeout", "60", "--max-deliveries", "3", *target)
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"shmq: error: queue 'jobs' exists in namespace '{broker.namespace}' with other settings: "
               "visibility_timeout 30.0 (asked 60.0), max_deliveries 5 (asked 3)\n")
    assert shmq_cli("stream", "create", "events", "--partitions", "3", *target).returncode == 0
    r = shmq_cli("stream", "create", "events", "--exist-ok", "--partitions", "2", *target)
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"shmq: error: stream 'events' exists in namespace '{broker.namespace}' with other settings: "
               "partitions 3 (asked 2)\n")


def test_the_command_line_says_whether_exist_ok_created_or_found(target, broker):  # noqa: F811
    """--exist-ok on a queue or stream that is there says it exists, not that it was made;
    --json says which in ``created``."""
    assert shmq_cli("create", "jobs", "--exist-ok", *target).stdout == "created jobs\n"
    r = shmq_cli("create", "jobs", "--exist-ok", *target)
    assert (r.returncode, r.stdout, r.stderr) == (0, "queue jobs exists (settings match)\n", "")
    r = shmq_cli("create", "jobs", "--exist-ok", "--json", *target)
    assert (r.returncode, json.loads(r.stdout)) == (0, {"queue": "jobs", "created": False})
    r = shmq_cli("create", "other", "--json", *target)
    assert (r.returncode, json.loads(r.stdout)) == (0, {"queue": "other", "created": True})
    r = shmq_cli("create", "jobs", *target)  # without --exist-ok: refused, as before
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"shmq: error: queue 'jobs' already exists in namespace '{broker.namespace}'\n"
    assert shmq_cli("stream", "create", "events", "--exist-ok", "--partitions", "2", *target).stdout == (
        "created stream events (2 partitions)\n")
    r = shmq_cli("stream", "create", "events", "--exist-ok", *target)
    assert (r.returncode, r.stdout) == (0, "stream events (2 partitions) exists (settings match)\n")
    r = shmq_cli("stream", "create", "events", "--exist-ok", "--json", *target)
    assert json.loads(r.stdout) == {"stream": "events", "created": False, "partitions": 2}
