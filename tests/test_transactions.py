"""Native transactions (``broker.transactional``: client/transactions.py, server/handlers/txns.py,
server/transactions): a transaction over appends to several streams and a group's offsets,
through a real ``shmq server``; readers (local, TCP; a Kafka read_committed consumer:
tests/kafka/test_transactions.py) see its records once it commits and never if it aborts; fencing, timeouts,
offsets fenced by the member's ownership, the server's restart and SIGKILL, and a
consume-transform-produce loop exactly once through SIGKILLs of its processes."""

import asyncio
import json
import os

import pytest

import shmq
import shmq.aio
from shmq.engine.streams.partitioner import partition_of
from shmq.persistence.kafka_txns import journal_path
from tests._wait import wait_for
from tests.kafka.clients import Talker, through_sigkills

pytestmark = pytest.mark.slow


@pytest.fixture
def server(broker, servers):
    """A ``shmq server`` of the test's namespace (no persistence, no token), stopped at the end."""
    srv = servers(broker.namespace, "--no-persist", "--no-auth")
    yield srv
    assert srv.stop() == 0


def _values(s, p=0):
    return [r.value for r in s.read(p, 0, 10_000)]


def test_records_are_seen_once_committed_and_never_once_aborted(broker, server):
    a, c = broker.create_stream("a", partitions=2), broker.create_stream("c", partitions=1)
    with shmq.connect(server.url) as remote:
        p = remote.transactional("t1")
        assert p.epoch == 0 and p.producer_id > 0
        p.begin()
        m = p.append("a", b"x", key=b"k1")  # (keyed: routed as a plain append is)
        assert m.partition == partition_of(b"k1", 2)
        assert [x.offset for x in p.append_many(c, [b"y1", b"y2"])] == [0, 1]
        # open: every reader stops at its first offset
        assert (_values(c), c.stable(0), c.offsets(0)) == ([], 0, (0, 2))
        assert remote.stream("c").read(0, 0) == []
        p.commit()
        assert (_values(c), c.stable(0), c.offsets(0)) == ([b"y1", b"y2"], 3, (0, 3))  # (the marker at 2)
        assert [r.value for r in a.read(m.partition, 0)] == [b"x"]
        with pytest.raises(RuntimeError):
            with p.transaction():
                p.append("c", b"aborted")
                raise RuntimeError("the block fails: the transaction aborts")
        p.begin()
        p.append("c", b"z")
        p.abort()
        with p.transaction():
            p.append("c", b"last")
        assert _values(c) == [b"y1", b"y2", b"last"]
        assert [r.offset for r in c.read(0, 0)] == [0, 1, 7]  # markers and aborted records passed over
        with c.consumer("g") as member:  # a group reads past them: no lag at the end
            assert [r.value for r in member.poll(timeout=5)] == [b"y1", b"y2", b"last"]
            member.commit()
        assert c.lag("g") == {0: 0}
        p.close()


def test_the_calls_out_of_turn_are_refused(broker, server):
    broker.create_stream("c", partitions=1)
    with shmq.connect(server.url) as remote:
        p = remote.transactional("t")
        with pytest.raises(shmq.TransactionError, match="no transaction begun"):
            p.append("c", b"x")
        with pytest.raises(shmq.TransactionError, match="no transaction to commit"):
            p.commit()
        p.abort()  # nothing open: nothing to do
        p.begin()
        with pytest.raises(shmq.TransactionError, match="a transaction is open already"):
            p.begin()
        with pytest.raises(shmq.StreamNotFound):
            p.append("nope", b"x")
        with pytest.raises(ValueError, match="partition must be an int >= 0"):
            p.append("c", b"x", partition=-1)
        p.abort()
        with pytest.raises(ValueError, match="transactional_id must be a non-empty string"):
            remote.transactional("")
        with pytest.raises(ValueError, match=r"timeout must be a number of seconds in \(0, 900\]"):
            remote.transactional("t", timeout=901)
        p.close()
        with pytest.raises(shmq.TransactionError, match="is closed"):
            p.begin()


