"""``shmq stream ...``, ``shmq group ...`` and the streams in ``shmq stats``, end to end
through real subprocesses, locally and over TCP."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading

import click
import pytest
from click.testing import CliRunner

import shmq
from shmq.cli import app as cli_app, streams as cli_streams
from shmq.client.remote import RemoteBroker
from shmq.engine.streams.partitioner import partition_of
from tests._wait import wait_for
from tests.test_cli import shmq_cli
from tests.test_server_tcp import ServerProcess


@pytest.fixture(params=["local", "tcp"])
def target(request, broker):
    """CLI arguments that select the transport."""
    if request.param == "local":
        yield ["--namespace", broker.namespace]
        return
    if not hasattr(RemoteBroker, "create_stream"):
        pytest.skip("streams over TCP: shmq.client.remote.RemoteBroker has no create_stream yet")
    srv = ServerProcess(broker.namespace)
    yield ["--url", srv.url]
    assert srv.stop() == 0


def ok(*args, stdin=None):
    r = shmq_cli(*args, stdin=stdin)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    return r.stdout


def test_create_takes_every_option_and_list_stats_delete(target, broker):
    out = ok("stream", "create", "events", "--partitions", "3", "--max-bytes", "65536", "--max-message-bytes",
             "1000", "--retention", "block", "--retention-bytes", "1048576", "--retention-seconds", "3600",
             "--group-idle-timeout", "5", "--durability", "memory", *target)
    assert out == "created stream events (3 partitions)\n"
    with broker.stream("events") as s:
        assert (s.partitions, s.max_bytes, s.max_message_bytes, s.retention, s.retention_bytes, s.retention_seconds,
                s.group_idle_timeout, s.durability) == (3, 65536, 1000, "block", 1048576, 3600.0, 5.0, "memory")
    assert ok("stream", "create", "events", "--exist-ok", *target) == (
        "stream events (3 partitions) exists (settings match)\n")
    r = shmq_cli("stream", "create", "events", *target)
    assert r.returncode == 1 and r.stderr.startswith("shmq: error: stream 'events' already exists")
    assert ok("stream", "list", *target) == "events\n"
    assert json.loads(ok("stream", "list", "--json", *target)) == ["events"]
    stats = json.loads(ok("stream", "stats", "events", "--json", *target))
    assert [(p["partition"], p["earliest"], p["end"], p["bytes"], p["max_bytes"])
            for p in stats["events"]["partitions"]] == [(0, 0, 0, 0, 65536), (1, 0, 0, 0, 65536), (2, 0, 0, 0, 65536)]
    assert stats["events"]["groups"] == {} and stats["events"]["retention"] == "block"
    assert ok("stream", "delete", "events", *target) == "deleted stream events\n"
    assert ok("stream", "list", *target) == ""


def test_a_compacted_stream_is_created_shows_its_dirty_ratio_and_is_compacted(target, broker):
    out = ok("stream", "create", "kv", "--partitions", "1", "--compact", "--delete-retention-seconds", "60",
             *target)
    assert out == "created stream kv (1 partitions)\n"
    with broker.stream("kv") as s:
        assert (s.compact, s.delete_retention_seconds) == (True, 60.0)
        for i in range(4):
            s.append(b"v%d" % i, key=b"k", partition=0)
        def stats():
            return json.loads(ok("stream", "stats", "kv", "--json", *target))["kv"]

        if target[0] == "--namespace":  # no server: nothing compacts it but this test
            assert stats()["compact"] is True and stats()["partitions"][0]["dirty_ratio"] == 1.0
            table = ok("stream", "stats", "kv", *target).splitlines()
            assert table[0].split()[-1] == "dirty" and table[1].split()[-1] == "100%"
            s.compact_now()
        else:  # the server's housekeeping compacts it (all of it is dirty: past the default ratio, 0.5)
            wait_for(lambda: stats()["partitions"][0]["compactions_total"] == 1, what="the server's compaction")
        assert stats()["compact"] is True
        assert ok("stream", "stats", "kv", *target).splitlines()[1].split()[-1] == "0%"
        assert [r.offset for r in s.read(0, 0)] == [3]
        assert ok("stream", "read", "kv", *target) == "v3\n"
    if target[0] == "--namespace":  # (``stream set`` is local: update_stream)
        assert ok("stream", "set", "kv", "--no-compact", "--min-cleanable-dirty-ratio", "0.2", *target) == \
            "set kv: compact False, min_cleanable_dirty_ratio 0.2\n"
        assert "dirty" not in ok("stream", "stats", "kv", *target)


def test_append_then_read_by_offset(target, broker):
    ok("stream", "create", "events", "--partitions", "2", "--max-bytes", "65536", *target)
    out = ok("stream", "append", "events", *target, stdin="a\nb\nc\n")  # key-less lines: one batch, one partition
    m = re.fullmatch(r"appended 3 record\(s\) to events: partition ([01]) offsets 0\.\.2\n", out)
    assert m, out
    lines_p = int(m.group(1))
    kp = partition_of(b"user-1", 2)
    got = json.loads(ok("stream", "append", "events", "-k", "user-1", "-m", "x", "-m", "y", "--header", "h=v",
                        "--json", *target))
    first = 3 if kp == lines_p else 0
    assert [(r["partition"], r["offset"]) for r in got["records"]] == [(kp, first), (kp, first + 1)]
    assert got["stream"] == "events"
    assert ok("stream", "append", "events", "-p", "1", "-m", "z", *target).startswith(
        "appended 1 record(s) to events: partition 1 offsets ")
    with broker.stream("events") as s:
        everything = [r.value.decode() for p in (0, 1) for r in s.read(p, 0)]
    assert ok("stream", "read", "events", *target).splitlines() == everything  # partition 0, then 1
    assert ok("stream", "read", "events", "-n", "2", *target).splitlines() == everything[:2]
    (y,) = [json.loads(line) for line in ok("stream", "read", "events", "-p", str(kp), "--from", str(first + 1),
                                            "-n", "1", "--json", *target).splitlines()]
    assert {k: v for k, v in y.items() if k != "timestamp"} == {
        "stream": "events", "partition": kp, "offset": first + 1, "key": "user-1", "key_base64": "dXNlci0x",
        "headers": {"h": "v"}, "value": "y", "value_base64": "eQ=="}
    assert ok("stream", "read", "events", "--from", "latest", *target) == ""
    assert ok("stream", "read", "events", "--follow", "-n", "1", *target) == everything[0] + "\n"  # -n ends it
    ok("stream", "create", "small", "--partitions", "1", "--max-bytes", "4096", *target)
    lines = "".join("line %03d %s\n" % (i, "x" * 90) for i in range(100))  # ~14 KiB: batches fit the ring
    assert ok("stream", "append", "small", *target, stdin=lines) == \
        "appended 100 record(s) to small: partition 0 offsets 0..99\n"


def test_trim_drops_records_below_an_offset(target, broker):
    ok("stream", "create", "events", "--partitions", "2", *target)
    with broker.stream("events") as s:
        s.append_many([b"a%d" % i for i in range(5)], partition=0)
        s.append_many([b"b%d" % i for i in range(3)], partition=1)
        assert ok("stream", "trim", "events", "-p", "0", "--before", "2", *target) == \
            "trimmed stream events: 2 record(s) dropped; earliest offsets 0: 2\n"
        assert [r.value for r in s.read(0, 2)] == [b"a2", b"a3", b"a4"] and s.offsets(1) == (0, 3)
        assert ok("stream", "trim", "events", "--before", "99", *target) == \
            "trimmed stream events: 6 record(s) dropped; earliest offsets 0: 5, 1: 3\n"
    r = shmq_cli("stream", "trim", "events", "-p", "7", "--before", "1", *target)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "partitions 0..1, not 7" in r.stderr, r.stderr
    r = shmq_cli("stream", "trim", "nope", "--before", "1", *target)
    assert r.returncode == 1 and "no stream 'nope'" in r.stderr


def test_read_shows_a_tombstone_and_header_pairs(broker):
    """A tombstone's value is JSON null (an empty line without --json); header pairs are a
    list of [key, value], a null value null."""
    with broker.create_stream("events", partitions=1) as s:
        s.append(None, key=b"k", headers=[("a", b"1"), ("a", "2"), ("n", None)])
        s.append(b"")
    target = ["--namespace", broker.namespace]
    first, second = [json.loads(line) for line in ok("stream", "read", "events", "--json", *target).splitlines()]
    assert (first["value"], first["value_base64"], first["headers"]) == (None, None, [["a", "MQ=="], ["a", "2"],
                                                                                         ["n", None]])
    assert (second["value"], second["value_base64"], second["headers"]) == ("", "", {})
    assert ok("stream", "read", "events", *target) == "\n\n"


def lines_of(pipe):
    """The pipe's lines, as a queue filled by a thread (so a test waits for one with a bound)."""
    lines = queue.Queue()

    def pump():
        for line in pipe:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_follow_prints_new_records_of_every_partition_and_sigint_exits_0(target, broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append(b"old", partition=0)
    proc = subprocess.Popen([sys.executable, "-m", "shmq.cli", "stream", "read", "events", "--follow", "--json",
                             *target], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        lines = lines_of(proc.stdout)
        assert json.loads(lines.get(timeout=30))["value"] == "old"
        s.append(b"new in 1", partition=1)
        assert json.loads(lines.get(timeout=30))["value"] == "new in 1"
        s.append(b"new in 0", partition=0)
        assert json.loads(lines.get(timeout=30))["value"] == "new in 0"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
    s.close()


def test_group_list_lag_and_reset(target, broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"a"] * 5, partition=0)
    s.append_many([b"b"] * 3, partition=1)
    r = shmq_cli("group", "list", "events", *target)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "shmq: stream events has no consumer groups\n")
    assert json.loads(ok("group", "list", "events", "--json", *target)) == []
    with s.consumer("billing") as c:
        c.commit({0: 2})
    assert ok("group", "list", "events", *target) == "billing\n"
    assert json.loads(ok("group", "list", "events", "--json", *target)) == ["billing"]
    assert json.loads(ok("group", "lag", "events", "billing", "--json", *target)) == {
        "billing": {"committed": {"0": 2}, "lag": {"0": 3, "1": 3}}}
    assert [line.split() for line in ok("group", "lag", "events", *target).splitlines()] == [
        ["group", "partition", "committed", "lag"], ["billing", "0", "2", "3"], ["billing", "1", "-", "3"]]
    assert ok("group", "reset", "events", "billing", "--to", "latest", *target) == \
        "group billing of events committed: 0:5 1:3\n"
    assert ok("group", "reset", "events", "billing", "--to", '{"1": 1}', *target) == \
        "group billing of events committed: 0:5 1:1\n"
    assert ok("group", "reset", "events", "billing", "--to", "earliest", *target) == \
        "group billing of events committed: 0:0 1:0\n"
    assert s.committed("billing") == {0: 0, 1: 0}
    with s.consumer("billing"):  # a live member: its offsets are its own
        r = shmq_cli("group", "reset", "events", "billing", "--to", "latest", *target)
    assert (r.returncode, r.stderr) == (
        1, "shmq: error: group 'billing' of stream 'events' has live members: close them first\n")
    r = shmq_cli("group", "reset", "events", "billing", "--to", "the start", *target)
    assert r.returncode == 2 and "is not earliest, latest or a JSON object" in r.stderr
    s.close()


