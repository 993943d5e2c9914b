"""The DEADBEEF port's deadlines on the Kafka port (``--frame-timeout``, ``--idle-timeout``):
half a frame is closed after the frame timeout, a connection without a request in
progress after the idle timeout; a long-poll Fetch and a JoinGroup waiting for its
rebalance are in progress, however long they wait."""

import datetime
import socket
import struct
import time

import pytest

from shmq.kafka import ErrorCode as E
from tests.kafka.groups_wire import JOIN, Wire, subscription

pytestmark = pytest.mark.slow

FRAME_S, IDLE_S = 0.5, 1.0
API_VERSIONS, FETCH = 18, 1


def ms(n):
    return datetime.timedelta(milliseconds=n)


def closed_by_server(sock, since: float, within=30) -> float:
    """Seconds from ``since`` (a time.monotonic() before what starts the server's clock)
    until the server closes ``sock``, which it sends nothing meanwhile."""
    sock.settimeout(within)
    assert sock.recv(1) == b""
    return time.monotonic() - since


@pytest.fixture
def srv(kafka_server):
    return kafka_server("--frame-timeout", str(FRAME_S), "--idle-timeout", str(IDLE_S))


def test_half_a_frame_is_closed_after_the_frame_timeout(srv):
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        started = time.monotonic()
        s.sendall(struct.pack(">i", 100) + b"\x00\x12\x00\x03")  # 8 bytes of a 104-byte frame, then nothing
        assert closed_by_server(s, started) >= FRAME_S
    srv.proc.wait_for_line(lambda x: f"Kafka connection closed: a frame took longer than {FRAME_S:g}s" in x)
    with Wire(srv.port) as w:  # the listener serves on
        assert w.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1").error_code == E.none


def test_an_idle_connection_is_closed_after_the_idle_timeout(srv):
    with Wire(srv.port) as w:
        started = time.monotonic()
        assert w.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1").error_code == E.none
        assert closed_by_server(w.sock, started) >= IDLE_S  # counted from its last request
    srv.proc.wait_for_line(lambda x: f"Kafka connection closed: idle for {IDLE_S:g}s; closing" in x)


def test_a_long_poll_fetch_is_not_idle_and_resets_the_idle_clock(srv, broker):
    broker.create_stream("lp", partitions=1).close()
    fetch = dict(max_wait=ms(int(IDLE_S * 1500)), min_bytes=1, topics=[
        {"topic": "lp", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
        forgotten_topics_data=[], rack_id="")
    with Wire(srv.port) as w:
        started = time.monotonic()
        for _ in range(2):  # each waits its whole max_wait (nothing comes), longer than the idle timeout
            r = w.call(FETCH, 12, **fetch)
            assert [(p.partition_index, p.error_code, p.records) for t in r.responses for p in t.partitions] == [
                (0, E.none, b"")]
        assert time.monotonic() - started >= 2 * IDLE_S * 1.5
        assert closed_by_server(w.sock, time.monotonic()) < 30  # then, with nothing in progress, idle


def test_a_joingroup_waiting_for_its_rebalance_is_not_idle(srv, broker):
    """a joins and goes quiet (its connection idles out; its membership lasts its 6 s
    session); b's JoinGroup waits for a's rejoin, far longer than the idle timeout, and
    is answered on its connection when a's session ends."""
    broker.create_stream("ev", partitions=2).close()

    def join(w, member_id=""):
        return w.call(JOIN, 7, group_id="g", session_timeout=ms(6000), rebalance_timeout=ms(30_000),
                      member_id=member_id, group_instance_id=None, protocol_type="consumer",
                      protocols=[{"name": "range", "metadata": subscription("ev")}])

    with Wire(srv.port, "a") as a, Wire(srv.port, "b") as b:
        r = join(a, join(a).member_id)
        assert (r.error_code, r.generation_id) == (E.none, 1)
        started = time.monotonic()
        r = join(b, join(b).member_id)  # waits for a, which never joins again: its session ends
        assert (r.error_code, r.generation_id, r.leader) == (E.none, 2, r.member_id)
        assert time.monotonic() - started > 3 * IDLE_S  # a waited for its session of 6 s, b all along
        a.sock.settimeout(5)
        assert a.sock.recv(1) == b""  # a's quiet connection was closed meanwhile
    srv.proc.wait_for_line(lambda x: f"Kafka connection closed: idle for {IDLE_S:g}s; closing" in x)


def test_a_connection_that_does_not_authenticate_is_closed_after_the_frame_timeout(broker, servers, tmp_path):
    from tests.kafka.conftest import KafkaServer

    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)
    srv = KafkaServer(servers(broker.namespace, "--no-persist", "--kafka-port", "0", "--token-file", str(token_file),
                              "--frame-timeout", str(FRAME_S)))
    try:
        started = time.monotonic()
        with Wire(srv.port) as w:  # ApiVersions is taken before SASL, and holds nothing open
            assert w.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1").error_code == E.none
            assert closed_by_server(w.sock, started) >= FRAME_S
        srv.proc.wait_for_line(lambda x: f"Kafka connection closed: no SASL authentication within {FRAME_S:g}s" in x)
    finally:
        assert srv.stop() == 0