def test_requests_the_coordinator_cannot_take_get_an_error_and_change_nothing(broker, server):
    from shmq.client.core import Send
    from shmq.protocol import MsgType

    c = broker.create_stream("c", partitions=1)

    def send(msg_type, fields):
        def call():
            return (yield Send(msg_type, fields))
        return remote._drive(call())

    with shmq.connect(server.url) as remote:
        p = remote.transactional("t")
        ids = {"transactional_id": "t", "producer_id": p.producer_id, "epoch": p.epoch}
        with pytest.raises(shmq.ProducerFenced, match="transactional id 't' has no producer"):
            send(MsgType.APPEND, {"stream": "c", "value": b"x", "txn": ["t", p.producer_id + 1, 0]})
        with pytest.raises(shmq.ProducerFenced, match="epoch 7 is not the current 0"):
            send(MsgType.APPEND, {"stream": "c", "value": b"x", "txn": ["t", p.producer_id, 7]})
        with pytest.raises(ValueError, match="TXN_OFFSETS: member, or group, member_id, generation, owned, offsets"):
            send(MsgType.TXN_OFFSETS, {**ids, "stream": "c"})
        with pytest.raises(ValueError, match="TXN_OFFSETS: member, or member_id"):
            send(MsgType.TXN_OFFSETS, {**ids, "stream": "c", "group": "g", "generation": 1, "owned": [0],
                                       "offsets": [[0, 1]]})
        with pytest.raises(shmq.TransactionError, match="is Empty: no transaction to commit"):
            send(MsgType.TXN_END, {**ids, "commit": True})
        with pytest.raises(shmq.StreamNotFound):
            send(MsgType.TXN_OFFSETS, {**ids, "stream": "nope", "member": 1})
        with pytest.raises(ValueError, match="transaction.timeout.ms 900001: 1 to 900000"):
            send(MsgType.TXN_INIT, {"transactional_id": "u", "timeout_ms": 900_001})
    assert c.offsets(0) == (0, 0) and c.stable(0) == 0  # nothing appended, nobody held back


def test_a_second_producer_of_the_id_fences_the_first_and_aborts_its_transaction(broker, server):
    c = broker.create_stream("c", partitions=1)
    with shmq.connect(server.url) as remote:
        zombie = remote.transactional("same")
        zombie.begin()
        zombie.append("c", b"zombie's")
        fresh = remote.transactional("same")  # the open transaction aborted, the epoch moved on
        assert (fresh.producer_id, fresh.epoch) == (zombie.producer_id, zombie.epoch + 1)
        with pytest.raises(shmq.ProducerFenced, match="another producer took the id over"):
            zombie.append("c", b"more")
        with pytest.raises(shmq.ProducerFenced):
            zombie.commit()
        with fresh.transaction():
            fresh.append("c", b"fresh's")
        assert _values(c) == [b"fresh's"]


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(broker, server):
    c = broker.create_stream("c", partitions=1)
    with shmq.connect(server.url) as remote:
        p = remote.transactional("slow", timeout=0.5)
        p.begin()
        p.append("c", b"late")
        wait_for(lambda: c.stable(0) == c.offsets(0)[1], 10, "the coordinator's abort at the timeout")
        assert _values(c) == []
        with pytest.raises(shmq.ProducerFenced):
            p.commit()
        p.init()  # the same handle takes the id again
        with p.transaction():
            p.append("c", b"on time")
        assert _values(c) == [b"on time"]
    assert "aborted: open past its timeout of 500 ms" in server.wait_for_line(lambda x: "past its timeout" in x)