def test_shmq_stats_shows_queues_and_streams(target, broker):
    ok("create", "q", *target)
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"x" * 10] * 4, partition=1)
    with s.consumer("billing") as c:
        c.commit({1: 1})
    stats = json.loads(ok("stats", "--json", *target))
    assert list(stats["queues"]) == ["q"] and stats["queues"]["q"]["ready"] == 0
    parts = stats["streams"]["events"]["partitions"]
    assert [(p["earliest"], p["end"]) for p in parts] == [(0, 0), (0, 4)] and parts[1]["bytes"] > 40
    assert stats["streams"]["events"]["groups"]["billing"]["lag"] == {"0": 0, "1": 3}
    table = [line.split() for line in ok("stats", *target).splitlines() if not line.startswith("dead-letter links")]
    assert table[0][0] == "queue" and table[1][0] == "q"
    streams = table.index(["stream", "partitions", "records", "bytes", "memory", "max", "appended", "dropped"])
    assert table[streams + 1] == ["events", "2", "4"] + table[streams + 1][3:5] + ["128", "KiB", "128", "KiB", "4", "0"]
    assert table[streams + 2:] == [[], ["stream", "group", "members", "lag"], ["events", "billing", "0", "3"]]
    table = [line.split() for line in ok("stream", "stats", *target).splitlines()]  # a row per partition
    assert table[0] == ["stream", "partition", "earliest", "end", "bytes", "memory", "max", "appended", "dropped"]
    assert table[1] == ["events", "0", "0", "0", "0", "B", "64", "KiB", "64", "KiB", "0", "0"]  # (its header)
    assert table[2][:4] == ["events", "1", "0", "4"] and table[2][6:] == ["64", "KiB", "64", "KiB", "4", "0"]
    assert table[4:] == [["stream", "group", "members", "lag"], ["events", "billing", "0", "3"]]
    only = json.loads(ok("stats", "events", "--json", *target))
    assert (only["queues"], list(only["streams"])) == ({}, ["events"])
    r = shmq_cli("stats", "missing", *target)
    assert (r.returncode, r.stderr) == (1, "shmq: error: no queue or stream 'missing'\n")
    s.close()


