"""A live queue's settings changed (``update_queue``, ``declare_queue``, ``shmq queue set``):
every mutable one reaches the processes attached to it, the fixed ones are refused with
SettingsMismatch, on both transports; the change outlives a server restart."""

import asyncio
import json

import pytest

import shmq
from shmq import QueueNotFound, SettingsMismatch
from tests._observer import observers
from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and tcp)
from tests.test_server_tcp import ServerProcess, rebooted

CHANGED = {"visibility_timeout": 2.5, "max_deliveries": 3, "dead_letter_queue": "dead", "message_ttl": 60.0,
           "dedup_window": 5.0, "retry_delay": 1.5, "retry_backoff": 2.0, "retry_delay_max": 10.0,
           "priority_aging": 7.0}

# another process attached to the queue before the change: runs the commands it reads, says what it saw
OBSERVER = """
import json, sys, shmq
q = shmq.connect(namespace=sys.argv[1]).queue(sys.argv[2])
held = []
print("attached", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "settings":
        print(json.dumps(q.settings()), flush=True)
    elif cmd == "get":
        held.append(q.get(timeout=30))
        print(f"got attempt {held[-1].attempt}", flush=True)
    elif cmd == "nack":
        held.pop().nack()
        print("nacked", flush=True)
"""


observer = observers(OBSERVER)


def test_every_mutable_setting_reaches_another_process(broker, observer):
    broker.create_queue("dead")
    q = broker.create_queue("jobs", priorities=2)
    other = observer("jobs")
    before = json.loads(other.ask("settings"))
    after = broker.update_queue("jobs", **CHANGED)
    assert after == {**before, **CHANGED}
    assert json.loads(other.ask("settings")) == after
    assert q.settings() == after and q.visibility_timeout == 2.5  # this process's handles: at once
    assert broker.update_queue("jobs", max_deliveries=None, dead_letter_queue=None, message_ttl=None,
                               retry_delay_max=None, priority_aging=None) == {
        **after, "max_deliveries": None, "dead_letter_queue": None, "message_ttl": None, "retry_delay_max": None,
        "priority_aging": None}
    other.close()


def test_another_process_dead_letters_by_the_new_max_deliveries(broker, observer):
    broker.create_queue("dead")
    q = broker.create_queue("jobs")
    q.put(b"m")
    other = observer("jobs")
    assert other.ask("get") == "got attempt 1"
    broker.update_queue("jobs", max_deliveries=1, dead_letter_queue="dead")
    assert other.ask("nack") == "nacked"  # its last delivery now: dead-lettered, not requeued
    d = broker.queue("dead").get(timeout=10)
    assert (d.body, d.headers["x-death-reason"], d.headers["x-death-attempts"]) == (b"m", "max-deliveries", 1)
    d.ack()
    st = q.stats()
    assert (st.ready, st.in_flight, st.dead_lettered_total) == (0, 0, 1)
    other.close()


@pytest.mark.slow
def test_another_process_leases_for_the_new_visibility_timeout(broker, observer):
    q = broker.create_queue("jobs", visibility_timeout=300)
    q.put(b"m")
    other = observer("jobs")
    assert other.ask("get") == "got attempt 1"  # leased for 300 s
    broker.update_queue("jobs", visibility_timeout=0.5)
    assert other.ask("nack") == "nacked"  # a worker's slow path: its handle takes the new settings
    assert other.ask("get") == "got attempt 2"  # leased for 0.5 s, and held
    d = q.get(timeout=20)  # (300 s under the old setting)
    assert (d.body, d.attempt) == (b"m", 3)
    d.ack()
    other.close()


@pytest.mark.parametrize("setting, value, held", [
    ("max_bytes", 1 << 20, "67108864"), ("max_message_bytes", 1000, "1048576"), ("priorities", 3, "1"),
    ("lanes", 2, "1"), ("durability", "wal", "'snapshot'")])
def test_a_fixed_setting_is_refused_and_nothing_changes(any_broker, setting, value, held):
    any_broker.create_queue("jobs")
    with pytest.raises(SettingsMismatch, match=rf"^queue 'jobs' in namespace '\w+' cannot change {setting} "
                                               rf"{held} \(asked {value!r}\): not on a live queue"):
        any_broker.update_queue("jobs", visibility_timeout=5, **{setting: value})
    with pytest.raises(SettingsMismatch, match=f"cannot change {setting}"):
        any_broker.declare_queue("jobs", **{setting: value})
    assert any_broker.queue("jobs").settings()["visibility_timeout"] == 30.0
    # the queue's own value is no change
    assert any_broker.update_queue("jobs", max_bytes=64 << 20, lanes=1, visibility_timeout=5)["visibility_timeout"] == 5