def test_a_local_broker_talks_to_its_server_and_commits_a_local_members_offsets(broker, server):
    src, out = broker.create_stream("in", partitions=2), broker.create_stream("out", partitions=1)
    src.append_many([b"m%d" % i for i in range(6)], partition=0)
    src.append_many([b"n%d" % i for i in range(4)], partition=1)
    p = broker.transactional("local")  # over a connection of its own to the namespace's server
    with src.consumer("g") as c:
        got = []
        while len(got) < 10:
            got += c.poll(timeout=5)
        with p.transaction():
            p.append_many(out, [r.value.upper() for r in got], partition=0)
            p.commit_offsets(c, {0: 3, 1: 4})
            assert src.committed("g") == {}  # held until the end
        assert src.committed("g") == {0: 3, 1: 4}
        assert len(_values(out)) == 10
        with p.transaction():
            p.append(out, b"more")
            p.commit_offsets(c)  # default: where the member is
        assert src.committed("g") == {0: 6, 1: 4}
        # a member that lost a partition since its offsets were given: the transaction aborts
        p.begin()
        p.append(out, b"never seen")
        p.commit_offsets(c, {0: 6, 1: 4})
        other = src.consumer("g")
        wait_for(lambda: (other.poll(timeout=0.1), other.assignment())[1] != [], 10, "the rebalance")
        lost = other.assignment()
        with pytest.raises(shmq.CommitFailed, match=rf"partitions \[{lost[0]}\] went to other members"):
            p.commit()
        other.close()
    assert _values(out)[-1] == b"more" and src.committed("g") == {0: 6, 1: 4}
    with src.consumer("h") as one, src.consumer("h") as two:  # a partition each
        wait_for(lambda: (one.poll(timeout=0.1), two.poll(timeout=0.1), len(one.assignment()))[2] == 1, 10,
                 "two members with a partition each")
        (theirs,) = two.assignment()
        p.begin()
        with pytest.raises(shmq.CommitFailed, match=rf"partitions \[{theirs}\] are not this member's"):
            p.commit_offsets(one, {theirs: 1})  # refused at once
        p.abort()
    assert src.committed("h") == {}
    p.close()


def test_a_remote_members_offsets_go_with_the_transaction(broker, server):
    broker.create_stream("in", partitions=1).append_many([b"a", b"b", b"c"], partition=0)
    broker.create_stream("out", partitions=1)
    with shmq.connect(server.url) as remote, shmq.connect(server.url) as elsewhere:
        p = remote.transactional("remote")
        with remote.stream("in").consumer("g") as c:
            first = next(iter(c))  # the iteration holds b and c, not handed out: not committed past
            with p.transaction():
                p.append("out", first.value)
                p.commit_offsets(c)
            assert broker.stream("in").committed("g") == {0: 1}
            with elsewhere.stream("in").consumer("h") as foreign:
                with pytest.raises(ValueError, match="a consumer of this broker handle's connection"):
                    with p.transaction():
                        p.commit_offsets(foreign)


def test_the_asyncio_clients_take_part_too(broker, server):
    c = broker.create_stream("c", partitions=1)

    async def main():
        async with await shmq.aio.connect(server.url) as remote:
            p = await remote.transactional("aio-remote")
            async with p.transaction():
                await p.append("c", b"remote")
            with pytest.raises(RuntimeError):
                async with p.transaction():
                    await p.append("c", b"aborted")
                    raise RuntimeError
        async with await shmq.aio.connect(namespace=broker.namespace) as local:
            p = await local.transactional("aio-local")
            async with p:
                async with p.transaction():
                    await p.append("c", b"local")
                    s = await local.stream("c")
                    assert [r.value for r in await s.read(0, 0)] == [b"remote"]  # not yet "local"

    asyncio.run(asyncio.wait_for(main(), 60))
    assert _values(c) == [b"remote", b"local"]


def test_without_a_server_a_local_broker_is_told_in_one_line(broker):
    with pytest.raises(shmq.ShmqError, match=rf"transactions need namespace '{broker.namespace}''s server, its "
                                             "coordinator, and none runs"):
        broker.transactional("t")


def test_a_server_without_a_coordinator_refuses_a_transaction(broker, tcp_server):
    with shmq.connect(tcp_server.url) as remote:
        with pytest.raises(shmq.TransactionError, match="this server runs no transaction coordinator"):
            remote.transactional("t")


# ------------------------------------------------------------------------------------ restarts
def _transaction_left_open(url, values, offsets=None, consumer_of=None):
    """A transaction of id "open" with ``values`` appended to stream c (and a local
    member's ``offsets``), left open; its producer."""
    remote = shmq.connect(url)
    p = remote.transactional("open")
    p.begin()
    p.append_many("c", values, partition=0)
    if offsets is not None:
        p.commit_offsets(consumer_of, offsets)
    return remote, p