@pytest.mark.parametrize("args,message", [
    (["stream", "read", "missing"], "shmq: error: no stream 'missing'"),
    (["stream", "append", "missing", "-m", "x"], "shmq: error: no stream 'missing'"),
    (["stream", "delete", "missing"], "shmq: error: no stream 'missing'"),
    (["stream", "stats", "missing"], "shmq: error: no stream 'missing'"),
    (["group", "list", "missing"], "shmq: error: no stream 'missing'"),
    (["group", "lag", "events", "nope"], "shmq: error: stream 'events' has no group 'nope'"),
    (["stream", "read", "events", "-p", "0", "--from", "7"],
     "shmq: error: stream 'events' partition 0: offset 7 is outside [0, 1]"),
    (["stream", "read", "events", "-p", "9"], "shmq: error: stream 'events' has partitions 0..1, not 9"),
    (["stream", "append", "events", "-m", "x" * 2000], "shmq: error: record of 2000 bytes"),
])
def test_errors_are_one_line_without_traceback(target, broker, args, message):
    broker.create_stream("events", partitions=2, max_bytes=1 << 16, max_message_bytes=1000).append(b"x", partition=0)
    r = shmq_cli(*args, *target)
    assert r.returncode == 1
    assert r.stderr.startswith(message)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--partitions", "0"], "Invalid value for '--partitions': 0 is not in the range 1<=x<=256"),
    (["--partitions", "300"], "Invalid value for '--partitions': 300 is not in the range 1<=x<=256"),
    (["--max-bytes", "100"], "Invalid value for '--max-bytes': '100' is less than the least allowed, 4096 bytes"),
    (["--max-message-bytes", "0"],
     "Invalid value for '--max-message-bytes': '0' is less than the least allowed, 1 bytes"),
    (["--retention-bytes", "0"], "Invalid value for '--retention-bytes': '0' is less than the least allowed, 1 bytes"),
    (["--retention-seconds", "0"], "Invalid value for '--retention-seconds': 0.0 is not in the range x>0"),
    (["--group-idle-timeout", "-1"], "Invalid value for '--group-idle-timeout': -1.0 is not in the range x>0"),
    (["--delete-retention-seconds", "-1"],
     "Invalid value for '--delete-retention-seconds': -1.0 is not in the range x>=0"),
])
def test_stream_create_values_out_of_range_are_usage_errors(broker, args, message):
    r = shmq_cli("stream", "create", "events", *args, "--namespace", broker.namespace)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"shmq: error: {message}; try 'python -m shmq.cli stream create --help'\n"
    assert broker.list_streams() == []