def test_declare_creates_then_changes(any_broker):
    q = any_broker.declare_queue("jobs", visibility_timeout=7, retry_delay=1)
    assert (q.settings()["visibility_timeout"], q.settings()["retry_delay"]) == (7, 1)
    q2 = any_broker.declare_queue("jobs", visibility_timeout=9)  # retry_delay not given: left as it is
    assert (q2.settings()["visibility_timeout"], q2.settings()["retry_delay"]) == (9, 1)
    assert any_broker.list_queues() == ["jobs"]
    with pytest.raises(TypeError, match="exist_ok"):
        any_broker.declare_queue("jobs", exist_ok=True)


def test_bad_updates_say_why(any_broker):
    any_broker.create_queue("jobs")
    with pytest.raises(QueueNotFound, match="no queue 'nope'"):
        any_broker.update_queue("nope", visibility_timeout=5)
    with pytest.raises(QueueNotFound, match="dead-letter queue 'nowhere' does not exist"):
        any_broker.update_queue("jobs", dead_letter_queue="nowhere")
    with pytest.raises(ValueError, match="a queue cannot be its own dead-letter queue"):
        any_broker.update_queue("jobs", dead_letter_queue="jobs")
    with pytest.raises(ValueError, match="retry_backoff must be a number in 1..1000"):
        any_broker.update_queue("jobs", retry_backoff=0.5)
    with pytest.raises(ValueError, match="max_deliveries' must be a positive integer|max_deliveries must be positive"):
        any_broker.update_queue("jobs", max_deliveries=0)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        any_broker.update_queue("jobs", visibility=5)
    assert any_broker.queue("jobs").settings()["visibility_timeout"] == 30.0


def test_a_laned_queue_changes_in_every_lane(broker):
    q = broker.create_queue("jobs", lanes=3)
    broker.update_queue("jobs", visibility_timeout=4, retry_delay=2)
    assert [(lane.visibility_timeout, lane._retry_ns) for lane in q._lanes] == [(4.0, 2_000_000_000)] * 3


def test_asyncio_update_and_declare(broker, tcp_server):
    broker.create_queue("jobs")

    async def main():
        b = await shmq.aio.connect(tcp_server.url)
        try:
            after = await b.update_queue("jobs", retry_delay=3)
            q = await b.declare_queue("other", visibility_timeout=4)
            with pytest.raises(SettingsMismatch, match="cannot change priorities"):
                await b.update_queue("jobs", priorities=2)
            return after, await q.settings()
        finally:
            await b.close()

    after, other = asyncio.run(main())
    assert (after["retry_delay"], other["visibility_timeout"]) == (3.0, 4.0)
    assert broker.queue("jobs").settings()["retry_delay"] == 3.0


def test_cli_queue_set(broker, target):  # noqa: F811
    broker.create_queue("dead")
    broker.create_queue("jobs")
    r = shmq_cli("queue", "set", "jobs", "--visibility-timeout", "5", "--max-deliveries", "4",
                 "--dead-letter-queue", "dead", *target)
    assert (r.returncode, r.stdout, r.stderr) == (0, "set jobs: visibility_timeout 5.0, max_deliveries 4, "
                                                     "dead_letter_queue 'dead'\n", "")
    r = shmq_cli("queue", "set", "jobs", "--max-deliveries", "0", "--dead-letter-queue", "", "--json", *target)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {**broker.queue("jobs").settings(), "max_deliveries": None,
                                    "dead_letter_queue": None, "visibility_timeout": 5.0}
    for args, why in ((["nope", "--retry-delay", "1"], "no queue 'nope'"),
                      (["jobs", "--max-bytes", "1MiB"], "cannot change max_bytes 67108864 (asked 1048576)"),
                      (["jobs", "--visibility-timeout", "-1"], "visibility_timeout must be >"),
                      (["jobs"], "nothing to set")):
        r = shmq_cli("queue", "set", *args, *target)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        assert why in r.stderr
    assert broker.queue("jobs").settings()["visibility_timeout"] == 5.0


@pytest.mark.slow
def test_a_change_outlives_a_restart(broker, tmp_path):
    data_dir = str(tmp_path / "data")
    broker.create_queue("dead")
    broker.create_queue("jobs").put(b"m")
    srv = ServerProcess(broker.namespace, "--data-dir", data_dir, "--snapshot-interval", "0.05")
    try:
        with shmq.connect(srv.url) as remote:
            after = remote.update_queue("jobs", visibility_timeout=4, dead_letter_queue="dead", retry_delay=2)
    finally:
        assert srv.stop() == 0  # a clean stop writes a last snapshot
    srv = rebooted(broker, data_dir)
    try:
        with shmq.connect(srv.url) as remote:
            q = remote.queue("jobs")
            assert q.settings() == after
            assert q.get(timeout=5).body == b"m"
    finally:
        assert srv.stop() == 0
    broker.__init__(broker.namespace)  # the fixture's teardown uses it