@pytest.mark.parametrize("how", ["sigkill", "clean"])
def test_a_restart_aborts_an_open_transaction_and_fences_its_producer(broker, servers, tmp_path, how):
    data = str(tmp_path / "data")
    c = broker.create_stream("c", partitions=1, durability="memory")
    srv = servers(broker.namespace, "--data-dir", data, "--no-auth")
    with shmq.connect(srv.url) as remote:
        done = remote.transactional("done")
        with done.transaction():
            done.append("c", b"kept")
    _remote, p = _transaction_left_open(srv.url, [b"never"])
    if how == "sigkill":
        srv.proc.kill()
        srv.proc.wait(10)
    else:
        srv.proc.terminate()
        assert srv.proc.wait(30) == 0
    assert os.stat(journal_path(data)).st_mode & 0o777 == 0o600
    srv = servers(broker.namespace, "--data-dir", data, "--no-auth")
    assert _values(c) == [b"kept"] and c.stable(0) == c.offsets(0)[1]
    with shmq.connect(srv.url) as remote:
        again = remote.transactional("open")
        assert (again.producer_id, again.epoch) == (p.producer_id, p.epoch + 2)  # (the restart's abort moved it once)
        with again.transaction():
            again.append("c", b"after")
    assert _values(c) == [b"kept", b"after"]
    _remote.close()
    assert srv.stop() == 0


@pytest.mark.parametrize("held", [True, False], ids=["offsets-stored", "offsets-not-stored"])
def test_a_commit_cut_short_is_completed_only_where_its_offsets_were_stored(broker, servers, tmp_path, held):
    """The journal says PrepareCommit (the server died inside the end of a transaction with
    a group's offsets): the next start completes it if the group holds those offsets (the
    fenced commit was made), else aborts it, so records and offsets go together."""
    data = str(tmp_path / "data")
    src, c = broker.create_stream("in", partitions=1), broker.create_stream("c", partitions=1)
    src.append_many([b"i%d" % i for i in range(5)], partition=0)
    srv = servers(broker.namespace, "--data-dir", data, "--no-auth")
    with src.consumer("g") as member:
        member.poll(timeout=5)
        _remote, _p = _transaction_left_open(srv.url, [b"o1", b"o2"], {0: 5}, member)
        srv.proc.kill()
        srv.proc.wait(10)
    path = journal_path(data)
    with open(path) as f:
        events = [json.loads(line) for line in f]
    last = max(i for i, e in enumerate(events) if e[0] == "txn" and e[1] == "open")
    events[last][5] = "PrepareCommit"  # as if it died between the end's first step and its markers
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)
    if held:
        src.groups_table.set_offsets("g", {0: 5})  # (the member left: as the fenced commit stored them)
    srv = servers(broker.namespace, "--data-dir", data, "--no-auth")
    assert _values(c) == ([b"o1", b"o2"] if held else [])
    assert src.committed("g") == ({0: 5} if held else {})
    assert c.stable(0) == c.offsets(0)[1]
    _remote.close()
    assert srv.stop() == 0


# ------------------------------------------------------------------------------------ exactly once
class Worker(Talker):
    """``tests._txn_workers`` in a process of its own, and what it said."""

    def __init__(self, namespace, n):
        super().__init__("tests._txn_workers", namespace, "in", "out", "g", "ctp", n)

    def committed(self) -> int:
        return max([x["committed"] for x in list(self.said) if "committed" in x], default=-1)


def test_consume_transform_produce_exactly_once_through_sigkills(broker, servers):
    """Workers (local processes: a local member, a transactional producer through the
    server) each SIGKILLed at a point it does not choose, then one to the end: every input's
    output is there exactly once, in order, for every reader."""
    n = 300
    src, out = broker.create_stream("in", partitions=1), broker.create_stream("out", partitions=1)
    src.append_many([b"%d" % i for i in range(n)], partition=0)
    srv = servers(broker.namespace, "--no-persist", "--no-auth")
    through_sigkills(lambda: Worker(broker.namespace, n), (40, 110, 190))
    got = _values(out)
    assert got == [b"out-%d" % i for i in range(n)]  # each exactly once, in order
    assert src.committed("g") == {0: n}
    assert out.offsets(0)[1] > n  # (markers, and the killed workers' aborted records, are there too)
    assert srv.stop() == 0