@pytest.mark.parametrize("error", [
    shmq.StreamNotFound("no stream 'x' in namespace 'n'"),
    shmq.OffsetOutOfRange("stream 'x' partition 0: offset 9 is outside [0, 3]", 0, 3),
    shmq.CommitFailed("group 'g' of stream 'x' rebalanced (generation 1 -> 2)"),
])
def test_the_stream_errors_are_one_line_too(error):
    @click.group(cls=cli_app._Cli)
    def main():
        pass

    @main.command()
    def fail():
        raise error

    r = CliRunner().invoke(main, ["fail"])
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", f"shmq: error: {error}\n")


def test_a_follower_overtaken_by_retention_skips_ahead_with_a_warning(broker, capsys):
    s = broker.create_stream("events", partitions=1, max_bytes=4096)
    s.append_many([b"a", b"b"])
    tail = cli_streams._tail(s, {0: 0}, None, lambda: False, strict=False)  # what --follow reads
    assert [next(tail).value, next(tail).value] == [b"a", b"b"]
    for i in range(100):  # the ring holds ~16 of these: offsets 2.. are dropped before the reader is back
        s.append(b"%03d" % i + b"x" * 200)
    earliest = s.offsets(0)[0]
    assert next(tail).offset == earliest
    assert capsys.readouterr().err == (f"shmq: warning: partition 0: offsets 2..{earliest - 1} were dropped by "
                                       "retention before they were read\n")
    tail.close()
    s.close()


def test_stats_show_what_a_spark_sink_staged_for_a_stream(broker):
    ns = ["--namespace", broker.namespace]
    broker.create_stream("out", partitions=2)
    staging = broker.create_stream("out:staging:q-1", partitions=2, durability="memory")
    staging.append_many([b"a", b"b", b"c"], partition=1)
    staging.delete_records({1: 1})  # one reclaimed, two staged
    out = ok("stats", *ns)
    assert re.search(r"^out\s+q-1\s+2$", out, re.M), out
    assert "out:staging:q-1" not in out  # the staging stream is shown as what it stages for
    assert json.loads(ok("stats", "--json", *ns))["streams"]["out"]["staged"] == {"q-1": 2}
    assert json.loads(ok("stream", "stats", "out", "--json", *ns))["out"]["staged"] == {"q-1": 2}
    staging.delete_records({1: 3})
    assert json.loads(ok("stats", "--json", *ns))["streams"]["out"]["staged"] == {"q-1": 0}
